// SPDX-License-Identifier: Apache-2.0

package handler

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/imexchan"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/verifycgroup"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

func (v *env) bind(p peer.Peer, job, step, task uint32, visible *string) *pb.Response {
	v.t.Helper()
	return v.do(p, &pb.Request{Msg: &pb.Request_TaskBind{TaskBind: &pb.TaskBind{JobId: job, StepId: step, TaskId: task, VisibleDevices: visible}}})
}

// task_binding: slurm: a task's own cgroup gets an entry narrowed to what
// its CUDA_VISIBLE_DEVICES names within its step's list, never more; the
// task is found by its own cgroup, never by the message.
func TestTaskBind(t *testing.T) {
	v := newEnv(t, func(v *env) { v.h.TaskBinding = true })
	v.prolog(7, 1000, str("0,1,2"))
	r := v.mustStart(7, 0, 1000, str("0,1"))
	if !r.TaskBind {
		t.Fatal("a numbered GPU step in scope mode is not asked for its task bindings")
	}
	task0 := filepath.Join(stepDir(7, 0), "user/task_0")
	task1 := filepath.Join(stepDir(7, 0), "user/task_1")
	p0, p1 := v.proc(task0), v.proc(task1)
	if r := v.bind(p0, 7, 0, 0, str("1")); r.Error != "" || !reflect.DeepEqual(gpusOf(r), []int{1}) {
		t.Fatalf("bind task 0: %q %v", r.Error, gpusOf(r))
	}
	if p, ok := v.entry(task0); !ok || !same(p.GPUMinors, minors(1)) {
		t.Errorf("task 0 entry %+v %v", p, ok)
	}
	// The user set CUDA_VISIBLE_DEVICES to GPUs the step does not hold:
	// dropped, the task gets none of them.
	if r := v.bind(p1, 7, 0, 1, str("2,3")); r.Error != "" || len(r.Gpus) != 0 {
		t.Fatalf("bind task 1 to GPUs outside the step: %q %v", r.Error, gpusOf(r))
	}
	if p, ok := v.entry(task1); !ok || len(p.GPUMinors) != 0 {
		t.Errorf("task 1 entry %+v %v, want no GPU", p, ok)
	}
	// Junk keeps the step's list: no entry of its own.
	p2 := v.proc(filepath.Join(stepDir(7, 0), "user/task_2"))
	if r := v.bind(p2, 7, 0, 2, str("GPU-0bad")); r.Error != "" || !reflect.DeepEqual(gpusOf(r), []int{0, 1}) {
		t.Errorf("junk binding: %q %v", r.Error, gpusOf(r))
	}
	if _, ok := v.entry(filepath.Join(stepDir(7, 0), "user/task_2")); ok {
		t.Error("a task keeping its step's list got an entry")
	}
	if s, _ := v.reg.Step(7, 0); len(s.Tasks) != 2 {
		t.Errorf("recorded tasks %+v", s.Tasks)
	}
	// The step ends: its tasks' entries go with it.
	v.do(peer.Peer{}, &pb.Request{Msg: &pb.Request_StepEnd{StepEnd: &pb.StepEnd{JobId: 7, StepId: 0}}})
	for _, d := range []string{task0, task1} {
		if _, ok := v.entry(d); ok {
			t.Errorf("%s keeps its entry after the step ended", d)
		}
	}
}

// Binding requests that cannot be trusted are refused: the agent keeps one
// list per step, the step is not registered, it is a whole-job step, the
// caller is not a task of it, or the step's cgroup was made again.
func TestTaskBindRefused(t *testing.T) {
	v := newEnv(t, func(v *env) { v.h.TaskBinding = true })
	v.prolog(7, 1000, str("0,1"))
	v.mustStart(7, 0, 1000, str("0,1"))
	v.mustStart(7, policy.ExternStep, 1000, nil)
	v.mustStart(7, 1, 1000, str("0"))
	task := v.proc(filepath.Join(stepDir(7, 0), "user/task_0"))
	for _, tc := range []struct {
		name string
		p    peer.Peer
		step uint32
		want string
	}{
		{"unregistered", task, 5, "not registered"},
		{"whole-job step", v.proc(filepath.Join(stepDir(7, policy.ExternStep), "user/task_0")), policy.ExternStep, "not bound one by one"},
		{"another step's task", v.proc(filepath.Join(stepDir(7, 1), "user/task_0")), 0, "not inside the step's cgroup"},
		{"slurmstepd, not a task", v.stepd(7, 0), 0, "not a task of the step"},
		{"gone", peer.Peer{PID: 99999}, 0, "cannot place the task"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r := v.bind(tc.p, 7, tc.step, 0, str("0")); !strings.Contains(r.Error, tc.want) {
				t.Errorf("error %q, want %q", r.Error, tc.want)
			}
		})
	}
	v.n.Recreate(stepDir(7, 0))
	task = v.proc(filepath.Join(stepDir(7, 0), "user/task_0"))
	if r := v.bind(task, 7, 0, 0, str("0")); !strings.Contains(r.Error, "no longer the one registered") {
		t.Errorf("bind under a recreated step cgroup: %q", r.Error)
	}
	v.h.TaskBinding = false
	if r := v.bind(task, 7, 0, 0, str("0")); !strings.Contains(r.Error, "task_binding: step") {
		t.Errorf("bind with task_binding: step: %q", r.Error)
	}
}

// Tasks that share task_special (Slurm made no per-task cgroup) keep their
// step's list; said once per step in the log.
func TestTaskBindTaskSpecial(t *testing.T) {
	v := newEnv(t, func(v *env) { v.h.TaskBinding = true })
	v.prolog(7, 1000, str("0,1"))
	v.mustStart(7, 0, 1000, str("0,1"))
	sp := filepath.Join(stepDir(7, 0), "user/task_special")
	for i := range 3 {
		if r := v.bind(v.proc(sp), 7, 0, uint32(i), str("1")); r.Error != "" || !reflect.DeepEqual(gpusOf(r), []int{0, 1}) {
			t.Fatalf("task_special: %q %v", r.Error, gpusOf(r))
		}
	}
	if n := strings.Count(v.logs.String(), "task keeps its step's GPUs: "); n != 1 {
		t.Errorf("logged %d times", n)
	}
	if _, ok := v.entry(sp); ok {
		t.Error("task_special got an entry")
	}
}

// A step's list changes (registered again with other GPUs): its tasks'
// entries, narrowed within the old list, go.
func TestStepRestartReleasesTasks(t *testing.T) {
	v := newEnv(t, func(v *env) { v.h.TaskBinding = true })
	v.prolog(7, 1000, str("0,1"))
	p := v.stepd(7, 0)
	v.start(p, 7, 0, 1000, str("0,1"))
	task := filepath.Join(stepDir(7, 0), "user/task_0")
	v.bind(v.proc(task), 7, 0, 0, str("1"))
	if _, ok := v.entry(task); !ok {
		t.Fatal("no task entry")
	}
	if r := v.start(p, 7, 0, 1000, str("0")); r.Error != "" {
		t.Fatal(r.Error)
	}
	if _, ok := v.entry(task); ok {
		t.Error("the task keeps an entry narrowed within the step's old list")
	}
}

// IMEX: a GPU step learns its channel from slurmstepd's own namespace;
// only the registered step's cgroup may ask, and a step with no GPU gets
// none.
func TestStepChannel(t *testing.T) {
	v := newEnv(t, func(v *env) {
		v.h.IMEXMajor, v.h.IMEXFromSlurm, v.h.IMEX = 500, true, imexIn{ch: []uint32{3}}
	})
	v.prolog(7, 1000, str("0"))
	p := v.stepd(7, 0)
	if r := v.start(p, 7, 0, 1000, str("0")); !r.ImexPending {
		t.Fatal("a GPU step is not told to ask for its channel")
	}
	ch := func(p peer.Peer, step uint32) *pb.Response {
		return v.do(p, &pb.Request{Msg: &pb.Request_StepChannel{StepChannel: &pb.StepChannel{JobId: 7, StepId: step}}})
	}
	r := ch(p, 0)
	if r.Error != "" || r.ImexChannel == nil || *r.ImexChannel != 3 {
		t.Fatalf("channel: %q %v", r.Error, r.ImexChannel)
	}
	if pol, _ := v.entry(stepDir(7, 0)); !reflect.DeepEqual(pol.IMEXChannels, []uint32{3}) || !same(pol.GPUMinors, minors(0)) {
		t.Errorf("entry %+v", pol)
	}
	if s, _ := v.reg.Step(7, 0); !reflect.DeepEqual(s.IMEXChannels, []uint32{3}) {
		t.Errorf("record %+v", s)
	}
	// Registered again on the same cgroup: the channel learned stays.
	if r := v.start(p, 7, 0, 1000, str("")); r.Error != "" {
		t.Fatal(r.Error)
	}
	if r := v.start(p, 7, 0, 1000, str("0")); r.Error != "" {
		t.Fatal(r.Error)
	}
	v.mustStart(7, 1, 1000, str(""))
	for _, tc := range []struct {
		name string
		p    peer.Peer
		step uint32
		want string
	}{
		{"unregistered", p, 4, "not registered"},
		{"another cgroup", v.stepd(7, 1), 0, "not in the step's cgroup"},
		{"gone", peer.Peer{PID: 99999}, 0, "cannot place the caller"},
	} {
		if r := ch(tc.p, tc.step); !strings.Contains(r.Error, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, r.Error, tc.want)
		}
	}
	if r := ch(v.stepd(7, 1), 1); r.Error != "" || r.ImexChannel != nil {
		t.Errorf("CPU-only step: %q %v", r.Error, r.ImexChannel)
	}
	v.h.IMEX = imexIn{err: imexchan.ErrNoMount}
	if r := ch(p, 0); r.Error != "" || r.ImexChannel != nil {
		t.Errorf("no channel made by Slurm: %q %v", r.Error, r.ImexChannel)
	}
	v.h.IMEX = imexIn{err: errors.New("two channel nodes")}
	if r := ch(p, 0); !strings.Contains(r.Error, "two channel nodes") {
		t.Errorf("unreadable namespace: %q", r.Error)
	}
	v.h.IMEX = imexIn{ch: []uint32{3, 4}}
	if r := ch(p, 0); r.Error == "" {
		t.Error("two channels accepted")
	}
	v.h.IMEXFromSlurm = false
	if r := ch(p, 0); !strings.Contains(r.Error, "does not take channels") {
		t.Errorf("imex off: %q", r.Error)
	}
}

// An adopted job slurmctld has not confirmed (audit-only): its steps get
// what they ask for, audited not enforced, until adopt_unconfirmed_max;
// then no GPU. Whoever the owner turns out to be, the list is slurmctld's.
func TestUnconfirmedAuditOnly(t *testing.T) {
	v := newEnv(t)
	v.ctld.err = &slurm.UnreachableError{Msg: "down"}
	v.reg.Adopt(registry.Job{ID: 7, UID: UnknownUID, Unconfirmed: registry.UnconfirmedAuditOnly, Adopted: "slurmctld down", Created: time.Now()}, nil)
	r := v.mustStart(7, 0, 1000, str("1,9"))
	if !reflect.DeepEqual(gpusOf(r), []int{1}) || r.TaskBind {
		t.Fatalf("audit-only step: %v task-bind %v", gpusOf(r), r.TaskBind)
	}
	if p, _ := v.entry(stepDir(7, 0)); !p.AuditOnly || !same(p.GPUMinors, minors(1)) {
		t.Errorf("entry %+v, want audit-only with GPU 1", p)
	}
	if got := v.rec.Records(audit.EventPolicyApplied); got[0].PolicyMode != audit.ModeAuditOnly {
		t.Errorf("record mode %q", got[0].PolicyMode)
	}
	v.h.UnconfirmedMax = time.Nanosecond
	v.h.RetryUnconfirmed()
	if p, _ := v.entry(stepDir(7, 0)); p.AuditOnly || len(p.GPUMinors) != 0 {
		t.Errorf("entry after adopt_unconfirmed_max %+v, want no GPU, enforced", p)
	}
	if r := v.start(v.stepd(7, 1), 7, 1, 1000, str("1")); !strings.Contains(r.Error, "running when the gpufence agent started") {
		t.Errorf("GPU step of a denied job: %q", r.Error)
	}
	if got := v.rec.Records(audit.EventJobAdopted); len(got) != 1 || got[0].Severity != audit.SeverityError {
		t.Errorf("deny audit %+v", got)
	}
}

// slurmctld answers later: a confirmation holds the steps to its list, an
// unknown job is released, an ambiguous answer denies, an outage waits.
func TestRetryUnconfirmed(t *testing.T) {
	adopt := func(v *env) {
		v.reg.Adopt(registry.Job{ID: 7, UID: 1000, Unconfirmed: registry.UnconfirmedAuditOnly, Created: time.Now()},
			[]registry.Step{{JobID: 7, StepID: 0, UID: 1000, GPUs: []int{0, 1, 2, 3}, Adopted: true, AuditOnly: true,
				Cgroup: cgroup.Cgroup{ID: v.n.Mkdir(stepDir(7, 0)), Path: stepDir(7, 0)}}})
		v.mustStart(7, policy.ExternStep, 1000, nil) // attaches the filter
	}
	for _, tc := range []struct {
		name   string
		answer func(*ctld)
		check  func(*testing.T, *env)
	}{
		{"confirmed", func(c *ctld) {
			c.jobs[7] = slurm.ControllerJob{ID: 7, UID: 1000, State: "RUNNING", OnNode: true, GPUs: []int{2}, Source: "squeue"}
		}, func(t *testing.T, v *env) {
			if p, _ := v.entry(stepDir(7, 0)); p.AuditOnly || !same(p.GPUMinors, minors(2)) {
				t.Errorf("adopted step after confirmation %+v, want GPU 2 enforced", p)
			}
			if j, _ := v.reg.Job(7); j.Unconfirmed != "" || !reflect.DeepEqual(j.GPUs, []int{2}) {
				t.Errorf("job %+v", j)
			}
		}},
		{"confirmed with a GPU the table lacks", func(c *ctld) {
			c.jobs[7] = slurm.ControllerJob{ID: 7, UID: 1000, State: "RUNNING", OnNode: true, GPUs: []int{7}, Source: "squeue"}
		}, func(t *testing.T, v *env) {
			if p, _ := v.entry(stepDir(7, 0)); len(p.GPUMinors) != 0 {
				t.Errorf("entry %+v, want no GPU", p)
			}
		}},
		{"unknown", func(c *ctld) {}, func(t *testing.T, v *env) {
			if _, ok := v.reg.Job(7); ok {
				t.Error("a job slurmctld does not know is kept")
			}
		}},
		{"ambiguous", func(c *ctld) { c.err = &slurm.AmbiguousError{Reason: "forged line"} }, func(t *testing.T, v *env) {
			if j, _ := v.reg.Job(7); j.Unconfirmed != registry.UnconfirmedDeny {
				t.Errorf("job %+v, want denied", j)
			}
			if p, _ := v.entry(stepDir(7, 0)); p.AuditOnly || len(p.GPUMinors) != 0 {
				t.Errorf("entry %+v", p)
			}
		}},
		{"unreachable", func(c *ctld) { c.err = &slurm.UnreachableError{Msg: "down"} }, func(t *testing.T, v *env) {
			if j, _ := v.reg.Job(7); j.Unconfirmed != registry.UnconfirmedAuditOnly {
				t.Errorf("an outage changed the job: %+v", j)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t)
			v.ctld.err = &slurm.UnreachableError{Msg: "down"}
			adopt(v)
			v.ctld.err = nil
			tc.answer(v.ctld)
			v.h.Recovery.Forget(7)
			v.h.RetryUnconfirmed()
			tc.check(t, v)
		})
	}
}

// gpufence verify: only a root-owned gpufence-verify-<pid>/given below the
// live scope gets one GPU, and VerifyEnd takes it back and audits.
func TestVerify(t *testing.T) {
	v := newEnv(t)
	if err := v.enf.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	vdir := filepath.Join(scope, "gpufence-verify-4242")
	given := filepath.Join(vdir, verifycgroup.Given)
	p := v.proc(given)
	start := func(p peer.Peer, gpu *uint32) *pb.Response {
		return v.do(p, &pb.Request{Msg: &pb.Request_VerifyStart{VerifyStart: &pb.VerifyStart{Gpu: gpu}}})
	}
	r := start(p, nil)
	if r.Error != "" || r.Verify == nil || r.Verify.Gpu != 0 || len(r.Verify.Gpus) != 4 || r.Verify.PolicyMode != audit.ModeEnforce {
		t.Fatalf("verify start: %q %+v", r.Error, r.Verify)
	}
	id, _ := v.n.ID(given)
	if pol, ok := v.filter().Entry(id); !ok || !same(pol.GPUMinors, minors(0)) {
		t.Errorf("verify entry %+v %v", pol, ok)
	}
	if v.h.VerifyRegistered() != 1 {
		t.Errorf("registered %d", v.h.VerifyRegistered())
	}
	if r := start(p, nil); !strings.Contains(r.Error, "already registered") {
		t.Errorf("twice: %q", r.Error)
	}
	gpu := uint32(9)
	userDir := filepath.Join(scope, "gpufence-verify-77")
	v.n.MkdirOwned(filepath.Join(userDir, verifycgroup.Given), 1000)
	v.mustStart(8, 0, 1000, nil) // a step's own cgroup
	for _, tc := range []struct {
		name string
		p    peer.Peer
		gpu  *uint32
		want string
	}{
		{"unknown GPU", v.proc(filepath.Join(scope, "gpufence-verify-4243", verifycgroup.Given)), &gpu, "not in this node's GPU table"},
		{"a job's cgroup", v.stepd(7, 0), nil, "not a gpufence verify cgroup"},
		{"bare leaf", v.proc(filepath.Join(vdir, verifycgroup.Bare)), nil, "not a gpufence verify cgroup"},
		{"leading zero", v.proc(filepath.Join(scope, "gpufence-verify-0123", verifycgroup.Given)), nil, "not a gpufence verify cgroup"},
		{"a user's", v.proc(filepath.Join(userDir, verifycgroup.Given)), nil, "not root's"},
		{"gone", peer.Peer{PID: 99999}, nil, "cannot read the cgroup"},
	} {
		if r := start(tc.p, tc.gpu); !strings.Contains(r.Error, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, r.Error, tc.want)
		}
	}
	end := func(id uint64, failed ...string) *pb.Response {
		return v.do(peer.Peer{}, &pb.Request{Msg: &pb.Request_VerifyEnd{VerifyEnd: &pb.VerifyEnd{CgroupId: id, Failed: failed, ElapsedUs: 1500}}})
	}
	r = end(id)
	if r.Error != "" || r.Verify.EntriesLeft != 0 {
		t.Fatalf("verify end: %q %+v", r.Error, r.Verify)
	}
	if _, ok := v.filter().Entry(id); ok {
		t.Error("verify entry left")
	}
	if r := end(id); !strings.Contains(r.Error, "not a verify cgroup") {
		t.Errorf("end twice: %q", r.Error)
	}
	v.n.Recreate(given)
	r = start(v.proc(given), nil)
	nid := r.GetVerify().GetCgroupId()
	if r := end(nid, "GPU 1 opened"); r.Error != "" {
		t.Fatal(r.Error)
	}
	got := v.rec.Records(audit.EventVerify)
	if len(got) != 2 || got[0].Severity != audit.SeverityInfo || got[1].Severity != audit.SeverityError || !strings.Contains(got[1].Error, "GPU 1 opened") {
		t.Errorf("verify audits %+v", got)
	}
}

// Verify refuses when the table gives no GPU out, and bounds how many
// self-tests run at once; one whose cgroup went is forgotten.
func TestVerifyLimits(t *testing.T) {
	v := newEnv(t)
	if err := v.enf.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	start := func(pid int) *pb.Response {
		return v.do(v.proc(filepath.Join(scope, fmt.Sprintf("gpufence-verify-%d", pid), verifycgroup.Given)), &pb.Request{Msg: &pb.Request_VerifyStart{VerifyStart: &pb.VerifyStart{}}})
	}
	for i := range maxVerify {
		if r := start(1000 + i); r.Error != "" {
			t.Fatal(r.Error)
		}
	}
	if r := start(2000); !strings.Contains(r.Error, "running already") {
		t.Errorf("one more than the bound: %q", r.Error)
	}
	v.n.Rmdir(filepath.Join(scope, "gpufence-verify-1000"))
	if r := start(2001); r.Error != "" {
		t.Errorf("after one verify cgroup went: %q", r.Error)
	}
	v.h.Table = table{untrusted: "mismatch"}
	if r := start(3000); !strings.Contains(r.Error, "not trusted") {
		t.Errorf("untrusted table: %q", r.Error)
	}
	v = newEnv(t)
	v.n.SetScope("", nil)
	if r := start(3001); !strings.Contains(r.Error, "does not exist") {
		t.Errorf("no scope: %q", r.Error)
	}
}

func TestIsVerifyDir(t *testing.T) {
	for name, want := range map[string]bool{
		"gpufence-verify-1": true, "gpufence-verify-4242": true,
		"gpufence-verify-": false, "gpufence-verify-01": false, "gpufence-verify-1a": false,
		"gpufence-verify-99999999999": false, "job_1": false, "gpufence-verify--1": false,
	} {
		if verifycgroup.IsDir(name) != want {
			t.Errorf("verifycgroup.IsDir(%q) = %v", name, !want)
		}
	}
}
