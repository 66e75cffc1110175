// SPDX-License-Identifier: Apache-2.0

package enforcer

import (
	"bytes"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/events"
	"github.com/gpufence/gpufence/agent/fakenode"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

var (
	_ Filter  = (*fakenode.Filter)(nil)
	_ Filter  = (*devfilter.Filter)(nil)
	_ Cgroups = (*fakenode.Node)(nil)
	_ Pins    = (*fakenode.Pins)(nil)
)

const (
	mount = "/sys/fs/cgroup"
	scope = mount + "/system.slice/n1_slurmstepd.scope"
)

type env struct {
	t    *testing.T
	n    *fakenode.Node
	reg  *registry.Registry
	rec  *audittest.Recorder
	logs *bytes.Buffer
	pins *fakenode.Pins
	e    *Enforcer

	mu       sync.Mutex
	filters  []*fakenode.Filter
	attached int
	released []uint64
	watched  []string
	factErr  error
	before   int
	restored []uint64
}

// Read is the event reader's start (Options.Events).
func (v *env) Read(events.Source, events.Counters, bool) { v.mu.Lock(); v.attached++; v.mu.Unlock() }

// WatchMade is the slurmd cgroup watch (Options.SlurmdWatch).
func (v *env) WatchMade(d string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.watched = append(v.watched, d)
	return nil
}

// restore writes a recorded entry, as handler.WriteRecorded does, before
// the program first runs.
func (v *env) restore(set func(cgroup.Cgroup, devfilter.Policy) error) {
	v.before++
	for _, id := range v.restored {
		set(cgroup.Cgroup{ID: id}, devfilter.Policy{GPUMinors: []uint32{3}})
	}
}

type settings struct{ st slurm.Settings }

func (s settings) Get() (slurm.Settings, error) { return s.st, nil }

func newEnv(t *testing.T, mode devfilter.Mode, opts ...func(*Options)) *env {
	v := &env{t: t, n: fakenode.New(mount), rec: &audittest.Recorder{}, logs: &bytes.Buffer{}, pins: &fakenode.Pins{}}
	v.reg = registry.New(nil, slog.New(slog.NewTextHandler(v.logs, nil)))
	v.n.Mkdir(scope + "/system")
	v.n.SetScope(scope, nil)
	o := Options{
		Log: slog.New(slog.NewTextHandler(v.logs, nil)), Mount: mount, Node: "n1", Exempt: []string{"system", "slurmd"},
		Registry: v.reg, Recorder: v.rec, Cgroups: v.n, Pins: v.pins,
		NewFilter: func(sc string, prepare func(Filter) error) (Filter, error) {
			v.mu.Lock()
			err := v.factErr
			v.mu.Unlock()
			if err != nil {
				return nil, err
			}
			f := fakenode.NewFilter(mode, v.n, sc)
			if mode == devfilter.ModePerCgroup {
				f = fakenode.NewFilter(mode, v.n, "")
			}
			if err := prepare(f); err != nil {
				return nil, err
			}
			v.mu.Lock()
			v.filters = append(v.filters, f)
			v.mu.Unlock()
			return f, nil
		},
		Events:      v,
		OnRelease:   func(id uint64, _ registry.Owner) { v.mu.Lock(); v.released = append(v.released, id); v.mu.Unlock() },
		Restore:     []func(func(cgroup.Cgroup, devfilter.Policy) error){v.restore},
		SlurmdWatch: v,
	}
	for _, fn := range opts {
		fn(&o)
	}
	v.e = New(o)
	return v
}

func (v *env) filter() *fakenode.Filter {
	v.t.Helper()
	f, _ := v.e.Filter().(*fakenode.Filter)
	if f == nil {
		v.t.Fatal("no filter attached")
	}
	return f
}

func (v *env) entry(path string) (devfilter.Policy, bool) {
	id, err := v.n.ID(path)
	if err != nil {
		return devfilter.Policy{}, false
	}
	return v.filter().Entry(id)
}

// The first step attaches the filter on Slurm's scope: the exempt cgroup
// that exists (system) gets a root-only allow-all entry before the
// recorded steps' entries (Options.Restore) and before the program runs; the
// one Slurm has not made yet (slurmd) gets one when it appears.
func TestEnsureAttaches(t *testing.T) {
	v := newEnv(t, devfilter.ModeScope)
	v.restored = []uint64{4242}
	if v.e.Filter() != nil || v.e.Scope() != "" {
		t.Fatal("a filter before any step")
	}
	if err := v.e.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	if v.attached != 1 || v.before != 1 || v.e.Scope() != scope {
		t.Fatalf("attached %d, before-enforce %d, scope %q", v.attached, v.before, v.e.Scope())
	}
	if p, ok := v.entry(scope + "/system"); !ok || !p.AllowAll || !p.RootOnly {
		t.Errorf("system's entry %+v %v, want root-only allow-all", p, ok)
	}
	if p, ok := v.filter().Entry(4242); !ok || !reflect.DeepEqual(p.GPUMinors, []uint32{3}) {
		t.Errorf("recorded entry written at attach: %+v %v", p, ok)
	}
	if _, ok := v.reg.Exempts()["system"]; !ok {
		t.Error("system not recorded as exempt")
	}
	if err := v.e.Ensure(scope); err != nil || len(v.filters) != 1 {
		t.Fatalf("a second Ensure: %v, %d filters", err, len(v.filters))
	}
	v.n.Mkdir(scope + "/slurmd")
	v.e.RefreshExempt()
	if p, ok := v.entry(scope + "/slurmd"); !ok || !p.AllowAll {
		t.Errorf("slurmd made later: entry %+v %v", p, ok)
	}
	// Made again (a slurmd restart): the old id's entry goes, the new one's
	// comes.
	old, _ := v.n.ID(scope + "/system")
	v.n.Recreate(scope + "/system")
	v.e.RefreshExempt()
	if _, ok := v.filter().Entry(old); ok {
		t.Error("the old system cgroup's entry kept")
	}
	if _, ok := v.entry(scope + "/system"); !ok {
		t.Error("the new system cgroup has no entry")
	}
}

// An attach the kernel refuses refuses the step, is audited, and leaves no
// exempt record behind.
func TestAttachFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		fact error
	}{
		{"factory", errors.New("bpf: operation not permitted")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t, devfilter.ModeScope)
			v.factErr = tc.fact
			err := v.e.Ensure(scope)
			if err == nil || v.e.Filter() != nil {
				t.Fatalf("Ensure: %v, filter %v", err, v.e.Filter())
			}
			if len(v.reg.Exempts()) != 0 {
				t.Errorf("exempt records left: %+v", v.reg.Exempts())
			}
			if r := v.rec.Records(audit.EventFilterAttachFailed); len(r) != 1 || r[0].Cgroup != scope {
				t.Errorf("audit %+v", r)
			}
			if err := v.e.Set(cgroup.Cgroup{ID: 5}, devfilter.Policy{}); err == nil {
				t.Error("Set with no filter: no error")
			}
		})
	}
}

// Slurm's scope made again at the same path (a new cgroup id): the next
// step re-attaches the filter there and it is audited; a re-attach the
// kernel refuses refuses the step.
func TestScopeRecreated(t *testing.T) {
	v := newEnv(t, devfilter.ModeScope)
	if err := v.e.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	oldID, _ := v.n.ID(scope)
	newID := v.n.Recreate(scope)
	v.n.Mkdir(scope + "/system")
	if err := v.e.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	if id, _ := v.filter().ScopeCgroupID(); id != newID || id == oldID {
		t.Errorf("link on %d, want the new scope %d", id, newID)
	}
	if r := v.rec.Records(audit.EventFilterReattached); len(r) != 1 || r[0].CgroupID != newID {
		t.Errorf("re-attach audit %+v", r)
	}
	if _, ok := v.entry(scope + "/system"); !ok {
		t.Error("the new scope's system cgroup has no entry after the re-attach")
	}
	v.n.Recreate(scope)
	v.filter().FailReattach = errors.New("link update refused")
	if err := v.e.Ensure(scope); err == nil || !strings.Contains(err.Error(), "link update refused") {
		t.Errorf("failed re-attach: %v", err)
	}
	if r := v.rec.Records(audit.EventFilterAttachFailed); len(r) != 1 {
		t.Errorf("failed re-attach audit %+v", r)
	}
	if _, _, problem := v.e.Guards(scope); !strings.Contains(problem, "defunct") {
		t.Errorf("Guards after a failed re-attach: %q", problem)
	}
}

// A step under another scope path is refused while the filter's scope
// lives (never two live scopes on one node); once it is gone (CgroupSlice
// changed) the filter moves.
func TestAnotherScope(t *testing.T) {
	v := newEnv(t, devfilter.ModeScope)
	if err := v.e.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	other := mount + "/other.slice/n1_slurmstepd.scope"
	v.n.Mkdir(other)
	if err := v.e.Ensure(other); err == nil || !strings.Contains(err.Error(), "still exists") {
		t.Fatalf("a second live scope: %v", err)
	}
	v.n.Rmdir(scope)
	if err := v.e.Ensure(other); err != nil {
		t.Fatal(err)
	}
	if v.e.Scope() != other {
		t.Errorf("scope %q, want %q", v.e.Scope(), other)
	}
}

// Per-cgroup mode has no scope link: a step under any other scope is
// refused; a released cgroup keeps a deny-all entry until it is gone (a
// task can outlive its step), then the program comes off.
func TestPerCgroupRelease(t *testing.T) {
	v := newEnv(t, devfilter.ModePerCgroup, func(o *Options) { o.TaskBinding = true })
	if err := v.e.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v.logs.String(), "narrows tasks in scope mode only") {
		t.Error("task_binding in per-cgroup mode not warned")
	}
	if err := v.e.Ensure(mount + "/x.slice/slurmstepd.scope"); err == nil {
		t.Error("another scope in per-cgroup mode: no error")
	}
	if len(v.reg.Exempts()) != 0 {
		t.Errorf("per-cgroup mode made exempt entries: %+v", v.reg.Exempts())
	}
	step := scope + "/job_1/step_0"
	cg := cgroup.Cgroup{ID: v.n.Mkdir(step), Path: step}
	if err := v.e.Set(cg, devfilter.Policy{GPUMinors: []uint32{1}}); err != nil {
		t.Fatal(err)
	}
	if err := v.e.Release(cg, registry.Owner{JobID: 1}); err != nil {
		t.Fatal(err)
	}
	if p, ok := v.filter().Entry(cg.ID); !ok || !reflect.DeepEqual(p, devfilter.Policy{}) {
		t.Errorf("released entry %+v %v, want deny-all", p, ok)
	}
	if v.e.Ended() != 1 || !reflect.DeepEqual(v.released, []uint64{cg.ID}) {
		t.Errorf("ended %d released %v", v.e.Ended(), v.released)
	}
	v.e.ForgetEnded()
	if v.e.Ended() != 1 {
		t.Error("a live released cgroup's entry forgotten")
	}
	v.n.Rmdir(step)
	v.e.ForgetEnded()
	if _, ok := v.filter().Entry(cg.ID); ok || v.e.Ended() != 0 {
		t.Errorf("a gone cgroup's entry kept (ended %d)", v.e.Ended())
	}
	if mode, sc, problem := v.e.Guards(scope); mode != devfilter.ModePerCgroup || sc != scope || problem != "" {
		t.Errorf("Guards: %q %q %q", mode, sc, problem)
	}
}

// Scope mode: Release takes the entry (the program then denies the
// cgroup every GPU); Set on a released cgroup makes it live again.
func TestScopeRelease(t *testing.T) {
	v := newEnv(t, devfilter.ModeScope)
	if err := v.e.Release(cgroup.Cgroup{ID: 9}, registry.Owner{}); err != nil {
		t.Errorf("Release with no filter: %v", err)
	}
	if err := v.e.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	cg := cgroup.Cgroup{ID: v.n.Mkdir(scope + "/job_1/step_0"), Path: scope + "/job_1/step_0"}
	v.e.Set(cg, devfilter.Policy{GPUMinors: []uint32{0}})
	if err := v.e.Release(cg, registry.Owner{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := v.filter().Entry(cg.ID); ok || v.e.Ended() != 0 {
		t.Error("scope mode kept a released entry")
	}
	if err := v.e.SetAuditOnly(true); err != nil || !v.filter().AuditOnly() {
		t.Errorf("SetAuditOnly: %v", err)
	}
	if f := v.e.Detach(); f == nil || v.e.Filter() != nil {
		t.Error("Detach")
	}
	if err := v.e.SetAuditOnly(false); err != nil {
		t.Errorf("SetAuditOnly with no filter: %v", err)
	}
	if _, _, problem := v.e.Guards(scope); !strings.Contains(problem, "no device filter") {
		t.Errorf("Guards with no filter: %q", problem)
	}
}

// Reconcile attaches once the scope appears, and sweeps kernel entries
// nobody owns whose cgroup is gone (state lost while jobs ran), auditing
// each; an owned entry, or one whose cgroup lives, stays.
func TestReconcileSweeps(t *testing.T) {
	v := newEnv(t, devfilter.ModeScope)
	v.n.SetScope("", nil)
	v.e.Reconcile()
	if v.e.Filter() != nil {
		t.Fatal("attached with no scope")
	}
	v.n.SetScope(scope, nil)
	v.e.Reconcile()
	f := v.filter()
	owned := cgroup.Cgroup{ID: v.n.Mkdir(scope + "/job_1/step_0"), Path: scope + "/job_1/step_0"}
	alive := cgroup.Cgroup{ID: v.n.Mkdir(scope + "/job_2/step_0"), Path: scope + "/job_2/step_0"}
	lost := cgroup.Cgroup{ID: v.n.Mkdir(scope + "/job_3/step_0"), Path: scope + "/job_3/step_0"}
	for _, cg := range []cgroup.Cgroup{owned, alive, lost} {
		f.Set(cg, devfilter.Policy{GPUMinors: []uint32{1}})
	}
	v.reg.AddStep(registry.Step{JobID: 1, StepID: 0, Cgroup: owned}, "")
	v.n.Rmdir(scope + "/job_1")
	v.n.Rmdir(scope + "/job_3")
	v.e.Reconcile()
	for _, tc := range []struct {
		cg   cgroup.Cgroup
		kept bool
	}{{owned, true}, {alive, true}, {lost, false}} {
		if _, ok := f.Entry(tc.cg.ID); ok != tc.kept {
			t.Errorf("entry of %s kept %v, want %v", tc.cg.Path, ok, tc.kept)
		}
	}
	if r := v.rec.Records(audit.EventStaleEntryRemoved); len(r) != 1 || r[0].CgroupID != lost.ID {
		t.Errorf("sweep audit %+v", r)
	}
	// The scope removed and not made again: logged once, nothing moves.
	v.n.Rmdir(scope)
	v.e.Reconcile()
	v.e.Reconcile()
	if n := strings.Count(v.logs.String(), "Slurm's scope is gone"); n != 1 {
		t.Errorf("scope gone logged %d times", n)
	}
	if v.e.Scope() != scope {
		t.Errorf("the filter moved to %q", v.e.Scope())
	}
}

// At attach, an earlier agent's pinned entries of cgroups that are gone
// are removed and audited with the job they belonged to; live job, step
// and task cgroups and slurmd's pinned cgroup keep theirs.
func TestCleanStale(t *testing.T) {
	v := newEnv(t, devfilter.ModeScope, func(o *Options) { o.PinDir = "/pins" })
	live := v.n.Mkdir(scope + "/job_1/step_0/user/task_0")
	job := v.n.Mkdir(scope + "/job_1")
	v.pins.Slurmd = 77
	v.pins.Entries = []uint64{live, job, 77, 501, 502}
	v.reg.Restore(nil, []registry.Step{{JobID: 4, StepID: 2, Cgroup: cgroup.Cgroup{ID: 501}}})
	if err := v.e.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(v.pins.Entries, []uint64{live, job, 77}) {
		t.Errorf("pins left %v", v.pins.Entries)
	}
	r := v.rec.Records(audit.EventStaleEntryRemoved)
	if len(r) != 2 || r[0].CgroupID != 501 || r[0].JobID != 4 || r[0].StepID != "2" || r[1].JobID != 0 {
		t.Errorf("stale audit %+v", r)
	}
}

// slurmd's cgroup outside the scope gets the program and a root-only
// allow-all entry; made again by systemd (a slurmd restart), the filter is
// re-attached and the old entry goes; a problem finding it is logged and
// audited once while it lasts.
func TestRefreshSlurmd(t *testing.T) {
	v := newEnv(t, devfilter.ModeScope)
	sd := mount + "/system.slice/slurmd.service"
	id := v.n.Mkdir(sd)
	v.n.SetSlurmd(sd, nil)
	if err := v.e.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	v.e.RefreshSlurmd() // Ensure runs it too, in the background
	if dir, got := v.e.Slurmd(); dir != sd || got != id {
		t.Fatalf("Slurmd = %q %d, want %q %d", dir, got, sd, id)
	}
	if linked, _ := v.filter().SlurmdCgroupID(); linked != id {
		t.Errorf("slurmd link on %d", linked)
	}
	if p, ok := v.filter().Entry(id); !ok || !p.AllowAll || !p.RootOnly {
		t.Errorf("slurmd entry %+v %v", p, ok)
	}
	if v.reg.Exempts()["system.slice/slurmd.service"].ID != id {
		t.Errorf("exempts %+v", v.reg.Exempts())
	}
	nid := v.n.Recreate(sd)
	v.n.SetSlurmd("", nil) // not running yet: the path last found
	v.e.Reconcile()
	if linked, _ := v.filter().SlurmdCgroupID(); linked != nid {
		t.Errorf("after slurmd's cgroup was made again: link on %d, want %d", linked, nid)
	}
	if _, ok := v.filter().Entry(id); ok {
		t.Error("the old slurmd cgroup's entry kept")
	}
	if r := v.rec.Records(audit.EventFilterReattached); len(r) != 1 || r[0].CgroupID != nid {
		t.Errorf("re-attach audit %+v", r)
	}
	v.mu.Lock()
	watched := slices.Clone(v.watched)
	v.mu.Unlock()
	if len(watched) == 0 || watched[0] != sd {
		t.Errorf("slurmd's cgroup not watched: %v", watched)
	}
	v.n.SetSlurmd("", errors.New("pid file unreadable"))
	v.e.RefreshSlurmd()
	v.e.RefreshSlurmd()
	if r := v.rec.Records(audit.EventFilterAttachFailed); len(r) != 1 || !strings.Contains(r[0].Error, "pid file unreadable") {
		t.Errorf("slurmd problem audited %+v", r)
	}
}

// Where is where slurmd makes its scope, with cgroup.conf's slice as it
// is now.
func TestWhere(t *testing.T) {
	v := newEnv(t, devfilter.ModeScope, func(o *Options) {
		o.Settings = settings{slurm.Settings{CgroupSlice: "gpu.slice", SlurmdPidFile: "/run/%n.pid"}}
	})
	w := v.e.Where()
	if w.Mount != mount || w.Node != "n1" || w.Slice != "gpu.slice" || w.Configured != "" {
		t.Errorf("Where = %+v", w)
	}
	if v.e.Busy() {
		t.Error("busy with no call running")
	}
	if got := v.e.slurmdPid(); got != "/run/n1.pid" {
		t.Errorf("slurmd pid file %q", got)
	}
	if got := newEnv(t, devfilter.ModeScope).e.slurmdPid(); got != slurm.DefaultSlurmdPidFile {
		t.Errorf("default slurmd pid file %q", got)
	}
}
