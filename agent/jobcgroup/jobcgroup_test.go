// SPDX-License-Identifier: Apache-2.0

package jobcgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	const m = "/sys/fs/cgroup"
	scope := m + "/system.slice/vm_slurmstepd.scope"
	tests := []struct {
		path, scope string
		want        Location
		wantErr     string
	}{
		{path: "/system.slice/vm_slurmstepd.scope/job_5/step_0/user/task_special",
			want: Location{Scope: scope, Job: scope + "/job_5", Step: scope + "/job_5/step_0"}},
		{path: "/system.slice/vm_slurmstepd.scope/job_5/step_batch/slurm",
			want: Location{Scope: scope, Job: scope + "/job_5", Step: scope + "/job_5/step_batch"}},
		{path: "/system.slice/slurmstepd.scope/job_9/step_extern/user/task_0",
			want: Location{Scope: m + "/system.slice/slurmstepd.scope", Job: m + "/system.slice/slurmstepd.scope/job_9", Step: m + "/system.slice/slurmstepd.scope/job_9/step_extern"}},
		{path: "/system.slice/vm_slurmstepd.scope/job_5/step_0/user/task_0", scope: scope,
			want: Location{Scope: scope, Job: scope + "/job_5", Step: scope + "/job_5/step_0"}},
		{path: "/custom/slurm/job_5/step_0/user/task_0", scope: m + "/custom/slurm",
			want: Location{Scope: m + "/custom/slurm", Job: m + "/custom/slurm/job_5", Step: m + "/custom/slurm/job_5/step_0"}},
		{path: "/system.slice/vm_slurmstepd.scope/slurmd", wantErr: "not inside a job step"},
		{path: "/system.slice/vm_slurmstepd.scope/job_5", wantErr: "not inside a job step"},
		{path: "/user.slice/user-1000.slice/session-1.scope", wantErr: "not inside Slurm's slurmstepd scope"},
		{path: "/", wantErr: "not inside Slurm's slurmstepd scope"},
		{path: "/other/job_5/step_0", scope: scope, wantErr: "not inside Slurm's slurmstepd scope"},
		{path: "/system.slice/vm_slurmstepd.scope/job_5/step_0", scope: "/elsewhere", wantErr: "not inside the cgroup v2 mount"},
	}
	for _, tt := range tests {
		got, err := Parse(m, tt.path, tt.scope)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse(%q, %q) err = %v, want %q", tt.path, tt.scope, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Parse(%q, %q) = %+v, %v; want %+v", tt.path, tt.scope, got, err, tt.want)
		}
	}
}

func TestPathOfSelf(t *testing.T) {
	if _, err := Mountpoint(); err != nil {
		t.Skipf("no cgroup v2 here: %v", err)
	}
	p, err := PathOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p, "/") {
		t.Errorf("PathOf(self) = %q, want an absolute cgroup path", p)
	}
	if _, err := PathOf(-5); err == nil {
		t.Error("PathOf(-5) gave no error")
	}
}

func TestFindScope(t *testing.T) {
	mk := func(t *testing.T, dirs ...string) string {
		t.Helper()
		m := t.TempDir()
		for _, d := range dirs {
			if err := os.MkdirAll(filepath.Join(m, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return m
	}
	for _, tc := range []struct {
		name       string
		dirs       []string
		configured string // relative to the mount
		node       string
		want       string // relative to the mount, "" for none
	}{
		{"debian 22.05", []string{"system.slice/vm_slurmstepd.scope/job_1/step_0", "system.slice/cron.service"}, "", "vm", "system.slice/vm_slurmstepd.scope"},
		{"25.11 from source", []string{"system.slice/slurmstepd.scope/slurmd", "system.slice/slurmstepd.scope/system"}, "", "vm", "system.slice/slurmstepd.scope"},
		{"25.11 CgroupSlice", []string{"system.slice/cron.service", "gpufence_test.slice/slurmstepd.scope/slurmd"}, "", "vm", "gpufence_test.slice/slurmstepd.scope"},
		{"nested slice", []string{"batch.slice/batch-gpu.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0"}, "", "n1", "batch.slice/batch-gpu.slice/slurmstepd.scope"},
		{"26.05 SLUID job dirs", []string{"system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_batch", "system.slice/slurmstepd.scope/slurmd"}, "", "n1", "system.slice/slurmstepd.scope"},
		{"own node among several", []string{"system.slice/a_slurmstepd.scope", "system.slice/b_slurmstepd.scope"}, "", "b", "system.slice/b_slurmstepd.scope"},
		{"other nodes only", []string{"system.slice/a_slurmstepd.scope", "system.slice/b_slurmstepd.scope"}, "", "c", ""},
		{"single other name", []string{"system.slice/gpu-1_slurmstepd.scope"}, "", "gpu-1.cluster", "system.slice/gpu-1_slurmstepd.scope"},
		{"two plain scopes: unclear", []string{"system.slice/slurmstepd.scope", "gpufence_test.slice/slurmstepd.scope"}, "", "vm", ""},
		{"none", []string{"system.slice/cron.service", "user.slice"}, "", "vm", ""},
		{"configured", []string{"custom/slurm", "system.slice/slurmstepd.scope"}, "custom/slurm", "vm", "custom/slurm"},
		{"configured missing", []string{"system.slice/slurmstepd.scope"}, "custom/slurm", "vm", ""},
		{"too deep", []string{"a.slice/b.slice/c.slice/d.slice/slurmstepd.scope"}, "", "vm", ""},
		{"job trees are not searched", []string{"system.slice/slurmstepd.scope/job_1/step_0/x_slurmstepd.scope"}, "", "vm", "system.slice/slurmstepd.scope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mk(t, tc.dirs...)
			conf := ""
			if tc.configured != "" {
				conf = filepath.Join(m, tc.configured)
			}
			want := ""
			if tc.want != "" {
				want = filepath.Join(m, tc.want)
			}
			if got := FindScope(m, conf, tc.node); got != want {
				t.Errorf("FindScope = %q, want %q (scopes found: %v)", got, want, FindScopes(m))
			}
		})
	}
}
