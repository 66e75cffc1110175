// SPDX-License-Identifier: Apache-2.0

package verify

import (
	"slices"
	"testing"
)

// What the kernel answered, judged: the table and the errnos are the
// test's own, nothing comes from an agent.
func TestJudgeGiven(t *testing.T) {
	whole := []tableGPU{{0, []string{"/dev/nvidia0"}}, {1, []string{"/dev/nvidia1"}}, {2, []string{"/dev/nvidia2"}}}
	// Two MIG slices of GPU 0 share its /dev/nvidia0; each has its caps.
	mig := []tableGPU{{0, []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"}},
		{1, []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"}},
		{2, []string{"/dev/nvidia1"}}}
	for _, tc := range []struct {
		name   string
		gpus   []tableGPU
		given  int
		errnos map[string]string
		failed []string
	}{
		{"healthy, fake devices", whole, 0, map[string]string{"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "EPERM", "/dev/nvidia2": "EPERM"}, nil},
		{"healthy, real GPU", whole, 1, map[string]string{"/dev/nvidia0": "EPERM", "/dev/nvidia1": "OK", "/dev/nvidia2": "EPERM"}, nil},
		{"filter off", whole, 0, map[string]string{"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "ENXIO", "/dev/nvidia2": "OK"},
			[]string{"GPU 1 opened though not given", "GPU 2 opened though not given"}},
		{"own GPU denied", whole, 0, map[string]string{"/dev/nvidia0": "EPERM", "/dev/nvidia1": "EPERM", "/dev/nvidia2": "EPERM"},
			[]string{"GPU 0 not opened in its own cgroup"}},
		{"device file missing", whole, 0, map[string]string{"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "ENOENT", "/dev/nvidia2": "EPERM"},
			[]string{"GPU 1 could not be tested"}},
		{"own device file missing", whole, 0, map[string]string{"/dev/nvidia0": "ENOENT", "/dev/nvidia1": "EPERM", "/dev/nvidia2": "EPERM"},
			[]string{"GPU 0 not opened in its own cgroup"}},
		{"not opened at all", whole, 0, map[string]string{}, []string{"GPU 0 not opened in its own cgroup", "GPU 1 could not be tested", "GPU 2 could not be tested"}},
		{"MIG slice, healthy: the shared parent is not the sibling's", mig, 0, map[string]string{"/dev/nvidia0": "ENXIO",
			"/dev/nvidia-caps/nvidia-cap21": "ENXIO", "/dev/nvidia-caps/nvidia-cap22": "ENXIO",
			"/dev/nvidia-caps/nvidia-cap30": "EPERM", "/dev/nvidia-caps/nvidia-cap31": "EPERM", "/dev/nvidia1": "EPERM"}, nil},
		{"MIG sibling's caps open", mig, 0, map[string]string{"/dev/nvidia0": "ENXIO",
			"/dev/nvidia-caps/nvidia-cap21": "ENXIO", "/dev/nvidia-caps/nvidia-cap22": "ENXIO",
			"/dev/nvidia-caps/nvidia-cap30": "EPERM", "/dev/nvidia-caps/nvidia-cap31": "ENXIO", "/dev/nvidia1": "EPERM"},
			[]string{"GPU 1 opened though not given"}},
		{"MIG slice without its caps", mig, 0, map[string]string{"/dev/nvidia0": "ENXIO",
			"/dev/nvidia-caps/nvidia-cap21": "EPERM", "/dev/nvidia-caps/nvidia-cap22": "ENXIO",
			"/dev/nvidia-caps/nvidia-cap30": "EPERM", "/dev/nvidia-caps/nvidia-cap31": "EPERM", "/dev/nvidia1": "EPERM"},
			[]string{"GPU 0 not opened in its own cgroup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opens []opened
			for f, e := range tc.errnos {
				opens = append(opens, opened{Path: f, Errno: e})
			}
			r := Report{Failed: []string{}}
			judgeGiven(&r, &childInfo{GPU: tc.given, GPUs: tc.gpus}, opens)
			if !slices.Equal(r.Failed, append([]string{}, tc.failed...)) {
				t.Errorf("failed %q, want %q", r.Failed, tc.failed)
			}
			if len(r.Checks) != len(tc.gpus) {
				t.Errorf("%d checks for %d GPUs: %+v", len(r.Checks), len(tc.gpus), r.Checks)
			}
		})
	}
}

func TestJudgeBare(t *testing.T) {
	r := Report{Failed: []string{}}
	judgeBare(&r, nil, []opened{{"/dev/nvidia0", "EPERM"}, {"/dev/nvidia1", "EPERM"}}, 1)
	judgeBare(&r, nil, []opened{{"/dev/nvidia0", "EPERM"}, {"/dev/nvidia1", "ENXIO"}}, 1)
	if !slices.Equal(r.Failed, []string{"unregistered cgroup opened a GPU"}) || !r.Checks[0].OK {
		t.Errorf("failed %q, checks %+v", r.Failed, r.Checks)
	}
}

func TestNotRoot(t *testing.T) {
	if isRoot() {
		t.Skip("runs as root: the refusal for non-root is not reachable")
	}
	r := Run(Options{Socket: "/nonexistent"})
	if r.OK || !slices.Equal(r.Failed, []string{"not run as root"}) {
		t.Errorf("not root: %+v", r)
	}
}
