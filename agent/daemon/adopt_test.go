// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"golang.org/x/sys/unix"
)

// With GPUFENCE_TEST_PROBE=<path>, the test binary opens path in a loop
// until its stdin closes, then prints how each open ended ("ENXIO 812").
func init() {
	p := os.Getenv("GPUFENCE_TEST_PROBE")
	if p == "" {
		return
	}
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(done) }()
	counts := map[string]int{}
	for {
		select {
		case <-done:
			for k, v := range counts {
				fmt.Printf("%s %d\n", k, v)
			}
			os.Exit(0)
		default:
		}
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		res := "OK"
		if err != nil {
			res = unix.ErrnoName(err.(unix.Errno))
		} else {
			unix.Close(fd)
		}
		counts[res]++
		time.Sleep(200 * time.Microsecond)
	}
}

// prober opens one device in a loop from cgroup dir, from before the agent
// starts until stop, which returns how the opens ended.
func (tr *tree) prober(dir, dev string) (stop func() map[string]int) {
	tr.t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "GPUFENCE_TEST_PROBE="+filepath.Join(tr.dev, dev))
	in, err := cmd.StdinPipe()
	if err != nil {
		tr.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tr.t.Fatal(err)
	}
	if err := tr.inCgroup(dir, cmd, cmd.Start); err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return func() map[string]int {
		in.Close()
		got := map[string]int{}
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var k string
			var n int
			if _, err := fmt.Sscanf(sc.Text(), "%s %d", &k, &n); err == nil {
				got[k] = n
			}
		}
		cmd.Wait()
		return got
	}
}

// asUID runs a sleeper as uid in dir: a job's task, owned by its user.
func (tr *tree) asUID(dir string, uid uint32) {
	tr.t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := tr.inCgroup(dir, cmd, func() error {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid}
		return cmd.Start()
	}); err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

func adoptedRecord(recs []audit.Record, job uint32) (audit.Record, bool) {
	for _, r := range recs {
		if r.JobID == job {
			return r, true
		}
	}
	return audit.Record{}, false
}

// Jobs running when the agent first starts (gpufence put on a busy node)
// are taken over before the filter first runs: a job slurmctld confirms
// keeps exactly its GPUs and never sees an EPERM on them; one slurmctld
// cannot be asked about (connect failure) is audit-only, as configured
// here, until it answers; one slurmctld refuses (ambiguous, unknown) or
// whose answer did not come in time gets nothing.
func TestPrivilegedAdoptRunningJobsScope(t *testing.T) { testAdoptRunningJobs(t, devfilter.ModeScope) }
func TestPrivilegedAdoptRunningJobsPerCgroup(t *testing.T) {
	testAdoptRunningJobs(t, devfilter.ModePerCgroup)
}

func testAdoptRunningJobs(t *testing.T, mode devfilter.Mode) {
	tr := newTree(t)
	if mode == devfilter.ModeScope {
		if m, _ := devfilter.Probe(); m != devfilter.ModeScope {
			t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", m)
		}
	}
	// Job 7 (uid 1000) holds GPU 1; job 8 (uid 1001) is one slurmctld
	// cannot be asked about; job 9's answer is ambiguous (a forged job
	// name); job 10 slurmctld does not know; job 11's answer did not come
	// in time (issue 18: a user's flood made slurmctld slow).
	own := tr.mkdir("job_7/step_0/user/task_0")
	tr.mkdir("job_7/step_0/slurm")
	tr.mkdir("job_7/step_extern/slurm")
	foreign := tr.mkdir("job_7/step_extern/user/task_0")
	j8 := tr.mkdir("job_8/step_0/user/task_0")
	j9 := tr.mkdir("job_9/step_batch/user/task_0")
	j10 := tr.mkdir("job_10/step_0/user/task_0")
	j11 := tr.mkdir("job_11/step_batch/user/task_0")
	tr.asUID(j8, 1001)
	tr.asUID(j11, 1002)
	tr.ctld.set(7, slurm.ControllerJob{ID: 7, UID: 1000, State: "RUNNING", OnNode: true, GPUs: []int{1}, Source: "test json"}, nil)
	tr.ctld.set(8, slurm.ControllerJob{}, &slurm.UnreachableError{Msg: "scontrol: slurm_load_jobs error: Unable to contact slurm controller (connect failure)"})
	tr.ctld.set(9, slurm.ControllerJob{}, &slurm.AmbiguousError{Reason: "two per-node blocks name this node"})
	tr.ctld.set(11, slurm.ControllerJob{}, &slurm.AmbiguousError{Reason: "squeue --json gave no complete answer in 1.8s"})

	stopOwn := tr.prober(own, "nvidia1")
	stopForeign := tr.prober(foreign, "nvidia0")
	time.Sleep(100 * time.Millisecond) // both probing, no filter yet
	d, _ := tr.daemonWith(mode, func(c *config.Config) { c.AdoptUnconfirmed = config.AdoptAuditOnly })
	time.Sleep(100 * time.Millisecond)
	gotOwn, gotForeign := stopOwn(), stopForeign()
	if gotOwn["EPERM"] != 0 || gotOwn["ENXIO"] < 10 {
		t.Errorf("job 7 opening its own GPU across the agent's start: %v; want no EPERM ever", gotOwn)
	}
	if gotForeign["EPERM"] == 0 {
		t.Errorf("job 7 opening GPU 0 across the agent's start: %v; want EPERM once enforced", gotForeign)
	}
	tr.expect(own, 1)
	tr.expect(foreign, 1)
	tr.expect(j9)
	tr.expect(j10)
	tr.expect(j11)            // slow is not unreachable: denied, whatever adopt_unconfirmed says
	tr.expect(j8, 0, 1, 2, 3) // audit-only: opens, each audited

	recs := tr.rec.Records(audit.EventJobAdopted)
	if r, ok := adoptedRecord(recs, 7); !ok || r.Severity != audit.SeverityInfo || !slices.Equal(r.GPUs, []int{1}) || r.UID == nil || *r.UID != 1000 {
		t.Errorf("job 7's job_adopted record: %+v (found %v)", r, ok)
	}
	if r, ok := adoptedRecord(recs, 8); !ok || r.Severity != audit.SeverityWarning || r.PolicyMode != audit.ModeAuditOnly || !strings.Contains(r.Error, "Unable to contact") {
		t.Errorf("job 8's job_adopted record: %+v (found %v)", r, ok)
	}
	if r, ok := adoptedRecord(recs, 9); !ok || r.Severity != audit.SeverityError || !strings.Contains(r.Message, "ambiguous") {
		t.Errorf("job 9's job_adopted record: %+v (found %v)", r, ok)
	}
	if _, ok := adoptedRecord(recs, 10); !ok {
		t.Errorf("no job_adopted record for job 10: %+v", recs)
	}
	if r, ok := adoptedRecord(recs, 11); !ok || r.Severity != audit.SeverityError || !strings.Contains(r.Message, "no complete answer") {
		t.Errorf("job 11's job_adopted record: %+v (found %v)", r, ok)
	}
	if j, _, ok := d.job(11); !ok || j.Unconfirmed != registry.UnconfirmedDeny {
		t.Errorf("job 11, whose answer did not come in time: %+v (found %v), want recorded as denied", j, ok)
	}
	j, steps, ok := d.job(8)
	if !ok || j.Unconfirmed != registry.UnconfirmedAuditOnly || j.UID != 1001 || len(steps) != 1 || !steps[0].AuditOnly {
		t.Errorf("job 8's record: %+v %+v (found %v); want unconfirmed audit-only, uid 1001 from its task", j, steps, ok)
	}
	if j, _, ok := d.job(9); !ok || j.Unconfirmed != registry.UnconfirmedDeny {
		t.Errorf("job 9, whose answer was ambiguous: %+v (found %v), want recorded as denied", j, ok)
	}
	// Job 8's open of GPU 2 is a would-deny record.
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.flush()
		var found bool
		for _, r := range tr.rec.Records(audit.EventGPUAccess) {
			if r.JobID == 8 && r.Decision == audit.DecisionWouldDeny {
				found = true
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no would-deny record of job 8: %+v", tr.rec.Records(audit.EventGPUAccess))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A new step of the unconfirmed job: what it asks for, audited.
	s1 := tr.start(tr.mkdir("job_8/step_1/slurm"))
	t81 := tr.mkdir("job_8/step_1/user/task_0")
	if r := call(d, s1.Process.Pid, &pb.StepStart{JobId: 8, StepId: 1, Uid: 1001, StepGpus: ptr("2")}); r.Error != "" || !slices.Equal(r.Gpus, []uint32{2}) {
		t.Fatalf("new step of unconfirmed job 8: %+v", r)
	}
	tr.expect(t81, 0, 1, 2, 3)

	// slurmctld is back and holds job 8 to GPU 3: the adopted step gets
	// it, the later step (which asked for 2) nothing.
	tr.ctld.set(8, slurm.ControllerJob{ID: 8, UID: 1001, State: "RUNNING", OnNode: true, GPUs: []int{3}, Source: "test json"}, nil)
	d.recovery.Forget(8)
	d.rc.Pass()
	tr.expect(j8, 3)
	tr.expect(t81)
	if j, _, _ := d.job(8); j.Unconfirmed != "" || !slices.Equal(j.GPUs, []int{3}) {
		t.Errorf("job 8 after slurmctld confirmed it: %+v", j)
	}
	if n := len(tr.rec.Records(audit.EventJobAdopted)); n != len(recs)+1 {
		t.Errorf("%d job_adopted records after the confirmation, want %d", n, len(recs)+1)
	}
}

// adopt_unconfirmed: deny, the default, gives a job slurmctld cannot be
// asked about no GPU, refuses its GPU steps with a message that says why,
// and lets its CPU-only steps run; a later ambiguous answer keeps it
// denied.
func TestPrivilegedAdoptUnconfirmedDeny(t *testing.T) {
	tr := newTree(t)
	task := tr.mkdir("job_8/step_0/user/task_0")
	tr.asUID(task, 1001)
	tr.ctld.set(8, slurm.ControllerJob{}, &slurm.UnreachableError{Msg: "connect failure"})
	d, _ := tr.daemon(devfilter.ModeAuto)
	tr.expect(task)
	s1 := tr.start(tr.mkdir("job_8/step_1/slurm"))
	d.recovery.Forget(8)
	r := call(d, s1.Process.Pid, &pb.StepStart{JobId: 8, StepId: 1, Uid: 1001, StepGpus: ptr("0")})
	if !strings.Contains(r.Error, "adopt_unconfirmed: deny") {
		t.Errorf("GPU step of a denied unconfirmed job: %+v", r)
	}
	s2 := tr.start(tr.mkdir("job_8/step_2/slurm"))
	if r := call(d, s2.Process.Pid, &pb.StepStart{JobId: 8, StepId: 2, Uid: 1001}); r.Error != "" || len(r.Gpus) != 0 {
		t.Errorf("CPU-only step of a denied unconfirmed job: %+v", r)
	}
	tr.ctld.set(8, slurm.ControllerJob{}, &slurm.AmbiguousError{Reason: "forged"})
	d.recovery.Forget(8)
	d.rc.Pass()
	if j, _, ok := d.job(8); !ok || j.Unconfirmed != registry.UnconfirmedDeny || len(j.GPUs) != 0 {
		t.Errorf("job 8 after an ambiguous answer: %+v (found %v)", j, ok)
	}
	tr.expect(task)
}

// An audit-only unconfirmed job whose later answer is ambiguous loses its
// audit-only entries: an ambiguous answer is something its user can make.
func TestPrivilegedAdoptAuditOnlyThenAmbiguous(t *testing.T) {
	tr := newTree(t)
	task := tr.mkdir("job_8/step_0/user/task_0")
	tr.asUID(task, 1001)
	tr.ctld.set(8, slurm.ControllerJob{}, &slurm.UnreachableError{Msg: "connect failure"})
	d, _ := tr.daemonWith(devfilter.ModeAuto, func(c *config.Config) { c.AdoptUnconfirmed = config.AdoptAuditOnly })
	tr.expect(task, 0, 1, 2, 3)
	tr.ctld.set(8, slurm.ControllerJob{}, &slurm.AmbiguousError{Reason: "forged"})
	d.recovery.Forget(8)
	d.rc.Pass()
	tr.expect(task)
	if j, _, _ := d.job(8); j.Unconfirmed != registry.UnconfirmedDeny {
		t.Errorf("job 8: %+v, want denied", j)
	}
	// slurmctld says it ended: released.
	tr.ctld.set(8, slurm.ControllerJob{ID: 8, UID: 1001, State: "COMPLETED"}, nil)
	d.recovery.Forget(8)
	d.rc.Pass()
	if _, _, ok := d.job(8); ok {
		t.Error("job 8 kept after slurmctld said it completed")
	}
}

// An audit-only unconfirmed job is denied once adopt_unconfirmed_max has
// passed without slurmctld confirming it, and held to its GPUs when it
// finally does.
func TestPrivilegedAdoptAuditOnlyBounded(t *testing.T) {
	tr := newTree(t)
	task := tr.mkdir("job_8/step_0/user/task_0")
	tr.asUID(task, 1001)
	tr.ctld.set(8, slurm.ControllerJob{}, &slurm.UnreachableError{Msg: "connect failure"})
	const max = time.Second
	d, _ := tr.daemonWith(devfilter.ModeAuto, func(c *config.Config) {
		c.AdoptUnconfirmed, c.AdoptUnconfirmedMax = config.AdoptAuditOnly, config.Duration{Duration: max}
	})
	tr.expect(task, 0, 1, 2, 3)
	d.rc.Pass()
	tr.expect(task, 0, 1, 2, 3) // within the bound: still audit-only
	// The bound is a span of time, so time must pass.
	time.Sleep(max + 100*time.Millisecond)
	d.rc.Pass()
	tr.expect(task)
	j, steps, ok := d.job(8)
	if !ok || j.Unconfirmed != registry.UnconfirmedDeny || len(steps) != 1 || steps[0].AuditOnly {
		t.Fatalf("job 8 past adopt_unconfirmed_max: %+v %+v (found %v), want denied", j, steps, ok)
	}
	r, ok := adoptedRecord(slices.DeleteFunc(tr.rec.Records(audit.EventJobAdopted), func(r audit.Record) bool { return r.Severity != audit.SeverityError }), 8)
	if !ok || !strings.Contains(r.Message, "adopt_unconfirmed_max") || r.PolicyMode != audit.ModeEnforce {
		t.Errorf("job 8's record when denied: %+v (found %v)", r, ok)
	}
	tr.ctld.set(8, slurm.ControllerJob{ID: 8, UID: 1001, State: "RUNNING", OnNode: true, GPUs: []int{2}, Source: "test json"}, nil)
	d.recovery.Forget(8)
	d.rc.Pass()
	tr.expect(task, 2)
}
