// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// fakeCtld stands in for slurmctld: each job answers what the test set, an
// unset one ErrJobUnknown. (The parsing of slurmctld's real output is
// tested in agent/slurm, and against a real slurmctld in tests/e2e.)
type fakeCtld struct {
	mu      sync.Mutex
	answers map[uint32]fakeAnswer
	n       map[uint32]int
}

type fakeAnswer struct {
	job slurm.ControllerJob
	err error
}

func (f *fakeCtld) set(id uint32, j slurm.ControllerJob, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.answers == nil {
		f.answers = map[uint32]fakeAnswer{}
	}
	f.answers[id] = fakeAnswer{j, err}
}

func (f *fakeCtld) calls(id uint32) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[id]
}

func (f *fakeCtld) Job(_ context.Context, id uint32) (slurm.ControllerJob, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[uint32]int{}
	}
	f.n[id]++
	a, ok := f.answers[id]
	if !ok {
		return slurm.ControllerJob{}, slurm.ErrJobUnknown
	}
	return a.job, a.err
}

// removeJobCgroup kills what runs in a job's cgroups and removes them, as
// Slurm does when a user cancels every step of their job, the extern step
// included; the allocation lives on.
func (tr *tree) removeJobCgroup(job string, procs ...*exec.Cmd) {
	tr.t.Helper()
	for _, c := range procs {
		c.Process.Kill()
		c.Wait()
	}
	var dirs []string
	filepath.Walk(filepath.Join(tr.scope, job), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := os.Remove(d); err != nil {
			tr.t.Fatal(err)
		}
	}
}

func (tr *tree) start(dir string) *exec.Cmd {
	tr.t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := tr.inCgroup(dir, cmd, cmd.Start); err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// The attack of issue 10: a user cancels their own job's steps, the extern
// step included (the job's cgroup goes with them, the allocation stays),
// so that the agent drops the job's record, then plants a fake GPU list in
// text slurmctld prints and starts a whole-job step. The record stays
// while slurmctld says the job runs, and the step gets the prolog's GPUs.
func TestPrivilegedCancelledStepsKeepTheRecord(t *testing.T) {
	tr := newTree(t)
	d, _ := tr.daemon(devfilter.ModeAuto)
	// Job 1 (the attacker, uid 1000) holds GPU 1; job 2 (uid 1001) 0, 2, 3.
	call(d, 0, &pb.JobProlog{JobId: 1, Uid: 1000, JobGpus: ptr("1")})
	call(d, 0, &pb.JobProlog{JobId: 2, Uid: 1001, JobGpus: ptr("0,2,3")})
	ext := tr.start(tr.mkdir("job_1/step_extern/slurm"))
	s0 := tr.start(tr.mkdir("job_1/step_0/slurm"))
	for _, st := range []struct {
		cmd *exec.Cmd
		id  uint32
	}{{ext, policy.ExternStep}, {s0, 0}} {
		if r := call(d, st.cmd.Process.Pid, &pb.StepStart{JobId: 1, StepId: st.id, Uid: 1000, StepGpus: ptr("1")}); r.Error != "" {
			t.Fatal(r.Error)
		}
	}
	// Whatever slurmctld's text would say, its structured view is what the
	// agent may believe: job 1 runs here with GPU 1.
	tr.ctld.set(1, slurm.ControllerJob{ID: 1, UID: 1000, State: "RUNNING", OnNode: true, GPUs: []int{1}}, nil)
	tr.removeJobCgroup("job_1", ext, s0)
	for range 3 {
		d.rc.Pass()
		d.reg.SetCheck(1, time.Time{}, 0) // ask at every pass
	}
	j, _, ok := d.job(1)
	if !ok || !slices.Equal(j.GPUs, []int{1}) || j.Recovered != "" {
		t.Fatalf("job 1 after its steps and cgroup were cancelled: %+v; want its prolog record kept", j)
	}
	// The next whole-job step (srun --interactive / salloc) gets GPU 1 only.
	s1 := tr.start(tr.mkdir("job_1/step_interactive/slurm"))
	task := tr.mkdir("job_1/step_interactive/user/task_0")
	r := call(d, s1.Process.Pid, &pb.StepStart{JobId: 1, StepId: policy.InteractiveStep, Uid: 1000, StepGpus: ptr("0,1,2,3")})
	if r.Error != "" || !slices.Equal(r.Gpus, []uint32{1}) {
		t.Fatalf("interactive step of job 1: %+v, want GPU 1 only", r)
	}
	tr.expect(task, 1)
	for _, rec := range tr.rec.Records(audit.EventJobWithoutProlog) {
		if rec.JobID == 1 {
			t.Errorf("job 1 went through recovery: %+v", rec)
		}
	}
}

// A job the agent has no record of (state lost) whose slurmctld answer is
// ambiguous gets no GPU, with an audit record that says why; once
// slurmctld answers unambiguously it gets exactly Slurm's list.
func TestPrivilegedRecoveryRefusesAmbiguousAnswer(t *testing.T) {
	tr := newTree(t)
	d, _ := tr.daemon(devfilter.ModeAuto)
	// The answer a forged job name makes of `scontrol show job -d`.
	out, err := os.ReadFile("../slurm/testdata/ctld/22.05-forged-name.txt")
	if err != nil {
		t.Fatal(err)
	}
	_, perr := slurm.ParseJobText(string(out), 4, "vm")
	var amb *slurm.AmbiguousError
	if !errors.As(perr, &amb) {
		t.Fatalf("fixture parses unambiguously: %v", perr)
	}
	tr.ctld.set(4, slurm.ControllerJob{}, perr)
	s := tr.start(tr.mkdir("job_4/step_interactive/slurm"))
	task := tr.mkdir("job_4/step_interactive/user/task_0")
	r := call(d, s.Process.Pid, &pb.StepStart{JobId: 4, StepId: policy.InteractiveStep, Uid: 1000})
	if r.Error != "" || len(r.Gpus) != 0 {
		t.Fatalf("interactive step after an ambiguous answer: %+v, want no GPU", r)
	}
	tr.expect(task)
	s0 := tr.start(tr.mkdir("job_4/step_0/slurm"))
	if r := call(d, s0.Process.Pid, &pb.StepStart{JobId: 4, StepId: 0, Uid: 1000, StepGpus: ptr("0")}); !strings.Contains(r.Error, "no trusted GPU list") {
		t.Errorf("GPU step after an ambiguous answer: %+v, want refused", r)
	}
	var found bool
	for _, rec := range tr.rec.Records(audit.EventJobWithoutProlog) {
		if rec.JobID == 4 && rec.Severity == audit.SeverityError && strings.Contains(rec.Message, "ambiguous") && strings.Contains(rec.Error, "JOB_GRES") {
			found = true
		}
	}
	if !found {
		t.Errorf("no error record saying the answer was ambiguous: %+v", tr.rec.Records(audit.EventJobWithoutProlog))
	}
	if n := tr.ctld.calls(4); n != 1 {
		t.Errorf("slurmctld asked %d times within the retry pause, want once", n)
	}

	// slurmctld's JSON says GPU 2, for another uid: refused too.
	tr.ctld.set(4, slurm.ControllerJob{ID: 4, UID: 1001, State: "RUNNING", OnNode: true, GPUs: []int{2}}, nil)
	d.recovery.Forget(4)
	if r := call(d, s.Process.Pid, &pb.StepStart{JobId: 4, StepId: policy.InteractiveStep, Uid: 1000}); len(r.Gpus) != 0 {
		t.Errorf("step of uid 1000 in a job slurmctld says is uid 1001's: %+v", r)
	}
	// For the right uid: exactly GPU 2.
	tr.ctld.set(4, slurm.ControllerJob{ID: 4, UID: 1000, State: "RUNNING", OnNode: true, GPUs: []int{2}, Source: "test"}, nil)
	d.recovery.Forget(4)
	r = call(d, s.Process.Pid, &pb.StepStart{JobId: 4, StepId: policy.InteractiveStep, Uid: 1000})
	if r.Error != "" || !slices.Equal(r.Gpus, []uint32{2}) {
		t.Fatalf("interactive step after recovery: %+v, want GPU 2", r)
	}
	tr.expect(task, 2)
}

// Slurm's scope removed and made again at the same path (scope unit
// stopped, slurmd started again): the filter is re-attached before the
// next step is answered, and that is audited.
func TestPrivilegedScopeRecreated(t *testing.T) {
	tr := newTree(t)
	if m, _ := devfilter.Probe(); m != devfilter.ModeScope {
		t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", m)
	}
	for _, byReconcile := range []bool{false, true} {
		name := map[bool]string{false: "first step", true: "reconcile"}[byReconcile]
		t.Run(name, func(t *testing.T) {
			d, _ := tr.daemon(devfilter.ModeScope)
			before := len(tr.rec.Records(audit.EventFilterReattached))
			tr.removeJobCgroup("")
			for _, dir := range []string{"system", "slurmd"} {
				tr.mkdir(dir)
			}
			// Without the fix this cgroup could open every GPU.
			tr.expect(tr.mkdir("job_9/step_0/user/task_0"), 0, 1, 2, 3)
			if byReconcile {
				d.rc.Pass()
				if n := len(tr.rec.Records(audit.EventFilterReattached)); n != before+1 {
					t.Fatalf("%d filter_reattached records after reconcile, want %d", n, before+1)
				}
				tr.expect(filepath.Join(tr.scope, "job_9/step_0/user/task_0"))
			}
			call(d, 0, &pb.JobProlog{JobId: 9, Uid: 1000, JobGpus: ptr("3")})
			s := tr.start(tr.mkdir("job_9/step_0/slurm"))
			if r := call(d, s.Process.Pid, &pb.StepStart{JobId: 9, StepId: 0, Uid: 1000, StepGpus: ptr("3")}); r.Error != "" || !slices.Equal(r.Gpus, []uint32{3}) {
				t.Fatalf("step in the recreated scope: %+v", r)
			}
			tr.expect(filepath.Join(tr.scope, "job_9/step_0/user/task_0"), 3)
			tr.expect(tr.mkdir("job_10/step_0/user/task_0")) // no entry: fail closed
			tr.expect(filepath.Join(tr.scope, "slurmd"), 0, 1, 2, 3)
			recs := tr.rec.Records(audit.EventFilterReattached)
			if len(recs) != before+1 {
				t.Fatalf("%d filter_reattached records, want %d", len(recs), before+1)
			}
			id, _ := os.Stat(tr.scope)
			if r := recs[len(recs)-1]; r.Cgroup != tr.scope || r.CgroupID == 0 || r.Reason == "" || id == nil {
				t.Errorf("filter_reattached record: %+v", r)
			}
			s.Process.Kill()
			s.Wait()
			call(d, 0, &pb.JobEpilog{JobId: 9})
			d.Close()
			tr.removeJobCgroup("job_9")
			tr.removeJobCgroup("job_10")
		})
	}
}

// Per-cgroup mode: a task that outlives its step (ignores SIGTERM) is still
// denied the step's GPUs after the step ended, until its cgroup is gone.
func TestPrivilegedPerCgroupEndedStepStaysDenied(t *testing.T) {
	tr := newTree(t)
	d, _ := tr.daemon(devfilter.ModePerCgroup)
	call(d, 0, &pb.JobProlog{JobId: 1, Uid: 1000, JobGpus: ptr("2")})
	s := tr.start(tr.mkdir("job_1/step_0/slurm"))
	task := tr.mkdir("job_1/step_0/user/task_0")
	if r := call(d, s.Process.Pid, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("2")}); r.Error != "" {
		t.Fatal(r.Error)
	}
	tr.expect(task, 2)
	call(d, 0, &pb.StepEnd{JobId: 1, StepId: 0})
	tr.expect(task) // denied, not unfiltered
	d.rc.Pass()
	tr.expect(task)
	if n := d.enf.Ended(); n != 1 {
		t.Errorf("%d ended entries kept, want 1", n)
	}
	tr.removeJobCgroup("job_1", s)
	d.rc.Pass()
	if n := d.enf.Ended(); n != 0 {
		t.Errorf("%d ended entries after the cgroup is gone, want 0", n)
	}
	pol, err := d.filter().Policies()
	if err != nil {
		t.Fatal(err)
	}
	if len(pol) != 0 {
		t.Errorf("kernel entries left after the step's cgroup is gone: %v", pol)
	}
}

// User names: a failed lookup is tried again later, a found one is cached,
// and no lookup runs while the daemon's lock is held.
func TestPrivilegedUserLookups(t *testing.T) {
	tr := newTree(t)
	d, _ := tr.daemon(devfilter.ModeAuto)
	var mu sync.Mutex
	lookups, underLock := 0, 0
	fail := true
	d.users.Lookup = func(uid uint32) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		lookups++
		if d.reg.Busy() || d.enf.Busy() {
			underLock++
		}
		if fail {
			return "", errors.New("LDAP down")
		}
		return "alice", nil
	}
	call(d, 0, &pb.JobProlog{JobId: 1, Uid: 1000, JobGpus: ptr("1")})
	s := tr.start(tr.mkdir("job_1/step_0/slurm"))
	for range 3 {
		call(d, s.Process.Pid, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("1")})
	}
	call(d, 0, &pb.StepEnd{JobId: 1, StepId: 0})
	mu.Lock()
	if lookups != 1 {
		t.Errorf("%d lookups of a failing uid within its retry pause, want 1", lookups)
	}
	fail = false
	mu.Unlock()
	d.users.Expire(1000)
	if r := call(d, s.Process.Pid, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("1")}); r.Error != "" {
		t.Fatal(r.Error)
	}
	call(d, 0, &pb.StepEnd{JobId: 1, StepId: 0})
	mu.Lock()
	defer mu.Unlock()
	if lookups != 2 || underLock != 0 {
		t.Errorf("%d lookups (want 2: retried after the failure expired), %d under the registry's or the enforcer's lock (want 0)", lookups, underLock)
	}
	var named int
	for _, r := range tr.rec.Records(audit.EventPolicyReleased) {
		if r.User == "alice" {
			named++
		}
	}
	if named != 1 {
		t.Errorf("%d policy_released records name alice, want 1 (after the retry)", named)
	}
}
