// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/jobcgroup"
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
func consistentInput(t *testing.T) statusInput {
	return statusInput{
		Version: "1.2.3",
		Agent:   agentReport{Socket: "/run/gpufence/agent.sock", SocketExists: true, Listening: true, PID: 4242},
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
		UserName: func(uid uint32) string {
			if uid == 1001 {
				return "alice"
			}
			return ""
		},
	}
}

func TestStatusConsistent(t *testing.T) {
	r := buildStatus(consistentInput(t))
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
	writeStatus(&out, r)
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
	in.Agent = agentReport{Socket: "/run/gpufence/agent.sock"}
	k := in.Kernel
	delete(k.Entries, 100)                                                                          // step 7.0 lost its entry
	k.Entries[101] = devfilter.PinnedEntry{CgroupID: 101, Policy: devfilter.Policy{AllowAll: true}} // batch got everything
	k.Entries[300] = devfilter.PinnedEntry{CgroupID: 300}                                           // nobody's
	k.Entries[301] = devfilter.PinnedEntry{CgroupID: 301}                                           // stale
	delete(k.Entries, 60)                                                                           // exempt lost its entry
	in.CgroupAlive = map[uint64]bool{300: true, 301: false}
	in.CgroupIDs[scopeDir+"/job_8/step_0"] = 0 // gone
	r := buildStatus(in)
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
	writeStatus(&out, r)
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
	r := buildStatus(in)
	for _, w := range []string{
		"job 7 step 0: the kernel allows 1 GPU(s) to cgroup 100, the state 2",
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
	r := buildStatus(in)
	if !r.OK {
		t.Fatalf("problems without a pin dir: %q", r.Problems)
	}
	if r.Jobs[0].Steps[0].Kernel != nil || len(r.OtherEntries) != 0 {
		t.Errorf("kernel view without pins: %+v %+v", r.Jobs[0].Steps[0], r.OtherEntries)
	}
	var out bytes.Buffer
	writeStatus(&out, r)
	if !strings.Contains(out.String(), "pin_dir is empty") {
		t.Errorf("output:\n%s", out.String())
	}

	in = consistentInput(t)
	in.State, in.StateErr = nil, errors.New("/var/lib/gpufence/state.json: state version 2, this gpufence reads 1")
	r = buildStatus(in)
	if r.OK || r.State.Error == "" || len(r.OtherEntries) != 4 {
		t.Errorf("unreadable state: %+v", r)
	}
}

// writeConfig writes an agent configuration for status.
func writeConfig(t *testing.T, socket, pinDir, stateFile, scope string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.yaml")
	body := fmt.Sprintf("socket: %q\npin_dir: %q\nstate_file: %q\nnode_name: n1\n", socket, pinDir, stateFile)
	if scope != "" {
		body += fmt.Sprintf("scope: %q\n", scope)
	}
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeAgent listens on a socket and drops each connection.
func fakeAgent(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return p
}

func runStatusJSON(t *testing.T, args ...string) (statusReport, int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := runStatus(append(args, "--json"), &out, &errb)
	var r statusReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("status --json (exit %d) printed no JSON: %v\n%s\n%s", code, err, out.String(), errb.String())
	}
	return r, code, out.String()
}

func TestRunStatusUsage(t *testing.T) {
	var out, errb bytes.Buffer
	for _, args := range [][]string{{"--bogus"}, {"extra"}, {"--config", filepath.Join(t.TempDir(), "missing.yaml")}} {
		if code := runStatus(args, &out, &errb); code != 2 {
			t.Errorf("status %q: exit %d, want 2", args, code)
		}
	}
	if code := runStatus([]string{"--help"}, &out, &errb); code != 0 {
		t.Errorf("--help: exit %d", code)
	}
}

func TestRunStatusFiles(t *testing.T) {
	sock := fakeAgent(t)
	state := filepath.Join(t.TempDir(), "state.json")
	cfg := writeConfig(t, sock, "", state, "")
	r, code, _ := runStatusJSON(t, "--config", cfg)
	if code != 0 || !r.OK || !r.Agent.Listening || r.Agent.PID != os.Getpid() || r.State.Exists {
		t.Fatalf("exit %d: %+v", code, r)
	}
	// A step whose cgroup is gone.
	body := `{"version":1,"jobs":[{"id":9,"uid":0,"gpus":[1],"steps":[{"id":0,"uid":0,"cgroup_id":12345,"cgroup":"/nonexistent/job_9/step_0","gpus":[1]}]}]}`
	if err := os.WriteFile(state, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r, code, _ = runStatusJSON(t, "--config", cfg)
	if code != 1 || r.OK || len(r.Jobs) != 1 || r.Jobs[0].User != "root" || r.Jobs[0].Steps[0].CgroupExists {
		t.Fatalf("exit %d: %+v", code, r)
	}
	// Agent down.
	cfg = writeConfig(t, filepath.Join(t.TempDir(), "none.sock"), "", "", "")
	r, code, _ = runStatusJSON(t, "--config", cfg)
	if code != 1 || r.Agent.SocketExists {
		t.Fatalf("exit %d: %+v", code, r)
	}
}

// cgroup2Root is where the root cgroup2 is mounted, or "".
func cgroup2Root(t *testing.T) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if i > 4 && i+1 < len(fields) && fields[i+1] == "cgroup2" && fields[3] == "/" {
			return fields[4]
		}
	}
	return ""
}

func cgroupID(t *testing.T, dir string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestPrivilegedStatus pins a real filter in a bpffs of its own on a cgroup
// tree of its own, writes the state the agent would, and checks status
// against it; then removes an entry behind the state's back.
func TestPrivilegedStatus(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (loads BPF programs, mounts bpffs, creates cgroups)")
	}
	mnt := cgroup2Root(t)
	if mnt == "" {
		t.Skip("skipping: no cgroup2 mount of the root cgroup")
	}
	best, err := devfilter.Probe()
	if err != nil {
		t.Skipf("skipping: kernel lacks a device filter feature: %v", err)
	}
	modes := []devfilter.Mode{devfilter.ModePerCgroup}
	if best == devfilter.ModeScope {
		modes = append(modes, devfilter.ModeScope)
	}
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) { privilegedStatus(t, mnt, mode) })
	}
}

func privilegedStatus(t *testing.T, mnt string, mode devfilter.Mode) {
	var rnd [6]byte
	rand.Read(rnd[:])
	root := filepath.Join(mnt, "gpufence-status-test-"+hex.EncodeToString(rnd[:]))
	scope := filepath.Join(root, "slice", "test_slurmstepd.scope")
	for _, d := range []string{"job_1/step_0", "job_1/step_1", "system"} {
		if err := os.MkdirAll(filepath.Join(scope, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// Deepest first.
		for _, d := range []string{"job_1/step_0", "job_1/step_1", "job_1", "system", ""} {
			for range 50 {
				if err := unix.Rmdir(filepath.Join(scope, d)); err == nil || !errors.Is(err, unix.EBUSY) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		unix.Rmdir(filepath.Join(root, "slice"))
		if err := unix.Rmdir(root); err != nil {
			t.Errorf("remove test cgroups: %v", err)
		}
	})

	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		t.Skipf("skipping: mount bpffs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(bpffs, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount test bpffs: %v", err)
		}
	})
	pinDir := filepath.Join(bpffs, "gpufence")
	opts := devfilter.Options{Mode: mode, PinDir: pinDir}
	if mode == devfilter.ModeScope {
		opts.ScopeDir = scope
	}
	step0 := devfilter.Cgroup{ID: cgroupID(t, filepath.Join(scope, "job_1/step_0")), Path: filepath.Join(scope, "job_1/step_0")}
	step1 := devfilter.Cgroup{ID: cgroupID(t, filepath.Join(scope, "job_1/step_1")), Path: filepath.Join(scope, "job_1/step_1")}
	system := devfilter.Cgroup{ID: cgroupID(t, filepath.Join(scope, "system")), Path: filepath.Join(scope, "system")}

	// The agent's filter, closed as at agent stop: the pins stay.
	f, err := devfilter.New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		// Before the unmount: detach and unpin everything.
		f, err := devfilter.New(opts)
		if err != nil {
			t.Errorf("New for cleanup: %v", err)
			return
		}
		if err := f.Unpin(); err != nil {
			t.Errorf("Unpin: %v", err)
		}
	})
	if err := f.Set(step0, devfilter.Policy{GPUMinors: []uint32{0, 1}}); err != nil {
		t.Fatal(err)
	}
	wantEntries := 1
	if mode == devfilter.ModeScope {
		// The agent keeps Slurm's system cgroup open.
		if err := f.Set(system, devfilter.Policy{AllowAll: true}); err != nil {
			t.Fatal(err)
		}
		wantEntries = 2
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state.json")
	body := fmt.Sprintf(`{"version":1,"scope":%q,"jobs":[{"id":1,"uid":0,"gpus":[0,1],"steps":[{"id":0,"uid":0,"cgroup_id":%d,"cgroup":%q,"gpus":[0,1]}]}]}`,
		scope, step0.ID, step0.Path)
	if err := os.WriteFile(state, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, fakeAgent(t), pinDir, state, scope)

	r, code, raw := runStatusJSON(t, "--config", cfg)
	t.Logf("consistent:\n%s", raw)
	if code != 0 || !r.OK {
		t.Fatalf("exit %d, problems %q", code, r.Problems)
	}
	if !r.Filter.Pinned || r.Filter.Mode != string(mode) || r.Filter.PolicyEntries != wantEntries || r.Filter.Enforcement != "enforce" || r.Filter.NvidiaMajor != 195 {
		t.Errorf("filter: %+v", r.Filter)
	}
	if mode == devfilter.ModeScope {
		if l := r.Filter.Link; l == nil || l.ID == 0 || l.ProgramID == 0 || l.CgroupID != cgroupID(t, scope) || r.Filter.ScopeCgroupID != l.CgroupID {
			t.Errorf("scope link: %+v", r.Filter.Link)
		}
		if len(r.OtherEntries) != 1 || r.OtherEntries[0].Exempt != "system" {
			t.Errorf("other entries: %+v", r.OtherEntries)
		}
	}
	if len(r.Jobs) != 1 || len(r.Jobs[0].Steps) != 1 {
		t.Fatalf("jobs: %+v", r.Jobs)
	}
	s := r.Jobs[0].Steps[0]
	if !s.CgroupExists || s.Kernel == nil || !s.Kernel.Present || !slices.Equal(s.Kernel.GPUMinors, []uint32{0, 1}) {
		t.Errorf("step: %+v kernel %+v", s, s.Kernel)
	}
	var human, errb bytes.Buffer
	if code := runStatus([]string{"--config", cfg}, &human, &errb); code != 0 {
		t.Errorf("human status: exit %d: %s", code, errb.String())
	}
	t.Logf("human:\n%s", human.String())

	// Behind the state's back: step 0's entry goes, step 1 gets one.
	f, err = devfilter.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(step0); err != nil {
		t.Fatal(err)
	}
	if err := f.Set(step1, devfilter.Policy{GPUMinors: []uint32{2}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	r, code, _ = runStatusJSON(t, "--config", cfg)
	if code != 1 || r.OK {
		t.Fatalf("exit %d after Remove, problems %q", code, r.Problems)
	}
	for _, w := range []string{
		fmt.Sprintf("job 1 step 0: the state has the step but the kernel has no entry for its cgroup %d", step0.ID),
		fmt.Sprintf("kernel entry for cgroup %d with no step in the state", step1.ID),
	} {
		if !slices.Contains(r.Problems, w) {
			t.Errorf("no problem %q in %q", w, r.Problems)
		}
	}
	if len(r.Problems) != 2 {
		t.Errorf("problems: %q", r.Problems)
	}
	human.Reset()
	if code := runStatus([]string{"--config", cfg}, &human, &errb); code != 1 {
		t.Errorf("human status after Remove: exit %d", code)
	}
	t.Logf("mismatch:\n%s", human.String())
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
	r := buildStatus(in)
	if !r.OK || r.Filter.SlurmScope != scopeDir || len(r.Filter.IgnoredScopes) != 1 || r.Filter.IgnoredScopes[0].Path != planted {
		t.Errorf("planted scope: ok=%v problems %q, filter %+v", r.OK, r.Problems, r.Filter)
	}
	var out bytes.Buffer
	writeStatus(&out, r)
	if !strings.Contains(out.String(), "not a scope  "+planted) {
		t.Errorf("text output does not name %s:\n%s", planted, out.String())
	}

	in.SlurmScopeID = 51
	r = buildStatus(in)
	if want := "filter: the filter is on cgroup 50, but Slurm's scope " + scopeDir + " is cgroup 51"; !slices.Equal(r.Problems, []string{want}) {
		t.Errorf("filter off Slurm's scope: problems %q, want %q", r.Problems, want)
	}

	in.SlurmScope, in.SlurmScopeID = "", 0
	in.ScopeErr = "Slurm's scope is ambiguous: Slurm's processes run in both a and b"
	r = buildStatus(in)
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
	r := buildStatus(in)
	if !r.OK || r.Filter.SlurmdCgroup != svc || r.Filter.SlurmdLink == nil || r.Filter.SlurmdLink.CgroupID != 70 {
		t.Errorf("slurmd link in place: ok=%v problems %q, filter %+v", r.OK, r.Problems, r.Filter)
	}
	var out bytes.Buffer
	writeStatus(&out, r)
	for _, want := range []string{"slurmd cgroup  " + svc + " (outside the scope)", "slurmd link    id 18, prog 88 devfilter_scope, cgroup 70"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, out.String())
		}
	}
	for _, tc := range []struct {
		name string
		edit func(*statusInput)
		want string
	}{
		{"no link", func(in *statusInput) { in.Kernel.SlurmdLink = nil }, "filter: slurmd runs in " + svc + ", outside the scope, and no link is pinned there"},
		{"made again", func(in *statusInput) { in.Kernel.SlurmdLink.CgroupID = 0 }, "filter: the link on slurmd's cgroup is on cgroup 0, but " + svc + " is cgroup 70"},
		{"a pid file that is no pid", func(in *statusInput) { in.SlurmdErr = `slurmd's pid file /run/slurmd.pid: "x" is not a pid` }, "filter: slurmd's pid file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := in
			link := *in.Kernel.SlurmdLink
			kv := *in.Kernel
			kv.SlurmdLink = &link
			c.Kernel = &kv
			tc.edit(&c)
			r := buildStatus(c)
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
	r := buildStatus(in)
	if !r.OK || len(r.Jobs) != 2 || len(r.Jobs[0].Shares) != 2 || r.Jobs[0].Shares[0].Count != 5 || r.Jobs[1].Shares != nil {
		t.Fatalf("jobs: %+v (problems %q)", r.Jobs, r.Problems)
	}
	var out bytes.Buffer
	writeStatus(&out, r)
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
