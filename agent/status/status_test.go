// SPDX-License-Identifier: Apache-2.0

package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// fakeState builds a version 1 state file body.
func fakeState(t *testing.T, scope string, jobs ...string) *statefile.File {
	t.Helper()
	body := fmt.Sprintf(`{"version":1,"scope":%q,"jobs":[%s]}`, scope, strings.Join(jobs, ","))
	var st statefile.File
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

const (
	scopeDir = "/sys/fs/cgroup/system.slice/n1_slurmstepd.scope"
	job7     = `{"id":7,"uid":1001,"gpus":[0,1],"steps":[
		{"id":0,"uid":1001,"cgroup_id":100,"cgroup":"/sys/fs/cgroup/system.slice/n1_slurmstepd.scope/job_7/step_0","gpus":[0,1]},
		{"id":4294967291,"uid":1001,"cgroup_id":101,"cgroup":"/sys/fs/cgroup/system.slice/n1_slurmstepd.scope/job_7/step_batch","gpus":[0]}]}`
	job8 = `{"id":8,"uid":1002,"gpus":[],"no_prolog":true,"steps":[
		{"id":0,"uid":1002,"cgroup_id":200,"cgroup":"/sys/fs/cgroup/system.slice/n1_slurmstepd.scope/job_8/step_0","gpus":[]}]}`
)

// consistentInput is a healthy node: agent up, scope mode, two jobs, the
// exempt system cgroup.
func consistentInput(t *testing.T) Input {
	return Input{
		Version: "1.2.3",
		Agent:   AgentReport{Socket: "/run/gpufence/agent.sock", SocketExists: true, Listening: true, PID: 4242, OwnerUID: new(uint32), ListenerUID: new(uint32)},
		PinDir:  "/sys/fs/bpf/gpufence",
		Kernel: &devfilter.PinnedView{
			Dir:     "/sys/fs/bpf/gpufence",
			Pins:    []string{"link", "map_config", "map_events", "map_lost", "map_policies", "map_rate", "map_rate_full", "state"},
			Version: 1, Mode: devfilter.ModeScope, ScopeID: 50,
			Config: &devfilter.PinnedConfig{NvidiaMajor: 195},
			Link:   &devfilter.PinnedLink{Pin: "link", ID: 17, ProgramID: 88, ProgramName: "devfilter_scope", CgroupID: 50},
			Entries: map[uint64]devfilter.PinnedEntry{
				100: {CgroupID: 100, Policy: devfilter.Policy{GPUMinors: []uint32{0, 1}}},
				101: {CgroupID: 101, Policy: devfilter.Policy{GPUMinors: []uint32{0}}},
				200: {CgroupID: 200, Policy: devfilter.Policy{}},
				60:  {CgroupID: 60, Policy: devfilter.Policy{AllowAll: true}},
			},
			Lost: 3, RateFull: 1, RateEntries: 5,
		},
		CgroupAlive: map[uint64]bool{100: true, 101: true, 200: true, 60: true},
		Scope:       scopeDir,
		Exempt:      map[uint64]string{60: "system"},
		StateFile:   "/var/lib/gpufence/state.json",
		State:       fakeState(t, scopeDir, job7, job8),
		StateExists: true,
		CgroupIDs: map[string]uint64{
			scopeDir + "/job_7/step_0":     100,
			scopeDir + "/job_7/step_batch": 101,
			scopeDir + "/job_8/step_0":     200,
		},
		Devices: map[int]policy.Devices{0: {GPUMinor: 0}, 1: {GPUMinor: 1}},
		UserName: func(uid uint32) string {
			if uid == 1001 {
				return "alice"
			}
			return ""
		},
	}
}

func TestStatusConsistent(t *testing.T) {
	r := Build(consistentInput(t))
	if !r.OK || len(r.Problems) != 0 {
		t.Fatalf("problems on a consistent node: %q", r.Problems)
	}
	if len(r.Jobs) != 2 || r.Jobs[0].ID != 7 || r.Jobs[0].User != "alice" || len(r.Jobs[0].Steps) != 2 {
		t.Fatalf("jobs: %+v", r.Jobs)
	}
	if s := r.Jobs[0].Steps[1]; s.Name != "batch" || !s.CgroupExists || s.Kernel == nil || !s.Kernel.Present || !slices.Equal(s.Kernel.GPUMinors, []uint32{0}) {
		t.Errorf("batch step: %+v", s)
	}
	if len(r.OtherEntries) != 1 || r.OtherEntries[0].Exempt != "system" || r.OtherEntries[0].Problem != "" {
		t.Errorf("other entries: %+v", r.OtherEntries)
	}
	if r.Filter.PolicyEntries != 4 || r.Filter.Lost != 3 || r.Filter.RateFull != 1 || r.Filter.Link.ProgramName != "devfilter_scope" || r.Filter.Enforcement != "enforce" {
		t.Errorf("filter: %+v", r.Filter)
	}
	var out bytes.Buffer
	Write(&out, r)
	t.Logf("\n%s", out.String())
	for _, want := range []string{
		"up (pid 4242)", "scope (scope cgroup 50)", "id 17, prog 88 devfilter_scope, cgroup 50",
		"lost 3, rate_full 1, rate entries 5", "2 job(s), 3 step(s)", "alice(1001)", "no prolog",
		"batch", "minors 0,1", "exempt (system)", "Consistent",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestStatusMismatches(t *testing.T) {
	in := consistentInput(t)
	in.Agent = AgentReport{Socket: "/run/gpufence/agent.sock"}
	k := in.Kernel
	delete(k.Entries, 100)                                                                          // step 7.0 lost its entry
	k.Entries[101] = devfilter.PinnedEntry{CgroupID: 101, Policy: devfilter.Policy{AllowAll: true}} // batch got everything
	k.Entries[300] = devfilter.PinnedEntry{CgroupID: 300}                                           // nobody's
	k.Entries[301] = devfilter.PinnedEntry{CgroupID: 301}                                           // stale
	delete(k.Entries, 60)                                                                           // exempt lost its entry
	in.CgroupAlive = map[uint64]bool{300: true, 301: false}
	in.CgroupIDs[scopeDir+"/job_8/step_0"] = 0 // gone
	r := Build(in)
	if r.OK {
		t.Fatal("OK with mismatches")
	}
	want := []string{
		"agent: no socket at /run/gpufence/agent.sock",
		"job 7 step 0: the state has the step but the kernel has no entry for its cgroup 100",
		"job 7 step batch: the kernel allows every GPU to cgroup 101",
		"job 8 step 0: its cgroup " + scopeDir + "/job_8/step_0 is gone",
		"kernel entry for cgroup 300 with no step in the state",
		"kernel entry for cgroup 301, which no longer exists",
		"the exempt cgroup " + scopeDir + "/system has no kernel entry",
	}
	for _, w := range want {
		if !slices.ContainsFunc(r.Problems, func(p string) bool { return strings.HasPrefix(p, w) }) {
			t.Errorf("no problem %q in %q", w, r.Problems)
		}
	}
	if len(r.Problems) != len(want) {
		t.Errorf("%d problems, want %d: %q", len(r.Problems), len(want), r.Problems)
	}
	var out bytes.Buffer
	Write(&out, r)
	t.Logf("\n%s", out.String())
	for _, w := range []string{"down: no socket", "no entry", "MISMATCH", "Problems (7)"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

func TestStatusMoreMismatches(t *testing.T) {
	in := consistentInput(t)
	in.Kernel.Entries[100] = devfilter.PinnedEntry{CgroupID: 100, Policy: devfilter.Policy{GPUMinors: []uint32{0}}}
	in.CgroupIDs[scopeDir+"/job_7/step_batch"] = 999
	in.Kernel.Link.CgroupID = 0
	in.Kernel.Errors = []string{"map rate: permission denied"}
	r := Build(in)
	for _, w := range []string{
		"job 7 step 0: cgroup 100: the kernel grants minors 0, the state's GPU(s) 0,1 are minors 0,1",
		"job 7 step batch: its cgroup " + scopeDir + "/job_7/step_batch was recreated (id 999, the state has 101)",
		"filter: the scope link 17 is defunct",
		"filter: cannot read map rate: permission denied",
	} {
		if !slices.ContainsFunc(r.Problems, func(p string) bool { return strings.HasPrefix(p, w) }) {
			t.Errorf("no problem %q in %q", w, r.Problems)
		}
	}
	if len(r.Problems) != 4 {
		t.Errorf("problems: %q", r.Problems)
	}
}

func TestStatusWithoutPinsOrState(t *testing.T) {
	in := consistentInput(t)
	in.PinDir, in.Kernel = "", nil
	r := Build(in)
	if !r.OK {
		t.Fatalf("problems without a pin dir: %q", r.Problems)
	}
	if r.Jobs[0].Steps[0].Kernel != nil || len(r.OtherEntries) != 0 {
		t.Errorf("kernel view without pins: %+v %+v", r.Jobs[0].Steps[0], r.OtherEntries)
	}
	var out bytes.Buffer
	Write(&out, r)
	if !strings.Contains(out.String(), "pin_dir is empty") {
		t.Errorf("output:\n%s", out.String())
	}

	in = consistentInput(t)
	in.State, in.StateErr = nil, errors.New("/var/lib/gpufence/state.json: state version 2, this gpufence reads 1")
	r = Build(in)
	if r.OK || r.State.Error == "" || len(r.OtherEntries) != 4 {
		t.Errorf("unreadable state: %+v", r)
	}
}

// TestStatusScope: status names a cgroup that only bears the scope's name
// (a user's planted one) without calling it a problem, and calls one a
// problem when Slurm's scope cannot be told or the filter is on another
// cgroup than Slurm's scope.
func TestStatusScope(t *testing.T) {
	planted := "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/n1_slurmstepd.scope"
	in := consistentInput(t)
	in.SlurmScope, in.SlurmScopeID = scopeDir, 50
	in.IgnoredScopes = []jobcgroup.Candidate{{Path: planted, Refused: "not where slurmd makes its scope; inside user.slice, a user's own cgroup subtree"}}
	r := Build(in)
	if !r.OK || r.Filter.SlurmScope != scopeDir || len(r.Filter.IgnoredScopes) != 1 || r.Filter.IgnoredScopes[0].Path != planted {
		t.Errorf("planted scope: ok=%v problems %q, filter %+v", r.OK, r.Problems, r.Filter)
	}
	var out bytes.Buffer
	Write(&out, r)
	if !strings.Contains(out.String(), "not a scope  "+planted) {
		t.Errorf("text output does not name %s:\n%s", planted, out.String())
	}

	in.SlurmScopeID = 51
	r = Build(in)
	if want := "filter: the filter is on cgroup 50, but Slurm's scope " + scopeDir + " is cgroup 51"; !slices.Equal(r.Problems, []string{want}) {
		t.Errorf("filter off Slurm's scope: problems %q, want %q", r.Problems, want)
	}

	in.SlurmScope, in.SlurmScopeID = "", 0
	in.ScopeErr = "Slurm's scope is ambiguous: Slurm's processes run in both a and b"
	r = Build(in)
	if len(r.Problems) != 1 || !strings.HasPrefix(r.Problems[0], "scope: "+in.ScopeErr) || r.OK {
		t.Errorf("ambiguous scope: ok=%v problems %q", r.OK, r.Problems)
	}
}

// TestStatusSlurmdLink: slurmd outside the scope (systemd's
// slurmd.service) needs the program there too; status shows the link and
// names a missing one, one left on the removed cgroup, and a pid file
// that does not say which slurmd is this node's.
func TestStatusSlurmdLink(t *testing.T) {
	const svc = "/sys/fs/cgroup/system.slice/slurmd.service"
	in := consistentInput(t)
	in.Slurmd, in.SlurmdID = svc, 70
	in.Kernel.Entries[70] = devfilter.PinnedEntry{CgroupID: 70, Policy: devfilter.Policy{AllowAll: true, RootOnly: true}}
	in.CgroupAlive[70] = true
	in.Exempt[70] = "system.slice/slurmd.service"
	in.Kernel.SlurmdLink = &devfilter.PinnedLink{Pin: "link_slurmd", ID: 18, ProgramID: 88, ProgramName: "devfilter_scope", CgroupID: 70}
	r := Build(in)
	if !r.OK || r.Filter.SlurmdCgroup != svc || r.Filter.SlurmdLink == nil || r.Filter.SlurmdLink.CgroupID != 70 {
		t.Errorf("slurmd link in place: ok=%v problems %q, filter %+v", r.OK, r.Problems, r.Filter)
	}
	var out bytes.Buffer
	Write(&out, r)
	for _, want := range []string{"slurmd cgroup  " + svc + " (outside the scope)", "slurmd link    id 18, prog 88 devfilter_scope, cgroup 70"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, out.String())
		}
	}
	for _, tc := range []struct {
		name string
		edit func(*Input)
		want string
	}{
		{"no link", func(in *Input) { in.Kernel.SlurmdLink = nil }, "filter: slurmd runs in " + svc + ", outside the scope, and no link is pinned there"},
		{"made again", func(in *Input) { in.Kernel.SlurmdLink.CgroupID = 0 }, "filter: the link on slurmd's cgroup is on cgroup 0, but " + svc + " is cgroup 70"},
		{"a pid file that is no pid", func(in *Input) { in.SlurmdErr = `slurmd's pid file /run/slurmd.pid: "x" is not a pid` }, "filter: slurmd's pid file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := in
			link := *in.Kernel.SlurmdLink
			kv := *in.Kernel
			kv.SlurmdLink = &link
			c.Kernel = &kv
			tc.edit(&c)
			r := Build(c)
			if r.OK || len(r.Problems) != 1 || !strings.HasPrefix(r.Problems[0], tc.want) {
				t.Errorf("ok=%v problems %q, want one starting %q", r.OK, r.Problems, tc.want)
			}
		})
	}
}

// TestStatusShares: a share job's shares, as the state file holds them,
// are in the JSON and in its line of the Jobs section.
func TestStatusShares(t *testing.T) {
	in := consistentInput(t)
	in.State = fakeState(t, scopeDir, strings.Replace(job7, `"gpus":[0,1],"steps"`, `"gpus":[0,1],"shares":[{"kind":"shard","gpu":0,"count":5},{"kind":"mps","gpu":1}],"steps"`, 1), job8)
	r := Build(in)
	if !r.OK || len(r.Jobs) != 2 || len(r.Jobs[0].Shares) != 2 || r.Jobs[0].Shares[0].Count != 5 || r.Jobs[1].Shares != nil {
		t.Fatalf("jobs: %+v (problems %q)", r.Jobs, r.Problems)
	}
	var out bytes.Buffer
	Write(&out, r)
	for _, want := range []string{"share shard:5 on GPU 0; share mps on GPU 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	b, _ := json.Marshal(r)
	if !strings.Contains(string(b), `"shares":[{"kind":"shard","gpu":0,"count":5},{"kind":"mps","gpu":1}]`) {
		t.Errorf("JSON lacks the shares: %s", b)
	}
}
