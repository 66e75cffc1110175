// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/fakenode"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/agent/store"
)

var _ Store = (*fakenode.Store)(nil)
var _ Store = (*store.Store)(nil)

func newReg(t *testing.T) (*Registry, *fakenode.Store, *bytes.Buffer) {
	t.Helper()
	st := fakenode.NewStore()
	var logs bytes.Buffer
	return New(st, slog.New(slog.NewTextHandler(&logs, nil))), st, &logs
}

func cg(id uint64) cgroup.Cgroup {
	return cgroup.Cgroup{ID: id, Path: "/sys/fs/cgroup/s/job_1/step_" + string(rune('0'+id%10))}
}

// A prolog record goes to the store before it is visible; a requeued job's
// second prolog keeps its live steps; a step of a job with no record makes
// a placeholder that carries no list.
func TestPrologStepAndPlaceholder(t *testing.T) {
	r, st, _ := newReg(t)
	r.Prolog(Job{ID: 1, UID: 1000, GPUs: []int{0, 2}, Created: time.Unix(5, 0)})
	if sj, _ := st.Jobs(); len(sj) != 1 || sj[0].ID != 1 || !reflect.DeepEqual(sj[0].GPUs, []int{0, 2}) || sj[0].Flags != 0 {
		t.Fatalf("store after prolog: %+v", sj)
	}
	if placeholder := r.AddStep(Step{JobID: 1, StepID: 0, UID: 1000, Cgroup: cg(11), GPUs: []int{0}}, "/j1"); placeholder {
		t.Fatal("a step of a recorded job made a placeholder")
	}
	r.Prolog(Job{ID: 1, UID: 1000, GPUs: []int{0, 2}})
	if s, ok := r.Step(1, 0); !ok || s.Cgroup.ID != 11 {
		t.Fatalf("requeue prolog lost the live step: %+v %v", s, ok)
	}
	if j, _ := r.Job(1); j.Dir != "/j1" {
		t.Errorf("requeue prolog lost the job dir: %q", j.Dir)
	}
	if !r.AddStep(Step{JobID: 9, StepID: 0, UID: 1001, Cgroup: cg(19)}, "/j9") {
		t.Fatal("no placeholder for a job without prolog")
	}
	j, ok := r.Job(9)
	if !ok || !j.NoProlog || len(j.GPUs) != 0 {
		t.Fatalf("placeholder: %+v", j)
	}
	if sj, _ := st.Jobs(); len(sj) != 2 || sj[1].Flags&store.FlagNoProlog == 0 {
		t.Errorf("placeholder not stored as such: %+v", sj)
	}
	// slurmctld's answer replaces the placeholder, keeps its step; a
	// second answer does not replace a trusted list.
	if !r.Recovered(Job{ID: 9, UID: 1001, GPUs: []int{1}, Recovered: "squeue"}) {
		t.Fatal("recovered list did not replace a placeholder")
	}
	if len(r.StepsOf(9)) != 1 {
		t.Errorf("recovered job lost its placeholder's step")
	}
	if r.Recovered(Job{ID: 9, UID: 1001, GPUs: []int{0, 1, 2}}) || r.Recovered(Job{ID: 1, GPUs: []int{3}}) {
		t.Error("a recovered list replaced a trusted one")
	}
	if j, _ := r.Job(1); !reflect.DeepEqual(j.GPUs, []int{0, 2}) {
		t.Errorf("prolog list changed: %v", j.GPUs)
	}
	c := r.Counts()
	if c.Jobs != 2 || c.Steps != 2 {
		t.Errorf("counts %+v", c)
	}
}

// A step registered again on a recreated cgroup (same path, new id) drops
// the old id's attribution and its stored record: an entry the kernel may
// still hold under the old id never names this step.
func TestStepOnRecreatedCgroup(t *testing.T) {
	r, st, _ := newReg(t)
	r.Prolog(Job{ID: 1, UID: 1000, GPUs: []int{0}})
	old := cgroup.Cgroup{ID: 100, Path: "/s/job_1/step_0"}
	r.AddStep(Step{JobID: 1, StepID: 0, UID: 1000, Cgroup: old, GPUs: []int{0}}, "/s/job_1")
	if _, ok := r.AddTask(1, 0, 100, cgroup.Cgroup{ID: 101, Path: old.Path + "/user/task_0"}, []int{0}); !ok {
		t.Fatal("AddTask on the registered cgroup refused")
	}
	if _, ok := r.AddTask(1, 0, 999, cgroup.Cgroup{ID: 102}, nil); ok {
		t.Error("AddTask on another cgroup than the step's accepted")
	}
	nu := cgroup.Cgroup{ID: 200, Path: old.Path}
	r.AddStep(Step{JobID: 1, StepID: 0, UID: 1000, Cgroup: nu, GPUs: []int{0}}, "/s/job_1")
	if r.Owned(100) || r.Owned(101) {
		t.Error("the old cgroup or its task still owned after the step moved")
	}
	if o, ok := r.View().Owner(200); !ok || o.JobID != 1 {
		t.Errorf("view of the new cgroup: %+v %v", o, ok)
	}
	ss, _ := st.Steps()
	if len(ss) != 1 || ss[0].CgroupID != 200 {
		t.Errorf("stored steps %+v, want only cgroup 200", ss)
	}
	if s, ok := r.RemoveCgroup(100); ok {
		t.Errorf("removing the old cgroup id removed %+v", s)
	}
	if _, ok := r.RemoveCgroup(200); !ok {
		t.Error("removing the step's cgroup did nothing")
	}
	if j, _ := r.Job(1); j.Stepless.IsZero() {
		t.Error("a job with no step left is not marked stepless")
	}
	if ss, _ := st.Steps(); len(ss) != 0 {
		t.Errorf("stored steps left: %+v", ss)
	}
}

// Adopted jobs: Confirm narrows the steps to slurmctld's list (an adopted
// step to the whole list, a later one within it); Deny takes every GPU;
// neither touches a job that is not unconfirmed.
func TestAdoptConfirmDeny(t *testing.T) {
	r, st, _ := newReg(t)
	steps := []Step{
		{JobID: 5, StepID: 0, UID: 1000, Cgroup: cgroup.Cgroup{ID: 50}, GPUs: []int{0, 1, 2, 3}, Adopted: true, AuditOnly: true},
	}
	if !r.Adopt(Job{ID: 5, UID: 1000, Unconfirmed: UnconfirmedAuditOnly, Adopted: "not confirmed"}, steps) {
		t.Fatal("Adopt refused")
	}
	if r.Adopt(Job{ID: 5}, nil) {
		t.Error("Adopt over a record")
	}
	if !r.Adopt(Job{ID: 6, UID: 1000, Unconfirmed: UnconfirmedDeny}, nil) {
		t.Fatal("Adopt of a job with no step refused")
	}
	if j, _ := r.Job(6); j.Stepless.IsZero() {
		t.Error("an adopted job with no step is not stepless")
	}
	r.AddStep(Step{JobID: 5, StepID: 1, UID: 1000, Cgroup: cgroup.Cgroup{ID: 51}, GPUs: []int{2, 3}, AuditOnly: true}, "")
	got, ok := r.Confirm(Job{ID: 5, UID: 1000, GPUs: []int{1, 2}, Recovered: "squeue"})
	if !ok || len(got) != 2 {
		t.Fatalf("Confirm: %v %+v", ok, got)
	}
	for _, s := range r.StepsOf(5) {
		want := []int{2}
		if s.Adopted {
			want = []int{1, 2}
		}
		if !reflect.DeepEqual(s.GPUs, want) || s.AuditOnly {
			t.Errorf("step %d after Confirm: GPUs %v audit-only %v, want %v enforced", s.StepID, s.GPUs, s.AuditOnly, want)
		}
	}
	if j, _ := r.Job(5); j.Unconfirmed != "" {
		t.Errorf("confirmed job still unconfirmed %q", j.Unconfirmed)
	}
	if _, ok := r.Confirm(Job{ID: 5, GPUs: []int{0, 1, 2, 3}}); ok {
		t.Error("Confirm of a confirmed job")
	}
	if _, ok := r.Deny(5, "x"); ok {
		t.Error("Deny of a confirmed job")
	}
	r.AddStep(Step{JobID: 6, StepID: 0, UID: 1000, Cgroup: cgroup.Cgroup{ID: 60}, GPUs: []int{0}}, "")
	denied, ok := r.Deny(6, "ambiguous")
	if !ok || len(denied) != 1 || len(denied[0].GPUs) != 0 {
		t.Fatalf("Deny: %v %+v", ok, denied)
	}
	if sj, _ := st.Jobs(); sj[1].Flags&store.FlagUnconfirmedDeny == 0 {
		t.Errorf("denied job stored with flags %#x", sj[1].Flags)
	}
}

// SetIMEX records one channel on the registered cgroup only; the store's
// limit (one channel below 1<<20) is an error, not a truncation.
func TestSetIMEX(t *testing.T) {
	r, st, _ := newReg(t)
	r.AddStep(Step{JobID: 1, StepID: 0, UID: 1, Cgroup: cgroup.Cgroup{ID: 10}, GPUs: []int{0}}, "")
	if _, ok, err := r.SetIMEX(1, 0, 11, []uint32{3}); ok || err != nil {
		t.Errorf("SetIMEX on another cgroup: %v %v", ok, err)
	}
	if _, ok, err := r.SetIMEX(1, 0, 10, []uint32{3, 4}); ok || err == nil {
		t.Errorf("SetIMEX of two channels: %v %v", ok, err)
	}
	s, ok, err := r.SetIMEX(1, 0, 10, []uint32{3})
	if !ok || err != nil || !reflect.DeepEqual(s.IMEXChannels, []uint32{3}) {
		t.Fatalf("SetIMEX: %+v %v %v", s, ok, err)
	}
	if ss, _ := st.Steps(); !reflect.DeepEqual(store.IMEXChannels(ss[0].Flags), []uint32{3}) {
		t.Errorf("stored channel %v", store.IMEXChannels(ss[0].Flags))
	}
}

// DropJob forgets the job and every step; DropIf only a job that is still
// as it was read, with no step.
func TestDrop(t *testing.T) {
	r, st, _ := newReg(t)
	r.Prolog(Job{ID: 1, UID: 1, Created: time.Unix(1, 0)})
	r.AddStep(Step{JobID: 1, StepID: 0, Cgroup: cgroup.Cgroup{ID: 10}}, "")
	r.AddStep(Step{JobID: 1, StepID: 1, Cgroup: cgroup.Cgroup{ID: 11}}, "")
	was, _ := r.Job(1)
	if r.DropIf(1, was) {
		t.Fatal("DropIf dropped a job with steps")
	}
	if s, ok := r.RemoveStep(1, 0); !ok || s.Cgroup.ID != 10 {
		t.Fatalf("RemoveStep: %+v %v", s, ok)
	}
	if _, ok := r.RemoveStep(1, 0); ok {
		t.Error("RemoveStep twice")
	}
	if got := r.DropJob(1); len(got) != 1 || got[0].Cgroup.ID != 11 {
		t.Fatalf("DropJob returned %+v", got)
	}
	if r.DropJob(1) != nil {
		t.Error("DropJob of an unknown job returned steps")
	}
	if sj, _ := st.Jobs(); len(sj) != 0 {
		t.Errorf("stored jobs left %+v", sj)
	}
	r.Prolog(Job{ID: 2, UID: 1, Created: time.Unix(1, 0)})
	was, _ = r.Job(2)
	r.Prolog(Job{ID: 2, UID: 1, Created: time.Unix(2, 0)}) // a prolog came meanwhile
	if r.DropIf(2, was) {
		t.Error("DropIf dropped a job replaced since it was read")
	}
	now, _ := r.Job(2)
	r.SetCheck(2, time.Unix(9, 0), time.Minute)
	if j, _ := r.Job(2); !j.NextCheck.Equal(time.Unix(9, 0)) || j.CheckEvery != time.Minute {
		t.Errorf("SetCheck: %+v", j)
	}
	if !r.DropIf(2, now) {
		t.Error("DropIf kept a job as it was read")
	}
}

// Exempt cgroups are owners for attribution but no step: RemoveCgroup
// leaves them.
func TestExempt(t *testing.T) {
	r, _, _ := newReg(t)
	r.SetExempt("system", cgroup.Cgroup{ID: 7, Path: "/s/system"})
	if o, ok := r.View().Owner(7); !ok || o.Exempt != "system" {
		t.Fatalf("exempt owner %+v %v", o, ok)
	}
	if _, ok := r.RemoveCgroup(7); ok {
		t.Error("RemoveCgroup removed an exempt cgroup")
	}
	r.SetExempt("system", cgroup.Cgroup{ID: 8, Path: "/s/system"})
	if r.Owned(7) || !r.Owned(8) || r.Exempts()["system"].ID != 8 {
		t.Errorf("exempt made again: owned 7 %v 8 %v, %+v", r.Owned(7), r.Owned(8), r.Exempts())
	}
	r.SetExempt("system", cgroup.Cgroup{})
	if len(r.Exempts()) != 0 || r.Counts().Exempt != 0 {
		t.Errorf("exempt forgotten: %+v", r.Exempts())
	}
	var nilView *View
	if _, ok := nilView.Owner(1); ok {
		t.Error("nil view owns something")
	}
}

// The observer sees every change of the jobs; Changed wakes the writer.
func TestObserverAndChanged(t *testing.T) {
	r, _, _ := newReg(t)
	var seen [][]Job
	r.SetObserver(func(js []Job) { seen = append(seen, js) })
	r.Prolog(Job{ID: 3, GPUs: []int{1}})
	r.Prolog(Job{ID: 2})
	if len(seen) != 3 || len(seen[2]) != 2 || seen[2][0].ID != 2 {
		t.Fatalf("observer saw %+v", seen)
	}
	select {
	case <-r.Changed():
	default:
		t.Error("no change signalled")
	}
	if r.Busy() {
		t.Error("registry busy with no call running")
	}
}

// What one agent wrote to the store, the next takes back: flags (broken,
// recovered, no prolog, unconfirmed), steps with their cgroup, audit-only,
// adopted and IMEX channel. A step whose job record is lost gets a
// placeholder; a store that cannot be read restores nothing and says so.
func TestReloadFromStore(t *testing.T) {
	r, st, _ := newReg(t)
	r.Prolog(Job{ID: 1, UID: 1000, GPUs: []int{0, 1}, Created: time.Unix(0, 42)})
	r.Prolog(Job{ID: 2, UID: 1000, Broken: "bad list"})
	r.Recovered(Job{ID: 3, UID: 1001, GPUs: []int{2}, Recovered: "squeue"})
	r.Adopt(Job{ID: 4, UID: 1002, Unconfirmed: UnconfirmedAuditOnly}, nil)
	r.Adopt(Job{ID: 5, UID: 1002, Unconfirmed: UnconfirmedDeny}, nil)
	r.AddStep(Step{JobID: 1, StepID: 0, UID: 1000, Cgroup: cgroup.Cgroup{ID: 10, Path: "/s/job_1/step_0"}, GPUs: []int{1}}, "")
	r.AddStep(Step{JobID: 4, StepID: 0, UID: 1002, Cgroup: cgroup.Cgroup{ID: 40, Path: "/s/job_4/step_0"}, GPUs: []int{0}, AuditOnly: true, Adopted: true}, "")
	r.SetIMEX(1, 0, 10, []uint32{5})
	r.AddStep(Step{JobID: 8, StepID: 2, UID: 1003, Cgroup: cgroup.Cgroup{ID: 80, Path: "/s/job_8/step_2"}}, "")
	st.DeleteJob(8) // the job record lost, its step kept

	r2 := New(st, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	steps, from := r2.Reload(true, "")
	if from != "the pinned store" || len(steps) != 3 {
		t.Fatalf("Reload: %d steps from %q", len(steps), from)
	}
	j1, _ := r2.Job(1)
	if !reflect.DeepEqual(j1.GPUs, []int{0, 1}) || j1.UID != 1000 || !j1.Created.Equal(time.Unix(0, 42)) {
		t.Errorf("job 1 back as %+v", j1)
	}
	if j, _ := r2.Job(2); !strings.Contains(j.Broken, "unusable") {
		t.Errorf("broken job back as %+v", j)
	}
	if j, _ := r2.Job(3); j.Recovered == "" {
		t.Errorf("recovered job back as %+v", j)
	}
	if j, _ := r2.Job(4); j.Unconfirmed != UnconfirmedAuditOnly || j.Adopted == "" {
		t.Errorf("audit-only unconfirmed job back as %+v", j)
	}
	if j, _ := r2.Job(5); j.Unconfirmed != UnconfirmedDeny {
		t.Errorf("denied unconfirmed job back as %+v", j)
	}
	if j, ok := r2.Job(8); !ok || !j.NoProlog {
		t.Errorf("a step whose job record was lost: job %+v %v, want a placeholder", j, ok)
	}
	s1, _ := r2.Step(1, 0)
	if s1.Cgroup.Path != "/s/job_1/step_0" || !reflect.DeepEqual(s1.IMEXChannels, []uint32{5}) {
		t.Errorf("step 1.0 back as %+v", s1)
	}
	if s4, _ := r2.Step(4, 0); !s4.AuditOnly || !s4.Adopted {
		t.Errorf("step 4.0 back as %+v", s4)
	}
	if o, ok := r2.View().Owner(40); !ok || o.JobID != 4 {
		t.Errorf("restored step not attributed: %+v", o)
	}

	var logs bytes.Buffer
	st.Fail = errors.New("map gone")
	r3 := New(st, slog.New(slog.NewTextHandler(&logs, nil)))
	if steps, _ := r3.Reload(true, ""); len(steps) != 0 || len(r3.Jobs()) != 0 {
		t.Errorf("an unreadable store restored %d steps", len(steps))
	}
	if !strings.Contains(logs.String(), "map gone") {
		t.Errorf("unreadable store not logged: %s", logs.String())
	}
}

// An older agent's state file is read when the store is new, and copied
// into it; a damaged unconfirmed mode reads as deny; a damaged file
// restores nothing and is logged.
func TestReloadFromStateFile(t *testing.T) {
	r, _, _ := newReg(t)
	r.Prolog(Job{ID: 1, UID: 1000, GPUs: []int{0}})
	r.AddStep(Step{JobID: 1, StepID: 0, UID: 1000, Cgroup: cgroup.Cgroup{ID: 10, Path: "/s/job_1/step_0"}, GPUs: []int{0}}, "/s/job_1")
	jobs := r.State()
	jobs = append(jobs, statefile.Job{ID: 2, UID: 1001, GPUs: []int{}, Adopted: "x", Unconfirmed: "open-everything"})
	path := filepath.Join(t.TempDir(), "state.json")
	if err := statefile.Write(path, statefile.File{Jobs: jobs}); err != nil {
		t.Fatal(err)
	}
	r2, st2, _ := newReg(t)
	steps, from := r2.Reload(false, path)
	if len(steps) != 1 || from != "the state file "+path {
		t.Fatalf("Reload: %d steps from %q", len(steps), from)
	}
	if j, _ := r2.Job(2); j.Unconfirmed != UnconfirmedDeny {
		t.Errorf("hostile unconfirmed mode read as %q, want deny", j.Unconfirmed)
	}
	if j, _ := r2.Job(1); j.Dir != "/s/job_1" {
		t.Errorf("job dir %q", j.Dir)
	}
	if sj, _ := st2.Jobs(); len(sj) != 2 {
		t.Errorf("state file not copied into the store: %+v", sj)
	}
	if ss, _ := st2.Steps(); len(ss) != 1 || ss[0].Cgroup != "/s/job_1/step_0" {
		t.Errorf("stored steps %+v", ss)
	}
	jobs[1].Unconfirmed = UnconfirmedDeny
	if !reflect.DeepEqual(r2.State(), jobs) {
		t.Errorf("state after reload\n %+v\nwant\n %+v", r2.State(), jobs)
	}

	bad := filepath.Join(t.TempDir(), "state.json")
	os.WriteFile(bad, []byte("{not json"), 0o600)
	var logs bytes.Buffer
	r3 := New(nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if steps, from := r3.Reload(false, bad); len(steps) != 0 || from != "" || len(r3.Jobs()) != 0 {
		t.Errorf("damaged state file restored %d steps from %q", len(steps), from)
	}
	if !strings.Contains(logs.String(), "unreadable") {
		t.Errorf("damaged state file not logged: %s", logs.String())
	}
	if steps, from := r3.Reload(false, filepath.Join(t.TempDir(), "none")); len(steps) != 0 || from != "" {
		t.Errorf("missing state file: %d steps from %q", len(steps), from)
	}
}

// A store write that fails is logged (a crash now would lose the record),
// and the record is still kept in memory.
func TestStoreWriteFails(t *testing.T) {
	r, st, logs := newReg(t)
	st.Fail = errors.New("map full")
	r.Prolog(Job{ID: 1, UID: 1})
	r.AddStep(Step{JobID: 1, StepID: 0, Cgroup: cgroup.Cgroup{ID: 10}}, "")
	r.RemoveStep(1, 0)
	r.DropJob(1)
	for _, want := range []string{"store job record", "store step record", "forget stored step", "forget stored job"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %q in the log:\n%s", want, logs.String())
		}
	}
}
