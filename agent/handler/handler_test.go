// SPDX-License-Identifier: Apache-2.0

package handler

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// Decision -> record -> kernel entry: a step of a job with a prolog gets
// the GPUs it asks for within the job's list, recorded (and stored) before
// its entry is written, keyed by its cgroup's id, audited, watched.
func TestStepStartRecordsAndWritesEntry(t *testing.T) {
	v := newEnv(t)
	v.prolog(7, 1000, str("0,2"))
	r := v.mustStart(7, 0, 1000, str("2"))
	if !reflect.DeepEqual(gpusOf(r), []int{2}) || r.StepCgroup != "/system.slice/n1_slurmstepd.scope/job_7/step_0" {
		t.Fatalf("reply gpus %v cgroup %q", gpusOf(r), r.StepCgroup)
	}
	id, _ := v.n.ID(stepDir(7, 0))
	p, ok := v.filter().Entry(id)
	if !ok || !same(p.GPUMinors, minors(2)) || p.AuditOnly || p.AllowAll {
		t.Fatalf("kernel entry %+v %v, want minor of GPU 2 only", p, ok)
	}
	s, ok := v.reg.Step(7, 0)
	if !ok || s.Cgroup.ID != id || !reflect.DeepEqual(s.GPUs, []int{2}) || s.UID != 1000 {
		t.Fatalf("record %+v %v", s, ok)
	}
	if ss, _ := v.st.Steps(); len(ss) != 1 || ss[0].CgroupID != id {
		t.Errorf("stored steps %+v", ss)
	}
	if j, _ := v.reg.Job(7); j.Dir != filepath.Join(scope, "job_7") {
		t.Errorf("job dir %q", j.Dir)
	}
	if got := v.rec.Records(audit.EventPolicyApplied); len(got) != 1 || got[0].CgroupID != id || !reflect.DeepEqual(got[0].GPUs, []int{2}) || got[0].PolicyMode != audit.ModeEnforce {
		t.Errorf("audit %+v", got)
	}
	if v.w.added[id] != stepDir(7, 0) {
		t.Errorf("step not watched: %v", v.w.added)
	}
	// The extern step holds the job's whole list.
	r = v.mustStart(7, policy.ExternStep, 1000, nil)
	if !reflect.DeepEqual(gpusOf(r), []int{0, 2}) {
		t.Errorf("extern step gpus %v", gpusOf(r))
	}
	if p, _ := v.entry(stepDir(7, policy.ExternStep)); !same(p.GPUMinors, minors(0, 2)) {
		t.Errorf("extern entry %+v", p)
	}
}

// What the step's environment says is the attacker's: GPUs outside the
// job's list stay denied, an unparsable list refuses, a uid other than the
// prolog's refuses, and none of it writes an entry.
func TestStepStartHostileInput(t *testing.T) {
	v := newEnv(t)
	v.prolog(7, 1000, str("1"))
	r := v.mustStart(7, 0, 1000, str("0,1,2,3"))
	if !reflect.DeepEqual(gpusOf(r), []int{1}) {
		t.Errorf("a step asking for every GPU got %v, want only the job's [1]", gpusOf(r))
	}
	if p, _ := v.entry(stepDir(7, 0)); !same(p.GPUMinors, minors(1)) {
		t.Errorf("entry %+v", p)
	}
	if !strings.Contains(v.logs.String(), "outside the job's trusted list") {
		t.Error("the narrowing is not logged")
	}
	for _, tc := range []struct {
		name string
		step uint32
		uid  uint32
		gpus *string
		want string
	}{
		{"junk list", 1, 1000, str("0;rm -rf"), "SLURM_STEP_GPUS"},
		{"another uid", 2, 1001, str("1"), "uid 1001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := v.start(v.stepd(7, tc.step), 7, tc.step, tc.uid, tc.gpus)
			if !strings.Contains(r.Error, tc.want) {
				t.Errorf("error %q, want %q", r.Error, tc.want)
			}
			if _, ok := v.entry(stepDir(7, tc.step)); ok {
				t.Error("a refused step has a kernel entry")
			}
			if _, ok := v.reg.Step(7, tc.step); ok {
				t.Error("a refused step has a record")
			}
		})
	}
}

// A job prolog whose SLURM_JOB_GPUS cannot be used (junk, or a GPU the
// table lacks) is recorded broken: every GPU step is refused with why.
func TestBrokenProlog(t *testing.T) {
	for _, tc := range []struct{ gpus, want string }{
		{"0,x", "SLURM_JOB_GPUS"},
		{"9", "not in this node's GPU table"},
	} {
		v := newEnv(t)
		v.prolog(7, 1000, str(tc.gpus))
		r := v.start(v.stepd(7, 0), 7, 0, 1000, str("0"))
		if !strings.Contains(r.Error, tc.want) {
			t.Errorf("prolog %q: step error %q, want %q", tc.gpus, r.Error, tc.want)
		}
		if _, ok := v.entry(stepDir(7, 0)); ok {
			t.Errorf("prolog %q: refused step has an entry", tc.gpus)
		}
	}
}

// The request names a job and step; where the step lives comes from
// slurmstepd's own cgroup: a caller outside Slurm's scope, not in a step,
// or whose task pid is in another step, is refused and audited.
func TestStepStartPlacement(t *testing.T) {
	v := newEnv(t)
	v.prolog(7, 1000, str("0"))
	outside := v.proc(mount + "/user.slice/user-1000.slice/session-1.scope/job_7/step_0")
	jobOnly := v.proc(filepath.Join(scope, "job_7"))
	other := v.stepd(8, 0)
	for _, tc := range []struct {
		name string
		p    peer.Peer
		pids []uint32
		want string
	}{
		{"outside the scope", outside, nil, "not inside Slurm's slurmstepd scope"},
		{"not in a step", jobOnly, nil, "not inside a job step"},
		{"exited", peer.Peer{PID: 99999}, nil, "cannot place slurmstepd"},
		{"task in another step", v.stepd(7, 0), []uint32{uint32(other.PID)}, "not in its step's cgroup"},
		{"task gone", v.stepd(7, 0), []uint32{99998}, "task pid 99998"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(v.rec.Records(audit.EventLookupFailed))
			r := v.start(tc.p, 7, 0, 1000, str("0"), tc.pids...)
			if !strings.Contains(r.Error, tc.want) {
				t.Errorf("error %q, want %q", r.Error, tc.want)
			}
			if got := v.rec.Records(audit.EventLookupFailed); len(got) != before+1 || got[len(got)-1].JobID != 7 {
				t.Errorf("lookup failure audits %+v", got)
			}
		})
	}
	if _, ok := v.reg.Step(7, 0); ok {
		t.Error("a refused step was recorded")
	}
	r := v.start(v.stepd(7, 0), 7, 0, 1000, str("0"), uint32(v.proc(filepath.Join(stepDir(7, 0), "user/task_0")).PID))
	if r.Error != "" {
		t.Errorf("task pid in its own step refused: %s", r.Error)
	}
}

// A job with no prolog record: slurmctld is asked (paced); what it does
// not vouch for gets no GPU, a CPU-only step runs on a placeholder record.
func TestStepStartWithoutProlog(t *testing.T) {
	v := newEnv(t)
	r := v.start(v.stepd(7, 0), 7, 0, 1000, str("0"))
	if !strings.Contains(r.Error, "no trusted GPU list") {
		t.Fatalf("GPU step of an unknown job: %q", r.Error)
	}
	if v.ctld.n != 1 {
		t.Errorf("slurmctld asked %d times", v.ctld.n)
	}
	r = v.start(v.stepd(7, 1), 7, 1, 1000, nil)
	if r.Error != "" || len(r.Gpus) != 0 {
		t.Fatalf("CPU-only step of an unknown job: %q %v", r.Error, r.Gpus)
	}
	if v.ctld.n != 1 {
		t.Errorf("slurmctld asked again within the retry pace: %d", v.ctld.n)
	}
	if p, ok := v.entry(stepDir(7, 1)); !ok || len(p.GPUMinors) != 0 {
		t.Errorf("CPU-only step entry %+v %v, want one with no GPU", p, ok)
	}
	if j, _ := v.reg.Job(7); !j.NoProlog {
		t.Errorf("placeholder %+v", j)
	}
	if len(v.rec.Records(audit.EventJobWithoutProlog)) != 2 {
		t.Errorf("no-prolog audits %+v", v.rec.Records(audit.EventJobWithoutProlog))
	}
}

// Lost state (the agent restarted with no record): slurmctld's answer,
// for the step's own uid, becomes the job's trusted list.
func TestStepStartRecoversFromSlurmctld(t *testing.T) {
	v := newEnv(t)
	v.ctld.jobs[7] = slurm.ControllerJob{ID: 7, UID: 1000, State: "RUNNING", OnNode: true, GPUs: []int{3}, Source: "squeue"}
	v.ctld.jobs[8] = v.ctld.jobs[7]
	r := v.mustStart(7, 0, 1000, str("3"))
	if !reflect.DeepEqual(gpusOf(r), []int{3}) {
		t.Fatalf("recovered step gpus %v", gpusOf(r))
	}
	if j, _ := v.reg.Job(7); j.Recovered != "squeue" || j.NoProlog {
		t.Errorf("recovered record %+v", j)
	}
	// The job is another user's per slurmctld: refused.
	r = v.start(v.stepd(8, 0), 8, 0, 2000, str("3"))
	if r.Error == "" {
		t.Error("a step recovered for another uid got GPUs")
	}
}

// The same StepStart twice writes the entry once; the step made again on a
// new cgroup at the same path (a new id) is registered on the new id, and
// its tasks' entries go.
func TestStepStartDuplicateAndRecreated(t *testing.T) {
	v := newEnv(t)
	v.prolog(7, 1000, str("0,1"))
	p := v.stepd(7, 0)
	v.start(p, 7, 0, 1000, str("0"))
	sets := v.filter().Sets()
	if r := v.start(p, 7, 0, 1000, str("0")); r.Error != "" || v.filter().Sets() != sets {
		t.Fatalf("repeat: %q, %d sets (was %d)", r.Error, v.filter().Sets(), sets)
	}
	if got := v.rec.Records(audit.EventPolicyApplied); len(got) != 1 {
		t.Errorf("a repeated request audited again: %d", len(got))
	}
	old, _ := v.n.ID(stepDir(7, 0))
	nu := v.n.Recreate(stepDir(7, 0))
	v.mustStart(7, 0, 1000, str("1"))
	s, _ := v.reg.Step(7, 0)
	if s.Cgroup.ID != nu || nu == old || !reflect.DeepEqual(s.GPUs, []int{1}) {
		t.Fatalf("record after the cgroup was made again: %+v (old %d new %d)", s, old, nu)
	}
	if p, ok := v.filter().Entry(nu); !ok || !same(p.GPUMinors, minors(1)) {
		t.Errorf("new cgroup's entry %+v %v", p, ok)
	}
	if v.reg.Owned(old) {
		t.Error("the old cgroup id is still attributed to the step")
	}
	// The old id's entry has no owner and its cgroup is gone: the orphan
	// sweep takes it.
	v.enf.Reconcile()
	if _, ok := v.filter().Entry(old); ok {
		t.Error("the old cgroup's entry survived the sweep")
	}
}

// A kernel map that refuses the entry refuses the step and leaves no
// record (a record with no entry would be restored as one at the next
// start).
func TestStepStartEntryFails(t *testing.T) {
	v := newEnv(t)
	v.prolog(7, 1000, str("0"))
	v.mustStart(7, policy.ExternStep, 1000, nil) // attaches the filter
	v.filter().FailSet = errors.New("map full")
	r := v.start(v.stepd(7, 0), 7, 0, 1000, str("0"))
	if !strings.Contains(r.Error, "map full") {
		t.Fatalf("error %q", r.Error)
	}
	if _, ok := v.reg.Step(7, 0); ok {
		t.Error("the step was recorded without its entry")
	}
	if _, ok := v.reg.Step(7, policy.ExternStep); !ok {
		t.Error("the job's other step lost its record")
	}
}

// Slurm's GPU table in doubt: GPU steps are refused with why, CPU-only
// steps run.
func TestUntrustedTable(t *testing.T) {
	v := newEnv(t, func(v *env) { v.h.Table = table{untrusted: "gres.conf and slurmd -G disagree"} })
	v.prolog(7, 1000, str("0"))
	if r := v.start(v.stepd(7, 0), 7, 0, 1000, str("0")); !strings.Contains(r.Error, "disagree") {
		t.Errorf("GPU step with an untrusted table: %q", r.Error)
	}
	if r := v.start(v.stepd(7, 1), 7, 1, 1000, str("")); r.Error != "" {
		t.Errorf("CPU-only step with an untrusted table refused: %q", r.Error)
	}
}

// Step ends (the plugin's StepEnd, the cgroup going, the epilog) take the
// entry away and audit it; an unknown step's end changes nothing.
func TestReleases(t *testing.T) {
	v := newEnv(t)
	v.prolog(7, 1000, str("0,1"))
	v.mustStart(7, 0, 1000, str("0"))
	v.mustStart(7, 1, 1000, str("1"))
	v.mustStart(7, 2, 1000, str("1"))
	id0, _ := v.n.ID(stepDir(7, 0))
	id1, _ := v.n.ID(stepDir(7, 1))
	id2, _ := v.n.ID(stepDir(7, 2))
	v.do(peer.Peer{}, &pb.Request{Msg: &pb.Request_StepEnd{StepEnd: &pb.StepEnd{JobId: 7, StepId: 0}}})
	v.do(peer.Peer{}, &pb.Request{Msg: &pb.Request_StepEnd{StepEnd: &pb.StepEnd{JobId: 7, StepId: 0}}})  // again
	v.do(peer.Peer{}, &pb.Request{Msg: &pb.Request_StepEnd{StepEnd: &pb.StepEnd{JobId: 99, StepId: 0}}}) // unknown
	if _, ok := v.filter().Entry(id0); ok {
		t.Error("ended step keeps its entry")
	}
	v.h.StepGone(id1, "step cgroup removed")
	v.h.StepGone(id1, "step cgroup removed")
	if _, ok := v.filter().Entry(id1); ok {
		t.Error("gone step keeps its entry")
	}
	if r := v.do(peer.Peer{}, &pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 7}}}); r.Error != "" {
		t.Fatal(r.Error)
	}
	if _, ok := v.filter().Entry(id2); ok {
		t.Error("epilog left an entry")
	}
	if _, ok := v.reg.Job(7); ok {
		t.Error("epilog left the record")
	}
	got := v.rec.Records(audit.EventPolicyReleased)
	if len(got) != 3 || got[0].CgroupID != id0 || got[1].Reason != "step cgroup removed" || got[2].Reason != "job ended" {
		t.Errorf("release audits %+v", got)
	}
}

// A request the agent does not know is refused, not guessed at.
func TestUnknownRequest(t *testing.T) {
	v := newEnv(t)
	if r := v.do(peer.Peer{}, &pb.Request{}); !strings.Contains(r.Error, "unknown request") {
		t.Errorf("empty request: %q", r.Error)
	}
}

// Audit-only mode is what records say.
func TestModeInRecords(t *testing.T) {
	v := newEnv(t)
	v.h.Mode.Set(true)
	v.prolog(7, 1000, str("0"))
	v.mustStart(7, 0, 1000, str("0"))
	if got := v.rec.Records(audit.EventPolicyApplied); got[0].PolicyMode != audit.ModeAuditOnly {
		t.Errorf("mode %q", got[0].PolicyMode)
	}
	var m *Mode
	if m.AuditOnly() || m.String() != audit.ModeEnforce {
		t.Error("a nil mode does not enforce")
	}
}

// At attach, recorded steps whose cgroup is still theirs get their entry
// back; one whose cgroup was made again does not (reconcile releases it).
func TestWriteRecordedAndWatch(t *testing.T) {
	v := newEnv(t)
	live := v.n.Mkdir(stepDir(7, 0))
	v.n.Mkdir(stepDir(7, 1))
	v.reg.Restore([]registry.Job{{ID: 7, UID: 1000, GPUs: []int{0, 1}}}, []registry.Step{
		{JobID: 7, StepID: 0, UID: 1000, GPUs: []int{1}, Cgroup: cgroup.Cgroup{ID: live, Path: stepDir(7, 0)}, IMEXChannels: []uint32{4}},
		{JobID: 7, StepID: 1, UID: 1000, GPUs: []int{0}, Cgroup: cgroup.Cgroup{ID: 5, Path: stepDir(7, 1)}},
		{JobID: 7, StepID: 2, UID: 1000, GPUs: []int{9}, Cgroup: cgroup.Cgroup{ID: 6, Path: stepDir(7, 2)}},
	})
	got := map[uint64]devfilter.Policy{}
	v.h.WriteRecorded(func(cg cgroup.Cgroup, p devfilter.Policy) error { got[cg.ID] = p; return nil })
	want := map[uint64]devfilter.Policy{live: {GPUMinors: minors(1), IMEXChannels: []uint32{4}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("written %+v, want %+v", got, want)
	}
	v.h.WatchRecorded()
	if len(v.w.added) != 3 {
		t.Errorf("watched %v", v.w.added)
	}
}

// SettingsFile re-reads slurm.conf only when it changed.
func TestSettingsFile(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "slurm.conf")
	os.WriteFile(conf, []byte("ClusterName=a\nTaskPlugin=task/cgroup\n"), 0o644)
	s := &SettingsFile{Path: conf}
	got, err := s.Get()
	if err != nil || got.ClusterName != "a" {
		t.Fatalf("Get: %+v %v", got, err)
	}
	os.WriteFile(filepath.Join(dir, "cgroup.conf"), []byte("ConstrainDevices=yes\n"), 0o644)
	later := time.Now().Add(time.Second)
	os.Chtimes(filepath.Join(dir, "cgroup.conf"), later, later)
	if got, err = s.Get(); err != nil || !got.LocalGPUIndices() {
		t.Errorf("after cgroup.conf changed: %+v %v", got, err)
	}
	if _, err := (&SettingsFile{Path: filepath.Join(dir, "none")}).Get(); err == nil {
		t.Error("a missing slurm.conf read")
	}
	v := newEnv(t, func(v *env) { v.h.Settings = &SettingsFile{Path: filepath.Join(dir, "none")} })
	v.prolog(7, 1000, str("0"))
	if r := v.start(v.stepd(7, 0), 7, 0, 1000, str("0")); !strings.Contains(r.Error, "slurm.conf") {
		t.Errorf("step with unreadable settings: %q", r.Error)
	}
}
