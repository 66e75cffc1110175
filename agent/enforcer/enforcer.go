// SPDX-License-Identifier: Apache-2.0

// Package enforcer is the kernel stage of the agent: it keeps the device
// filter attached to Slurm's live scope, writes and releases each cgroup's
// entry, keeps Slurm's own cgroups (system, slurmd) allowed, and removes
// entries no cgroup needs any more. It decides nothing about jobs: what a
// cgroup may open is the caller's decision (agent/policy).
package enforcer

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/events"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Filter is the kernel device filter as the agent uses it;
// *devfilter.Filter implements it.
type Filter interface {
	Mode() devfilter.Mode
	Set(cg cgroup.Cgroup, p devfilter.Policy) error
	Remove(cg cgroup.Cgroup) error
	ReadEvent() (devfilter.Event, error)
	Suppressed() (map[devfilter.RateKey]uint64, error)
	ForgetRate(cgroupID uint64) error
	Lost() (uint64, error)
	RateFull() (map[devfilter.Decision]uint64, error)
	SetAuditOnly(on bool) error
	Policies() (map[uint64]devfilter.Policy, error)
	// ScopeCgroupID and Reattach are for ModeScope: the cgroup the scope
	// link is on (0 or a stale id once that cgroup is gone), and moving the
	// program onto the scope as it is now.
	ScopeCgroupID() (uint64, error)
	Reattach(scope string) error
	// AttachSlurmd and SlurmdCgroupID are for ModeScope too: the program
	// on slurmd's own cgroup outside the scope (systemd's slurmd.service),
	// and the cgroup that link is on (0 or a stale id once it is gone).
	AttachSlurmd(dir string, id uint64) error
	SlurmdCgroupID() (uint64, error)
	Close() error
}

// Factory attaches a filter on Slurm's slurmstepd scope directory. It calls
// prepare with the loaded filter before the program first runs on the
// scope (devfilter.Options.BeforeAttach); an error from prepare fails it.
type Factory func(scope string, prepare func(Filter) error) (Filter, error)

// Recorder receives lifecycle audit records.
type Recorder interface {
	Emit(r audit.Record)
}

// Cgroups is what the enforcer reads of the node: Slurm's scope and
// slurmd's cgroup as /proc shows them, and cgroupfs. nil in Options: this
// node's (jobcgroup.Node, and the kernel's lookup of a cgroup by id).
type Cgroups interface {
	Find(w jobcgroup.Where) jobcgroup.Found
	Slurmd(f jobcgroup.Found, mount, pidFile string) (string, error)
	ID(dir string) (uint64, error)
	// Exists reports whether a cgroup with id is alive.
	Exists(id uint64) (bool, error)
	// Dirs are the directories matching a filepath.Glob pattern.
	Dirs(pattern string) []string
}

// Pins is what an earlier agent left pinned under PinDir: the cgroup its
// slurmd link is on, and the entries of cgroups that are gone. nil in
// Options: bpf/devfilter's.
type Pins interface {
	SlurmdCgroup(pinDir string) uint64
	CleanStale(pinDir string, live func(id uint64) bool) (removed []uint64, err error)
}

type node struct{ jobcgroup.Node }

func (node) Exists(id uint64) (bool, error) { return cgroup.Exists(id) }

type pins struct{}

func (pins) SlurmdCgroup(dir string) uint64 { return devfilter.PinnedSlurmdCgroup(dir) }

func (pins) CleanStale(dir string, live func(uint64) bool) ([]uint64, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, nil // nothing pinned yet
	}
	return devfilter.CleanStale(dir, live)
}

// Settings are Slurm's settings as they are now; *handler.SettingsFile
// implements it.
type Settings interface {
	Get() (slurm.Settings, error)
}

// Reader reads the kernel's access reports of a filter from its attach
// on; *events.Events implements it.
type Reader interface {
	Read(src events.Source, c events.Counters, adopted bool)
}

// SlurmdWatch watches for slurmd's cgroup made again; *cgwatch.Watcher
// implements it.
type SlurmdWatch interface {
	WatchMade(dir string) error
}

// KernelFilter is the Factory of the kernel's device filter; opts holds
// everything but the scope.
func KernelFilter(opts devfilter.Options) Factory {
	return func(scope string, prepare func(Filter) error) (Filter, error) {
		o := opts
		o.ScopeDir = scope
		if prepare != nil {
			o.BeforeAttach = func(f *devfilter.Filter) error { return prepare(f) }
		}
		return devfilter.New(o)
	}
}

// Options configure an Enforcer.
type Options struct {
	Log *slog.Logger
	// Mount is the cgroup v2 mount; Scope the configured scope ("" = found).
	Mount, Scope, Node string
	// Settings are Slurm's as they are now: cgroup.conf's CgroupSlice
	// (where slurmd makes its scope; "" = system.slice) and slurm.conf's
	// SlurmdPidFile (which root slurmd is this node's, for its cgroup
	// outside the scope). nil, or unreadable: system.slice and Slurm's
	// default pid file (steps are refused on the same error anyway).
	Settings Settings
	// Exempt are the scope's children that keep every device.
	Exempt []string
	// PinDir is where the filter pins (for the stale cleanup at start).
	PinDir    string
	NewFilter Factory
	Registry  *registry.Registry
	Recorder  Recorder
	// Events, when set, is told of each filter attached: the kernel's
	// access reports are read from then on (*events.Events). OnRelease is
	// told of each cgroup whose entry went (its last rate counts are
	// flushed, then forgotten). Neither may block.
	Events    Reader
	OnRelease func(id uint64, o registry.Owner)
	// TaskBinding is task_binding: slurm, which narrows tasks in scope
	// mode only: a filter attached in per-cgroup mode says so.
	TaskBinding bool
	// SlurmdWatch, when set, is told slurmd's cgroup outside the scope
	// each time the filter is put there: systemd makes it again at every
	// slurmd restart, and a watch on its parent (*cgwatch.Watcher) calls
	// RefreshSlurmd at once (as one on the pid file does when slurmd
	// starts). It must not block.
	SlurmdWatch SlurmdWatch
	// Restore are called with each filter being attached, after the exempt
	// entries and before the program first runs, to write entries with
	// set: those of recorded steps (handler.WriteRecorded) and of running
	// jobs the agent adopts (adopt.ApplyHeld), so no process of theirs
	// ever meets an empty map. None may block.
	Restore []func(set func(cgroup.Cgroup, devfilter.Policy) error)
	// Cgroups and Pins read the node; nil: this node's.
	Cgroups Cgroups
	Pins    Pins
}

// Enforcer keeps the filter. Its methods are safe for concurrent use.
type Enforcer struct {
	o Options

	mu     sync.Mutex
	filter Filter
	scope  string
	// scopeID is the scope's cgroup id when the filter was attached (scope
	// mode): a scope made again at the same path has another.
	scopeID uint64
	// ended are per-cgroup mode entries of released cgroups, kept deny-all
	// until the cgroup is gone.
	ended map[uint64]cgroup.Cgroup

	// noteMu guards what FindScope last reported, so that a problem that
	// lasts is logged and audited once, not at every reconcile.
	noteMu      sync.Mutex
	lastProblem string
	ignored     map[string]bool
	// gone: the scope the filter is on was seen removed (logged once).
	gone bool

	// slurmdDir is slurmd's cgroup outside the scope the filter was last
	// put on (scope mode), slurmdID its id then, slurmdName its name as an
	// exempt cgroup (the path below the mount); slurmdProblem what was
	// last logged and audited about it, once while it lasts. Under e.mu.
	slurmdDir, slurmdName, slurmdProblem string
	slurmdID                             uint64
}

// New returns an enforcer with no filter yet.
func New(o Options) *Enforcer {
	if o.OnRelease == nil {
		o.OnRelease = func(uint64, registry.Owner) {}
	}
	if o.Cgroups == nil {
		o.Cgroups = node{}
	}
	if o.Pins == nil {
		o.Pins = pins{}
	}
	return &Enforcer{o: o, ended: map[uint64]cgroup.Cgroup{}, ignored: map[string]bool{}}
}

func (e *Enforcer) lifecycle(ev audit.Event, sev audit.Severity, msg string, fill func(*audit.Record)) {
	r := audit.Record{Event: ev, Severity: sev, Message: msg}
	if fill != nil {
		fill(&r)
	}
	e.o.Recorder.Emit(r)
}

// Where is where slurmd makes its scope on this node, as now configured.
func (e *Enforcer) Where() jobcgroup.Where {
	w := jobcgroup.Where{Mount: e.o.Mount, Configured: e.o.Scope, Node: e.o.Node}
	if e.o.Settings != nil {
		st, _ := e.o.Settings.Get()
		w.Slice = st.CgroupSlice
	}
	return w
}

// FindScope finds Slurm's scope on this node as it is now (jobcgroup.Find:
// only where slurmd makes it, root's, holding Slurm's processes). A scope
// that cannot be told (Found.Err) is logged and audited, once while it
// lasts; a cgroup named like a scope anywhere else (a user can make one in
// their own delegated subtree) is logged once as ignored. It reads /proc:
// never call it holding e.mu.
func (e *Enforcer) FindScope() jobcgroup.Found {
	f := e.o.Cgroups.Find(e.Where())
	e.note(f)
	return f
}

func (e *Enforcer) note(f jobcgroup.Found) {
	e.noteMu.Lock()
	defer e.noteMu.Unlock()
	for _, c := range f.Ignored() {
		if !c.Expected && !e.ignored[c.Path] {
			e.ignored[c.Path] = true
			e.o.Log.Warn("a cgroup named like Slurm's scope is not Slurm's; ignored", "cgroup", c.Path, "reason", c.Refused)
		}
	}
	problem := ""
	if f.Err != nil {
		problem = f.Err.Error()
	}
	if problem == e.lastProblem {
		return
	}
	e.lastProblem = problem
	if problem == "" {
		e.o.Log.Info("Slurm's scope can be told again", "cgroup", f.Scope)
		return
	}
	on := e.Scope()
	msg := "Slurm's scope cannot be told, so the GPU device filter is attached to nothing new and moved nowhere; GPU steps outside the scope it is on are refused"
	if on != "" {
		msg = "Slurm's scope cannot be told; the GPU device filter stays on " + on + ", and steps under any other scope are refused"
	}
	e.o.Log.Error(msg, "err", f.Err, "cgroup", on)
	e.lifecycle(audit.EventFilterAttachFailed, audit.SeverityError, msg, func(r *audit.Record) {
		r.Cgroup, r.Error = on, problem
	})
}

// Filter returns the attached filter, nil before one is.
func (e *Enforcer) Filter() Filter {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.filter
}

// Ensure makes sure, before a step is answered, that the filter is on
// Slurm's scope as it is now: attached the first time, and in scope mode
// re-attached when the scope was made again at the same path (its unit
// stopped, its keep-alive gone, a Slurm upgrade), which leaves every job
// below it unfiltered otherwise. The scope directory's cgroup id and the
// link's are compared; a re-attach is audited. An error refuses the step.
func (e *Enforcer) Ensure(scope string) error {
	e.mu.Lock()
	had := e.filter != nil
	err := e.ensureLocked(scope)
	attached := !had && e.filter != nil
	e.mu.Unlock()
	if attached {
		// slurmd's cgroup outside the scope, found by /proc, which is not
		// read under e.mu: now, not at the next reconcile pass (Reconcile,
		// the other path that attaches, refreshes it itself).
		go e.RefreshSlurmd()
	}
	return err
}

func (e *Enforcer) ensureLocked(scope string) error {
	if e.filter == nil {
		return e.attachLocked(scope)
	}
	if e.filter.Mode() != devfilter.ModeScope {
		if scope != e.scope {
			return fmt.Errorf("step is under scope %s but the device filter is attached to %s", scope, e.scope)
		}
		return nil
	}
	id, err := e.o.Cgroups.ID(scope)
	if err != nil {
		return fmt.Errorf("Slurm's scope %s: %w", scope, err)
	}
	linked, lerr := e.filter.ScopeCgroupID()
	if scope == e.scope && id == e.scopeID && lerr == nil && linked == id {
		return nil
	}
	if scope != e.scope {
		// Another scope path: only when the old one is gone (a CgroupSlice
		// change), never two live scopes on one node.
		if oldID, err := e.o.Cgroups.ID(e.scope); err == nil && oldID == e.scopeID && linked == oldID {
			return fmt.Errorf("step is under scope %s but the device filter is attached to %s, which still exists", scope, e.scope)
		}
	}
	why := fmt.Sprintf("Slurm's scope %s is cgroup %d; the device filter's link was on cgroup %d (link reports %d)", scope, id, e.scopeID, linked)
	if lerr != nil {
		why = fmt.Sprintf("Slurm's scope %s is cgroup %d; the device filter's link cannot be read (%v)", scope, id, lerr)
	}
	start := time.Now()
	if err := e.filter.Reattach(scope); err != nil {
		err = fmt.Errorf("re-attach device filter to %s: %w", scope, err)
		e.o.Log.Error("the device filter is not on Slurm's live scope and cannot be re-attached; steps are refused", "reason", why, "err", err)
		e.lifecycle(audit.EventFilterAttachFailed, audit.SeverityError, "the GPU device filter is not on Slurm's live scope and could not be re-attached; steps are refused: "+why, func(r *audit.Record) {
			r.Cgroup, r.CgroupID, r.Error = scope, id, err.Error()
		})
		return err
	}
	old := e.scopeID
	e.scope, e.scopeID = scope, id
	took := time.Since(start)
	e.o.Log.Warn("device filter re-attached to Slurm's recreated scope", "cgroup", scope, "cgroup_id", id, "old_cgroup_id", old, "took", took)
	e.lifecycle(audit.EventFilterReattached, audit.SeverityWarning,
		fmt.Sprintf("Slurm's scope was made again (%s); the GPU device filter was re-attached to it in %v", why, took.Round(time.Microsecond)), func(r *audit.Record) {
			r.Cgroup, r.CgroupID, r.Reason = scope, id, why
		})
	e.refreshExemptLocked()
	return nil
}

// attachLocked attaches the filter on scope. e.mu is held.
func (e *Enforcer) attachLocked(scope string) error {
	e.cleanStaleLocked(scope)
	id, _ := e.o.Cgroups.ID(scope)
	f, err := e.o.NewFilter(scope, func(f Filter) error {
		e.filter, e.scope, e.scopeID = f, scope, id
		e.refreshExemptLocked()
		for _, restore := range e.o.Restore {
			restore(f.Set)
		}
		return nil
	})
	if err != nil {
		e.filter, e.scope, e.scopeID = nil, "", 0
		// Entries prepare made went with the filter.
		for name := range e.o.Registry.Exempts() {
			e.o.Registry.SetExempt(name, cgroup.Cgroup{})
		}
		err = fmt.Errorf("attach device filter to %s: %w", scope, err)
		e.lifecycle(audit.EventFilterAttachFailed, audit.SeverityError, "the GPU device filter could not be attached; GPU steps are refused", func(r *audit.Record) {
			r.Cgroup, r.Error = scope, err.Error()
		})
		return err
	}
	e.filter, e.scope, e.scopeID = f, scope, id
	adopted := false
	if a, ok := f.(interface{ Adopted() bool }); ok {
		adopted = a.Adopted()
	}
	e.o.Log.Info("device filter attached", "cgroup", scope, "mode", f.Mode(), "adopted_pinned", adopted)
	if e.o.TaskBinding && f.Mode() == devfilter.ModePerCgroup {
		e.o.Log.Warn("task_binding: slurm narrows tasks in scope mode only; in per-cgroup mode (kernels before 6.1) every task keeps its step's GPUs")
	}
	if e.o.Events != nil {
		e.o.Events.Read(f, f, adopted)
	}
	e.refreshExemptLocked()
	return nil
}

// setExemptLocked writes Slurm's own cgroup cg, named name, as exempt:
// every device, for root only. e.mu is held.
func (e *Enforcer) setExemptLocked(name string, cg cgroup.Cgroup) error {
	if err := e.filter.Set(cg, devfilter.Policy{AllowAll: true, RootOnly: true}); err != nil {
		return err
	}
	e.o.Registry.SetExempt(name, cg)
	return nil
}

// refreshExemptLocked keeps an allow-all entry for each exempt child of the
// scope (slurmd, system) and drops entries of ones that vanished. Slurm
// makes its stepd parking cgroup when the first step starts. The entries
// are root-only: slurmd's NVML and slurmstepd's --gpu-freq run as root,
// while a process there that runs as a user (slurmd's sbcast child, which
// opens the destination after setresuid to the job's user) is the user's
// reach into an unfiltered cgroup. e.mu is held.
func (e *Enforcer) refreshExemptLocked() {
	if e.filter == nil || e.filter.Mode() == devfilter.ModePerCgroup {
		return
	}
	have := e.o.Registry.Exempts()
	for _, name := range e.o.Exempt {
		dir := filepath.Join(e.scope, name)
		id, err := e.o.Cgroups.ID(dir)
		old, had := have[name]
		if had && (err != nil || id != old.ID) {
			if err := e.filter.Remove(old); err != nil {
				e.o.Log.Error("remove exempt entry", "cgroup", old.Path, "err", err)
			}
			e.o.Registry.SetExempt(name, cgroup.Cgroup{})
			had = false
		}
		if err != nil || had {
			continue
		}
		cg := cgroup.Cgroup{ID: id, Path: dir}
		if err := e.setExemptLocked(name, cg); err != nil {
			e.o.Log.Error("set exempt entry", "cgroup", dir, "err", err)
			continue
		}
		e.o.Log.Info("exempt cgroup keeps all devices for root", "cgroup", dir)
	}
}

// RefreshExempt refreshes the exempt entries (a new `system` cgroup).
func (e *Enforcer) RefreshExempt() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.refreshExemptLocked()
}

// Set gives cg the policy p.
func (e *Enforcer) Set(cg cgroup.Cgroup, p devfilter.Policy) error {
	e.mu.Lock()
	f := e.filter
	delete(e.ended, cg.ID)
	e.mu.Unlock()
	if f == nil {
		return fmt.Errorf("no device filter attached")
	}
	return f.Set(cg, p)
}

// Release takes cg's entry away; o is who it was, for the last rate
// counts. In scope mode the cgroup then has no entry and the program
// denies it every GPU. In per-cgroup mode the program on the cgroup is all
// that narrows it, and a task can outlive its step (it ignores SIGTERM,
// UnkillableStepTimeout): the entry becomes deny-all and stays until the
// cgroup is gone (ForgetEnded).
func (e *Enforcer) Release(cg cgroup.Cgroup, o registry.Owner) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.filter == nil {
		return nil
	}
	var err error
	if e.filter.Mode() == devfilter.ModePerCgroup {
		if err = e.filter.Set(cg, devfilter.Policy{}); err == nil {
			e.ended[cg.ID] = cg
		}
	} else {
		err = e.filter.Remove(cg)
	}
	e.o.OnRelease(cg.ID, o)
	return err
}

// ForgetEnded detaches the deny-all entries of released cgroups (per-cgroup
// mode) that are gone.
func (e *Enforcer) ForgetEnded() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.filter == nil {
		return
	}
	for id, cg := range e.ended {
		if now, err := e.o.Cgroups.ID(cg.Path); err == nil && now == id {
			continue
		}
		if err := e.filter.Remove(cg); err != nil {
			e.o.Log.Error("detach the filter of an ended step", "cgroup", cg.Path, "err", err)
			continue
		}
		delete(e.ended, id)
	}
}

// Ended is how many released cgroups keep a deny-all entry.
func (e *Enforcer) Ended() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.ended)
}

// Reconcile attaches the filter if the scope appeared, re-attaches it if
// the scope was made again, refreshes the exempt entries and sweeps
// entries no registered cgroup owns whose cgroup is gone.
func (e *Enforcer) Reconcile() {
	// A scope that cannot be told (two candidates, an untrusted one) moves
	// nothing: the filter stays where it is.
	found := e.FindScope()
	scope := found.Scope
	slurmd, serr := e.o.Cgroups.Slurmd(found, e.o.Mount, e.slurmdPid())
	e.mu.Lock()
	e.noteGoneLocked(found)
	switch {
	case e.filter == nil && scope != "":
		if err := e.attachLocked(scope); err != nil {
			e.o.Log.Error("attach device filter", "err", err)
		}
	case e.filter != nil && e.filter.Mode() == devfilter.ModeScope && scope != "":
		// A scope removed and not made again yet has nothing to attach to;
		// the first step under the new one re-attaches.
		if err := e.ensureLocked(scope); err != nil {
			e.o.Log.Error("device filter scope", "err", err)
		}
	}
	e.refreshExemptLocked()
	e.refreshSlurmdLocked(slurmd, serr)
	e.sweepOrphansLocked()
	e.mu.Unlock()
}

// noteGoneLocked logs, once per disappearance, that the scope the filter
// is on was removed (slurmd stopped with its scope) and nothing replaces it
// yet: no cgroup merely named like it is taken meanwhile. e.mu is held.
func (e *Enforcer) noteGoneLocked(f jobcgroup.Found) {
	if e.filter == nil || e.scope == "" {
		return
	}
	_, err := e.o.Cgroups.ID(e.scope)
	gone := errors.Is(err, os.ErrNotExist) && f.Scope == ""
	if gone && !e.gone {
		e.o.Log.Info("Slurm's scope is gone; the filter is re-attached when slurmd makes it again, never to another cgroup meanwhile", "cgroup", e.scope, "expected", f.Expected)
	}
	e.gone = gone
}

// cleanStaleLocked removes pinned kernel entries of cgroups that no longer
// exist (left by an earlier run whose steps ended while no agent ran), and
// audits each removal. e.mu is held.
func (e *Enforcer) cleanStaleLocked(scope string) {
	if e.o.PinDir == "" {
		return
	}
	live := map[uint64]bool{}
	// slurmd's cgroup outside the scope keeps its entry: the pinned link
	// there decides its tasks by it, root slurmd's NVML included.
	if id := e.o.Pins.SlurmdCgroup(e.o.PinDir); id != 0 {
		live[id] = true
	}
	// Job, step and (task_binding: slurm) task cgroups hold entries.
	for _, pattern := range []string{"*", "*/*", "*/*/user/task_*"} {
		for _, dir := range e.o.Cgroups.Dirs(filepath.Join(scope, pattern)) {
			if id, err := e.o.Cgroups.ID(dir); err == nil {
				live[id] = true
			}
		}
	}
	removed, err := e.o.Pins.CleanStale(e.o.PinDir, func(id uint64) bool { return live[id] })
	if err != nil {
		e.o.Log.Error("clean stale pinned entries", "err", err)
		return
	}
	view := e.o.Registry.View()
	for _, id := range removed {
		o, known := view.Owner(id)
		e.o.Log.Info("stale kernel entry removed", "cgroup_id", id)
		e.lifecycle(audit.EventStaleEntryRemoved, audit.SeverityNotice,
			fmt.Sprintf("removed the kernel entry of cgroup %d, which no longer exists (left by an earlier run)", id), func(r *audit.Record) {
				r.CgroupID = id
				if known && o.Exempt == "" {
					r.JobID, r.StepID = o.JobID, policy.StepName(o.StepID)
				}
			})
	}
}

// sweepOrphansLocked removes kernel entries that no registered cgroup owns
// and whose cgroup is gone: entries of steps whose attribution was lost
// (state lost while jobs ran) would otherwise stay until the next start.
// e.mu is held.
func (e *Enforcer) sweepOrphansLocked() {
	if e.filter == nil {
		return
	}
	entries, err := e.filter.Policies()
	if err != nil {
		e.o.Log.Error("list kernel entries", "err", err)
		return
	}
	for id := range entries {
		if e.o.Registry.Owned(id) {
			continue
		}
		if _, ended := e.ended[id]; ended {
			continue
		}
		if exists, err := e.o.Cgroups.Exists(id); err != nil || exists {
			continue
		}
		if err := e.filter.Remove(cgroup.Cgroup{ID: id}); err != nil {
			e.o.Log.Error("remove orphaned kernel entry", "cgroup_id", id, "err", err)
			continue
		}
		e.o.OnRelease(id, registry.Owner{})
		e.o.Log.Info("orphaned kernel entry removed", "cgroup_id", id)
		e.lifecycle(audit.EventStaleEntryRemoved, audit.SeverityNotice,
			fmt.Sprintf("removed the kernel entry of cgroup %d, which no longer exists and no known step owned", id), func(r *audit.Record) {
				r.CgroupID = id
			})
	}
}

// SetAuditOnly switches the filter between enforcing and audit-only.
func (e *Enforcer) SetAuditOnly(on bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.filter == nil {
		return nil
	}
	return e.filter.SetAuditOnly(on)
}

// Detach closes the filter (with pins, enforcement stays) and returns it,
// for the last flush; nil when none was attached.
func (e *Enforcer) Detach() Filter {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := e.filter
	e.filter = nil
	return f
}

// Scope returns the scope the filter is on, "" before one is.
func (e *Enforcer) Scope() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.scope
}

// Busy reports whether the enforcer's lock is held at this moment (a check
// for tests that no slow call runs under it).
func (e *Enforcer) Busy() bool {
	if e.mu.TryLock() {
		e.mu.Unlock()
		return false
	}
	return true
}

// Guards says whether the filter guards Slurm's scope live as it is now,
// without changing anything (gpufence verify reports what it finds, it
// does not repair it): its mode, the scope it is on, and "" or why it does
// not guard live. In per-cgroup mode nothing is on the scope; the filter
// then only has to be there, attached to that scope's steps.
func (e *Enforcer) Guards(live string) (mode devfilter.Mode, scope, problem string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.filter == nil {
		return "", "", "no device filter is attached (Slurm's scope did not exist when the agent started, or attaching failed)"
	}
	mode, scope = e.filter.Mode(), e.scope
	if live != e.scope {
		return mode, scope, fmt.Sprintf("the device filter is on %s, but Slurm's scope is %s", e.scope, live)
	}
	if mode != devfilter.ModeScope {
		return mode, scope, ""
	}
	id, err := e.o.Cgroups.ID(live)
	if err != nil {
		return mode, scope, fmt.Sprintf("Slurm's scope %s: %v", live, err)
	}
	linked, err := e.filter.ScopeCgroupID()
	if err != nil {
		return mode, scope, fmt.Sprintf("the device filter's scope link cannot be read: %v", err)
	}
	if linked != id {
		return mode, scope, fmt.Sprintf("the device filter's link is on cgroup %d, but Slurm's scope %s is cgroup %d (the scope was made again and the link is defunct, or it was detached)", linked, live, id)
	}
	return mode, scope, ""
}

// RefreshSlurmd puts the filter on slurmd's cgroup as it is now: the one
// this node's slurmd runs in (its pid file, just written at its start),
// else the path it was last found at, which systemd made again at a slurmd
// restart before slurmd runs in it. Until the program is on that cgroup
// the child slurmd forks for sbcast opens any GPU there; the watches on
// the pid file and the cgroup's parent call this at once, Reconcile at
// every pass. It reads /proc: never call it holding e.mu.
func (e *Enforcer) RefreshSlurmd() {
	found := e.FindScope()
	slurmd, serr := e.o.Cgroups.Slurmd(found, e.o.Mount, e.slurmdPid())
	e.mu.Lock()
	defer e.mu.Unlock()
	e.refreshSlurmdLocked(slurmd, serr)
}

func (e *Enforcer) slurmdPid() string {
	if e.o.Settings != nil {
		st, _ := e.o.Settings.Get()
		return st.SlurmdPid(e.o.Node)
	}
	return slurm.DefaultSlurmdPidFile
}

// Slurmd is slurmd's cgroup outside the scope that the filter was last put
// on and its id then ("", 0: none).
func (e *Enforcer) Slurmd() (string, uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.slurmdDir, e.slurmdID
}

// refreshSlurmdLocked keeps the scope program and a root-only allow-all
// entry on slurmd's own cgroup when it is outside the scope (found, by
// jobcgroup's rule; "" = at the path last found, where systemd makes it
// again at a restart). The entry goes in before the link, so root
// slurmd's NVML never meets a missing one; the cgroup is an exempt cgroup
// named by its path below the mount, which names it in the audit of a
// denial there. A new cgroup at a known path is audited as a re-attach.
// Per-cgroup mode does nothing here (see docs/security.md). e.mu is held.
func (e *Enforcer) refreshSlurmdLocked(found string, ferr error) {
	if e.filter == nil || e.filter.Mode() != devfilter.ModeScope {
		return
	}
	if ferr != nil {
		e.noteSlurmdLocked("slurmd's cgroup outside the scope cannot be told; the device filter stays where it is", ferr, e.slurmdDir)
	}
	dir := found
	if dir == "" {
		dir = e.slurmdDir
	}
	if dir == "" {
		return
	}
	id, err := e.o.Cgroups.ID(dir)
	if err != nil {
		// Gone: systemd makes it again when slurmd starts.
		return
	}
	name := dir
	if rel, err := filepath.Rel(e.o.Mount, dir); err == nil {
		name = rel
	}
	linked, lerr := e.filter.SlurmdCgroupID()
	have := e.o.Registry.Exempts()
	if lerr == nil && linked == id && have[name].ID == id && dir == e.slurmdDir {
		return
	}
	cg := cgroup.Cgroup{ID: id, Path: dir}
	if have[name].ID != id {
		if err := e.setExemptLocked(name, cg); err != nil {
			e.noteSlurmdLocked("the entry of slurmd's cgroup could not be written; the device filter is not put there", err, dir)
			return
		}
	}
	// What the last cgroup held: a removed cgroup's entry, a moved slurmd.
	for _, old := range []cgroup.Cgroup{have[name], have[e.slurmdName]} {
		if old.ID != 0 && old.ID != id {
			if err := e.filter.Remove(old); err != nil {
				e.o.Log.Error("remove the entry of slurmd's old cgroup", "cgroup", old.Path, "err", err)
			}
		}
	}
	if e.slurmdName != "" && e.slurmdName != name {
		e.o.Registry.SetExempt(e.slurmdName, cgroup.Cgroup{})
	}
	if lerr != nil || linked != id {
		start := time.Now()
		if err := e.filter.AttachSlurmd(dir, id); err != nil {
			e.noteSlurmdLocked("the device filter could not be attached to slurmd's cgroup; a process there that runs as a user (sbcast's) is not narrowed", err, dir)
			return
		}
		took := time.Since(start)
		if e.slurmdID == 0 {
			e.o.Log.Info("device filter attached to slurmd's cgroup outside the scope: every device there is for root only", "cgroup", dir, "cgroup_id", id)
		} else {
			why := fmt.Sprintf("slurmd's cgroup %s is cgroup %d; the device filter's link there was on cgroup %d (link reports %d)", dir, id, e.slurmdID, linked)
			e.o.Log.Warn("device filter re-attached to slurmd's recreated cgroup", "cgroup", dir, "cgroup_id", id, "old_cgroup_id", e.slurmdID, "took", took)
			e.lifecycle(audit.EventFilterReattached, audit.SeverityWarning,
				fmt.Sprintf("slurmd's cgroup was made again (%s); the GPU device filter was re-attached to it in %v", why, took.Round(time.Microsecond)), func(r *audit.Record) {
					r.Cgroup, r.CgroupID, r.Reason = dir, id, why
				})
		}
	}
	if dir != e.slurmdDir && e.o.SlurmdWatch != nil {
		if err := e.o.SlurmdWatch.WatchMade(dir); err != nil {
			e.o.Log.Warn("slurmd's cgroup made again is found by the periodic reconcile only", "cgroup", dir, "err", err)
		}
	}
	e.slurmdDir, e.slurmdName, e.slurmdID = dir, name, id
	if ferr == nil {
		// Over; a pid file that still says nothing stays noted once.
		e.noteSlurmdLocked("", nil, dir)
	}
}

// noteSlurmdLocked logs and audits a problem with slurmd's cgroup once
// while it lasts ("" = it is over). e.mu is held.
func (e *Enforcer) noteSlurmdLocked(msg string, err error, dir string) {
	problem := msg
	if err != nil {
		problem += ": " + err.Error()
	}
	if problem == e.slurmdProblem {
		return
	}
	e.slurmdProblem = problem
	if msg == "" {
		return
	}
	e.o.Log.Error(msg, "cgroup", dir, "err", err)
	e.lifecycle(audit.EventFilterAttachFailed, audit.SeverityError, msg, func(r *audit.Record) {
		r.Cgroup, r.Error = dir, err.Error()
	})
}
