// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/server"
	"github.com/gpufence/gpufence/agent/verify"
	"github.com/gpufence/gpufence/agent/verifycgroup"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// gpufence verify's child: the test binary re-executed in the verify
// cgroup.
func init() {
	if os.Getenv("GPUFENCE_TEST_VERIFY_CHILD") == "1" {
		os.Exit(verify.ChildMain(os.Args[1:], os.Stdout, os.Stderr))
	}
}

// serve puts d behind a real socket, as the agent does.
func (tr *tree) serve(d *Daemon) string {
	tr.t.Helper()
	sock := filepath.Join(tr.t.TempDir(), "agent.sock")
	ln, err := server.Listen(sock)
	if err != nil {
		tr.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := server.New(ln, d.Handler(), slog.New(slog.NewTextHandler(io.Discard, nil)), 5*time.Second)
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	tr.t.Cleanup(func() { cancel(); <-done })
	return sock
}

// slurmd runs a stand-in for Slurm's slurmd in the scope's slurmd cgroup,
// where Slurm 23.02+ puts a slurmd it did not get from systemd: a root
// process running a binary named slurmd (a copy of sleep), which is what
// verify takes as proof that the scope is Slurm's.
func (tr *tree) slurmd() *exec.Cmd { return tr.slurmProc("slurmd", tr.mkdir("slurmd")) }

// slurmProc runs a root process of a binary named name (a copy of sleep)
// in the cgroup dir.
func (tr *tree) slurmProc(name, dir string) *exec.Cmd {
	tr.t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		tr.t.Fatal(err)
	}
	bin := filepath.Join(tr.t.TempDir(), name)
	b, err := os.ReadFile(sleep)
	if err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		tr.t.Fatal(err)
	}
	cmd := exec.Command(bin, "300")
	if err := tr.inCgroup(dir, cmd, cmd.Start); err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// verify runs gpufence verify's self-test against the agent on sock.
func (tr *tree) verify(sock string, gpu *int) verify.Report {
	tr.t.Helper()
	return tr.verifyIn(sock, tr.scope, gpu)
}

// verifyIn runs the self-test with scope as verify's configured scope.
func (tr *tree) verifyIn(sock, scope string, gpu *int) verify.Report {
	tr.t.Helper()
	r := verify.Run(verify.Options{Socket: sock, Scope: scope, GPU: gpu, Timeout: 10 * time.Second,
		Child: []string{os.Args[0]}, Env: []string{"GPUFENCE_TEST_VERIFY_CHILD=1"}})
	for _, c := range r.Checks {
		tr.t.Logf("verify: ok=%v skipped=%v %s: %s (%d µs)", c.OK, c.Skipped, c.Name, c.Detail, c.TookUS)
	}
	tr.t.Logf("verify: ok=%v failed=%q in %d µs", r.OK, r.Failed, r.TookUS)
	return r
}

// kernelState is what verify must leave as it found it: the filter's
// entries, the agent's records, and the scope's children.
type kernelState struct {
	entries          []uint64
	steps, exempt    int
	children         []string
	verifyRegistered int
}

func (tr *tree) state(d *Daemon) kernelState {
	tr.t.Helper()
	var st kernelState
	if f := d.filter(); f != nil {
		p, err := f.Policies()
		if err != nil {
			tr.t.Fatal(err)
		}
		st.entries = slices.Sorted(maps.Keys(p))
	}
	st.steps, st.exempt = d.owned()
	ents, err := os.ReadDir(tr.scope)
	if err != nil {
		tr.t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			st.children = append(st.children, e.Name())
		}
	}
	st.verifyRegistered = d.h.VerifyRegistered()
	return st
}

func (tr *tree) sameState(what string, before, after kernelState) {
	tr.t.Helper()
	if !slices.Equal(before.entries, after.entries) || before.steps != after.steps || before.exempt != after.exempt ||
		!slices.Equal(before.children, after.children) || after.verifyRegistered != 0 {
		tr.t.Errorf("%s: left something behind: before %+v, after %+v", what, before, after)
	}
}

func checkNamed(r verify.Report, id string) (verify.Check, bool) {
	for _, c := range r.Checks {
		if c.ID == id {
			return c, true
		}
	}
	return verify.Check{}, false
}

// passes asserts that the self-test passed with every check it should
// have made, GPU gpu given and the other three refused.
func (tr *tree) passes(r verify.Report, mode devfilter.Mode, gpu int) {
	tr.t.Helper()
	if !r.OK || len(r.Failed) != 0 {
		tr.t.Fatalf("verify failed on a healthy node: %q", r.Failed)
	}
	want := []string{"slurm", "agent", "filter", "enforcing", "gpu0", "gpu1", "gpu2", "gpu3", "unregistered", "entry", "cleanup"}
	for _, id := range want {
		c, ok := checkNamed(r, id)
		if !ok {
			tr.t.Errorf("check %s missing", id)
			continue
		}
		switch {
		case id == "unregistered" && mode == devfilter.ModePerCgroup:
			if !c.Skipped {
				tr.t.Errorf("per-cgroup mode: unregistered check %+v, want skipped", c)
			}
		case !c.OK:
			tr.t.Errorf("check %s: %+v", id, c)
		}
	}
	own, _ := checkNamed(r, "gpu"+strconv.Itoa(gpu))
	if want := "GPU " + strconv.Itoa(gpu) + " opened in its own cgroup"; own.Name != want || !strings.Contains(own.Detail, "ENXIO") {
		tr.t.Errorf("given GPU's check %+v, want %q with ENXIO", own, want)
	}
	if r.GPU == nil || *r.GPU != gpu || r.Mode != string(mode) {
		tr.t.Errorf("report gpu %v mode %q, want %d %s", r.GPU, r.Mode, gpu, mode)
	}
}

func TestPrivilegedVerifyScope(t *testing.T)     { testVerify(t, devfilter.ModeScope) }
func TestPrivilegedVerifyPerCgroup(t *testing.T) { testVerify(t, devfilter.ModePerCgroup) }

func testVerify(t *testing.T, mode devfilter.Mode) {
	tr := newTree(t)
	if mode == devfilter.ModeScope {
		if m, _ := devfilter.Probe(); m != devfilter.ModeScope {
			t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", m)
		}
	}
	d, _ := tr.daemon(mode)
	sock := tr.serve(d)
	sd := tr.slurmd()
	// A running job beside the self-test keeps exactly its GPU.
	call(d, 0, &pb.JobProlog{JobId: 7, Uid: 1000, JobGpus: ptr("1")})
	stepd := tr.start(tr.mkdir("job_7/step_0/slurm"))
	if r := call(d, stepd.Process.Pid, &pb.StepStart{JobId: 7, StepId: 0, Uid: 1000, StepGpus: ptr("1")}); r.Error != "" {
		t.Fatalf("step: %s", r.Error)
	}
	task := tr.mkdir("job_7/step_0/user/task_0")
	tr.expect(task, 1)

	before := tr.state(d)
	r := tr.verify(sock, nil)
	tr.passes(r, mode, 0)
	tr.sameState("verify", before, tr.state(d))
	recs := tr.rec.Records(audit.EventVerify)
	if len(recs) != 1 || recs[0].Severity != audit.SeverityInfo || !slices.Equal(recs[0].GPUs, []int{0}) || recs[0].CgroupID == 0 ||
		!strings.Contains(recs[0].Cgroup, verifycgroup.Prefix) || recs[0].Error != "" {
		t.Fatalf("verify records %+v, want one info record for GPU 0", recs)
	}

	g := 2
	tr.passes(tr.verify(sock, &g), mode, 2)
	tr.sameState("verify --gpu 2", before, tr.state(d))
	tr.expect(task, 1)

	// No agent: fails, naming it, and leaves nothing.
	dead := tr.verify(filepath.Join(t.TempDir(), "none.sock"), nil)
	if dead.OK || !slices.Equal(dead.Failed, []string{"agent unreachable"}) {
		t.Errorf("verify with no agent: failed %q, want [agent unreachable]", dead.Failed)
	}
	tr.sameState("verify with no agent", before, tr.state(d))

	tr.refusals(d, mode)
	tr.sameState("refused requests", before, tr.state(d))

	if mode == devfilter.ModeScope {
		tr.detached(d, sock, before, stepd, sd)
	}
	if stepd.ProcessState == nil {
		stepd.Process.Kill()
		stepd.Wait()
	}
	call(d, 0, &pb.JobEpilog{JobId: 7})
	tr.removeJobCgroup("job_7")
}

// detached: with the agent's filter off Slurm's live scope (its link
// detached; the scope made again at the same path), verify fails and
// names why, and passes again once the agent re-attached.
func (tr *tree) detached(d *Daemon, sock string, before kernelState, stepd, slurmd *exec.Cmd) {
	t := tr.t
	for _, how := range []string{"link detached", "scope made again"} {
		switch how {
		case "link detached":
			tr.detachScopeLink()
		case "scope made again":
			tr.removeJobCgroup("", stepd, slurmd)
			for _, dir := range []string{"system", "slurmd"} {
				tr.mkdir(dir)
			}
			tr.slurmd()
		}
		n := len(tr.rec.Records(audit.EventVerify))
		r := tr.verify(sock, nil)
		for _, want := range []string{"filter not attached to the live scope", "GPU 1 opened though not given", "GPU 2 opened though not given",
			"GPU 3 opened though not given", "unregistered cgroup opened a GPU"} {
			if !slices.Contains(r.Failed, want) {
				t.Errorf("%s: verify failed %q, lacking %q", how, r.Failed, want)
			}
		}
		if r.OK {
			t.Errorf("%s: verify passed", how)
		}
		for _, id := range []string{"gpu0", "entry", "cleanup"} {
			if c, _ := checkNamed(r, id); !c.OK {
				t.Errorf("%s: check %s: %+v", how, id, c)
			}
		}
		recs := tr.rec.Records(audit.EventVerify)
		if len(recs) != n+1 || recs[n].Severity != audit.SeverityError || !strings.Contains(recs[n].Error, "GPU 1 opened though not given") {
			t.Errorf("%s: verify records %+v, want an error record naming GPU 1", how, recs[n:])
		}
		after := tr.state(d)
		if how == "link detached" {
			tr.sameState(how, before, after)
		} else if len(after.children) != 2 || after.verifyRegistered != 0 || slices.ContainsFunc(after.children, func(c string) bool { return strings.HasPrefix(c, verifycgroup.Prefix) }) {
			t.Errorf("%s: left behind %+v", how, after)
		}
		d.rc.Pass() // the agent re-attaches
		tr.passes(tr.verify(sock, nil), devfilter.ModeScope, 0)
	}
}

// detachScopeLink detaches the device filter's link on the tree's scope,
// found among the kernel's links by the scope's cgroup id.
func (tr *tree) detachScopeLink() {
	tr.t.Helper()
	id, err := jobcgroup.ID(tr.scope)
	if err != nil {
		tr.t.Fatal(err)
	}
	it := new(link.Iterator)
	found := 0
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil || info.Type != link.CgroupType {
			continue
		}
		if c := info.Cgroup(); c != nil && c.CgroupId == id && ebpf.AttachType(c.AttachType) == ebpf.AttachCGroupDevice {
			if err := it.Link.Detach(); err != nil {
				tr.t.Fatal(err)
			}
			found++
		}
	}
	if err := it.Err(); err != nil || found != 1 {
		tr.t.Fatalf("detach the scope link: %d found, %v", found, err)
	}
	tr.expect(tr.mkdir("job_99/step_0"), 0, 1, 2, 3) // unfiltered now
	tr.removeJobCgroup("job_99")
}

// refusals: the agent gives a GPU by VerifyStart to no cgroup but a
// verify cgroup's `given` leaf, root's, below the scope; and drops by
// VerifyEnd only what it registered that way.
func (tr *tree) refusals(d *Daemon, mode devfilter.Mode) {
	t := tr.t
	for _, rel := range []string{"job_8/step_0", "gpufence-verify-12/bare", "gpufence-verify-12/given/x", "gpufence-verify-012/given",
		"gpufence-verify-x/given", "system", "slurmd", "job_7/step_0/user/task_0"} {
		dir := tr.mkdir(rel)
		p := tr.start(dir)
		r := d.h.Handle(nil, peer.Peer{PID: p.Process.Pid}, &pb.Request{Msg: &pb.Request_VerifyStart{VerifyStart: &pb.VerifyStart{}}})
		p.Process.Kill()
		p.Wait()
		if r.Error == "" || r.Verify != nil {
			t.Errorf("VerifyStart from %s: %+v, want refused", rel, r)
		}
		if !strings.HasPrefix(rel, "job_7") && rel != "system" && rel != "slurmd" {
			tr.removeJobCgroup(strings.Split(rel, "/")[0])
		}
	}
	// Not root's: a user cannot have made it, so the agent must not trust it.
	dir := tr.mkdir("gpufence-verify-13/given")
	os.Chown(filepath.Dir(dir), 1000, 1000)
	p := tr.start(dir)
	r := d.h.Handle(nil, peer.Peer{PID: p.Process.Pid}, &pb.Request{Msg: &pb.Request_VerifyStart{VerifyStart: &pb.VerifyStart{}}})
	p.Process.Kill()
	p.Wait()
	if !strings.Contains(r.Error, "not root's") {
		t.Errorf("VerifyStart from a user's cgroup: %+v", r)
	}
	tr.removeJobCgroup("gpufence-verify-13")
	// A GPU the table lacks.
	dir = tr.mkdir("gpufence-verify-14/given")
	p = tr.start(dir)
	g := uint32(9)
	r = d.h.Handle(nil, peer.Peer{PID: p.Process.Pid}, &pb.Request{Msg: &pb.Request_VerifyStart{VerifyStart: &pb.VerifyStart{Gpu: &g}}})
	p.Process.Kill()
	p.Wait()
	if !strings.Contains(r.Error, "GPU 9 is not in this node's GPU table") {
		t.Errorf("VerifyStart for GPU 9: %+v", r)
	}
	tr.removeJobCgroup("gpufence-verify-14")
	// VerifyEnd of a step's cgroup: refused, the step keeps its entry.
	id, _ := jobcgroup.ID(filepath.Join(tr.scope, "job_7/step_0"))
	r = d.h.Handle(nil, peer.Peer{}, &pb.Request{Msg: &pb.Request_VerifyEnd{VerifyEnd: &pb.VerifyEnd{CgroupId: id}}})
	if !strings.Contains(r.Error, "is not a verify cgroup") {
		t.Errorf("VerifyEnd of a step: %+v", r)
	}
	tr.expect(filepath.Join(tr.scope, "job_7/step_0/user/task_0"), 1)
}

// TestPrivilegedVerifyNotSlurmsScope: verify passes only against the
// scope Slurm's own processes live in. With the agent's filter on another
// cgroup (as a planted scope once captured it), verify fails whichever of
// the two it is pointed at, and a scope in a user's delegated subtree is
// refused outright.
func TestPrivilegedVerifyNotSlurmsScope(t *testing.T) {
	slurms := newTree(t)
	slurms.slurmd()
	slurms.slurmProc("slurmstepd", slurms.mkdir("job_3/step_0/slurm"))
	other := newTree(t)
	d, _ := other.daemon(devfilter.ModeAuto)
	sock := other.serve(d)

	r := slurms.verifyIn(sock, slurms.scope, nil)
	if r.OK || !(slices.Contains(r.Failed, "agent refused the verify cgroup") || slices.Contains(r.Failed, "filter not on Slurm's scope")) {
		t.Errorf("verify of Slurm's scope with the filter elsewhere: failed %q", r.Failed)
	}
	r = slurms.verifyIn(sock, other.scope, nil)
	if r.OK || !slices.Equal(r.Failed, []string{"Slurm's processes do not live in the scope"}) {
		t.Errorf("verify of the scope the filter is on, with no Slurm process: failed %q", r.Failed)
	}

	planted := filepath.Join(other.root, "user.slice", "user-64123.slice", "user@64123.service", "tn_slurmstepd.scope")
	if err := os.MkdirAll(planted, 0o755); err != nil {
		t.Fatal(err)
	}
	for p := planted; p != filepath.Join(other.root, "user.slice", "user-64123.slice"); p = filepath.Dir(p) {
		if err := os.Chown(p, 64123, 64123); err != nil {
			t.Fatal(err)
		}
	}
	r = slurms.verifyIn(sock, planted, nil)
	c, _ := checkNamed(r, "scope")
	if r.OK || !strings.Contains(c.Detail, "a user's own cgroup subtree") {
		t.Errorf("verify of a planted scope: failed %q, scope check %+v", r.Failed, c)
	}
}
