// SPDX-License-Identifier: Apache-2.0

// Package registry holds the agent's records of the node: each job's
// trusted GPU list, each registered step and the cgroup its kernel entry
// is keyed by, and Slurm's own exempt cgroups. It has its own lock, held
// only for map updates, never across I/O other than the pinned store's map
// updates (microseconds). Every change is written through to the store
// before it is visible, is published as an immutable View for the
// attribution stage (which so shares no lock with requests), and wakes the
// persistence writer and the observer.
package registry

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/store"
)

// Job is one job's record.
type Job struct {
	ID, UID uint32
	// GPUs is the trusted ceiling, ascending.
	GPUs []int
	// Broken, when set, is why the job's trusted list could not be used;
	// every GPU step of the job is refused with it (fail closed).
	Broken string
	// NoProlog marks a placeholder for a step whose job sent no prolog; it
	// carries no trusted list.
	NoProlog bool
	// Recovered names the slurmctld output the list was read from, when it
	// did not come from the prolog.
	Recovered string
	// Adopted, when set, says the job was running when the agent started
	// with no record of it, and what came of asking slurmctld.
	Adopted string
	// Unconfirmed is how an adopted job whose GPUs slurmctld did not
	// confirm is handled: UnconfirmedAuditOnly or UnconfirmedDeny; "" for
	// every other job.
	Unconfirmed string
	// Dir is the job's cgroup, once a step showed it.
	Dir string
	// Created is when the record was made; Stepless since when it has no
	// step (zero while it has one).
	Created, Stepless time.Time
	// NextCheck and CheckEvery pace asking slurmctld whether a job with no
	// step left has ended.
	NextCheck  time.Time
	CheckEvery time.Duration
}

// Step is one registered step.
type Step struct {
	JobID, StepID, UID uint32
	Cgroup             cgroup.Cgroup
	GPUs               []int
	// AuditOnly: the step's kernel entry allows what GPUs does not grant
	// and reports it (a step of an unconfirmed job, audit-only).
	AuditOnly bool
	// Adopted: the step was running when the agent adopted its job; it
	// holds the job's whole list.
	Adopted bool
	// IMEXChannels is the IMEX channel the step may open (none or one), as
	// the agent read it from slurmstepd's namespace (StepChannel).
	IMEXChannels []uint32
	// Tasks are the step's task cgroups that have a kernel entry of their
	// own (task_binding: slurm), removed with the step's.
	Tasks []cgroup.Cgroup
}

// How an unconfirmed adopted job is handled (config adopt_unconfirmed).
const (
	UnconfirmedAuditOnly = "audit-only"
	UnconfirmedDeny      = "deny"
)

// Owner is what a cgroup id stands for, for attributing kernel events.
type Owner struct {
	JobID, StepID, UID uint32
	// Exempt names Slurm's cgroup (system, slurmd) the id is, if it is one.
	Exempt string
	// GPUs are the step's.
	GPUs []int
}

// View is an immutable copy of who owns which cgroup, for attribution.
type View struct {
	owners map[uint64]Owner
}

// Owner returns what cgroup id stands for.
func (v *View) Owner(id uint64) (Owner, bool) {
	if v == nil {
		return Owner{}, false
	}
	o, ok := v.owners[id]
	return o, ok
}

type job struct {
	Job
	steps map[uint32]*Step
}

// Registry is the node's records.
type Registry struct {
	log   *slog.Logger
	store Store // nil: memory only

	mu      sync.Mutex
	jobs    map[uint32]*job
	exempts map[string]cgroup.Cgroup
	owners  map[uint64]Owner

	view     atomic.Pointer[View]
	changed  chan struct{}
	observer func([]Job)
	// watcher is a second observer (AddWatcher), beside SetObserver's.
	watcher func([]Job)
}

// Store is where records are written through to, so they outlive the
// agent; *store.Store (the pinned maps) implements it.
type Store interface {
	PutJob(store.Job) error
	DeleteJob(id uint32) error
	PutStep(store.Step) error
	DeleteStep(cgroupID uint64) error
	Jobs() ([]store.Job, error)
	Steps() ([]store.Step, error)
}

// New returns an empty registry writing through to st (nil: none).
func New(st Store, log *slog.Logger) *Registry {
	r := &Registry{log: log, store: st, jobs: map[uint32]*job{}, exempts: map[string]cgroup.Cgroup{},
		owners: map[uint64]Owner{}, changed: make(chan struct{}, 1)}
	r.view.Store(&View{owners: map[uint64]Owner{}})
	return r
}

// Changed receives a value after changes (coalesced): the persistence
// writer's wake-up.
func (r *Registry) Changed() <-chan struct{} { return r.changed }

// SetObserver registers fn, called after every change of the jobs with
// all of them (restored ones included, at once). It runs with the
// registry's lock held: it must only take the value.
func (r *Registry) SetObserver(fn func([]Job)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.observer = fn
	r.publishLocked()
}

// AddWatcher registers fn as SetObserver does, beside the observer.
func (r *Registry) AddWatcher(fn func([]Job)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watcher = fn
	r.publishLocked()
}

// Touch wakes the persistence writer: something the state file shows
// besides the records changed.
func (r *Registry) Touch() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// View returns the current owners, for attribution; never blocks.
func (r *Registry) View() *View { return r.view.Load() }

// publishLocked makes a change visible: a new View, the writer woken, the
// observer told. r.mu is held.
func (r *Registry) publishLocked() {
	owners := make(map[uint64]Owner, len(r.owners))
	for id, o := range r.owners {
		owners[id] = o
	}
	r.view.Store(&View{owners: owners})
	select {
	case r.changed <- struct{}{}:
	default:
	}
	if r.observer != nil || r.watcher != nil {
		jobs := r.jobsLocked()
		if r.observer != nil {
			r.observer(jobs)
		}
		if r.watcher != nil {
			r.watcher(jobs)
		}
	}
}

func (r *Registry) jobsLocked() []Job {
	out := make([]Job, 0, len(r.jobs))
	for _, j := range r.jobs {
		c := j.Job
		c.GPUs = slices.Clone(j.GPUs)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Job) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func (r *Registry) putJobLocked(j Job) {
	if r.store == nil {
		return
	}
	if err := r.store.PutJob(store.Job{ID: j.ID, UID: j.UID, Flags: storeFlags(j), GPUs: j.GPUs, CreatedUnixNano: j.Created.UnixNano()}); err != nil {
		r.log.Error("store job record; a crash now would lose it (slurmctld is asked then)", "job_id", j.ID, "err", err)
	}
}

func (r *Registry) putStepLocked(s *Step) {
	if r.store == nil {
		return
	}
	if err := r.store.PutStep(store.Step{CgroupID: s.Cgroup.ID, JobID: s.JobID, StepID: s.StepID, UID: s.UID, Flags: StepFlags(*s), GPUs: s.GPUs, Cgroup: s.Cgroup.Path}); err != nil {
		r.log.Error("store step record; a crash now would lose its attribution", "job_id", s.JobID, "err", err)
	}
}

func (r *Registry) deleteStepLocked(id uint64) {
	if r.store != nil {
		if err := r.store.DeleteStep(id); err != nil {
			r.log.Error("forget stored step", "cgroup_id", id, "err", err)
		}
	}
}

// Prolog records j from its job prolog, the trusted source. A record of the
// same job (a requeued job runs its prolog again) keeps its live steps.
func (r *Registry) Prolog(j Job) {
	j.GPUs = slices.Clone(j.GPUs)
	r.mu.Lock()
	defer r.mu.Unlock()
	nj := &job{Job: j, steps: map[uint32]*Step{}}
	if old, ok := r.jobs[j.ID]; ok {
		nj.steps, nj.Dir = old.steps, old.Dir
	}
	r.putJobLocked(j)
	r.jobs[j.ID] = nj
	r.publishLocked()
}

// Recovered records j, whose list slurmctld gave, unless a record with a
// trusted list exists (a prolog came meanwhile); a placeholder's steps are
// kept. It reports whether j was recorded. An unconfirmed adopted job's
// record is replaced by Confirm, not here.
func (r *Registry) Recovered(j Job) bool {
	j.GPUs = slices.Clone(j.GPUs)
	r.mu.Lock()
	defer r.mu.Unlock()
	nj := &job{Job: j, steps: map[uint32]*Step{}}
	if old, ok := r.jobs[j.ID]; ok {
		if !old.NoProlog || old.Unconfirmed != "" {
			return false
		}
		nj.steps, nj.Dir = old.steps, old.Dir
	}
	r.putJobLocked(j)
	r.jobs[j.ID] = nj
	r.publishLocked()
	return true
}

// Adopt records a running job the agent found with no record at start,
// with the steps it found, unless a record exists meanwhile. It reports
// whether it recorded the job.
func (r *Registry) Adopt(j Job, steps []Step) bool {
	j.GPUs = slices.Clone(j.GPUs)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.jobs[j.ID]; ok {
		return false
	}
	nj := &job{Job: j, steps: map[uint32]*Step{}}
	r.putJobLocked(j)
	for _, s := range steps {
		s.GPUs = slices.Clone(s.GPUs)
		st := s
		r.putStepLocked(&st)
		nj.steps[s.StepID] = &st
		r.owners[s.Cgroup.ID] = Owner{JobID: s.JobID, StepID: s.StepID, UID: s.UID, GPUs: s.GPUs}
	}
	if len(nj.steps) == 0 {
		nj.Stepless = time.Now()
	}
	r.jobs[j.ID] = nj
	r.publishLocked()
	return true
}

// Confirm replaces an unconfirmed adopted job's record with j, whose list
// slurmctld has now given, and narrows its steps to it: an adopted step
// holds the whole list, a later one what it asked for within it. It
// returns the steps as they now are, for their kernel entries; ok is false
// when the job is not (or no longer) unconfirmed.
func (r *Registry) Confirm(j Job) (steps []Step, ok bool) {
	j.GPUs = slices.Clone(j.GPUs)
	r.mu.Lock()
	defer r.mu.Unlock()
	old, had := r.jobs[j.ID]
	if !had || old.Unconfirmed == "" {
		return nil, false
	}
	j.Dir, j.Stepless = old.Dir, old.Stepless
	old.Job = j
	r.putJobLocked(j)
	for _, s := range old.steps {
		if s.Adopted {
			s.GPUs = slices.Clone(j.GPUs)
		} else {
			s.GPUs = slices.DeleteFunc(slices.Clone(s.GPUs), func(g int) bool { return !slices.Contains(j.GPUs, g) })
		}
		s.AuditOnly = false
		r.putStepLocked(s)
		r.owners[s.Cgroup.ID] = Owner{JobID: s.JobID, StepID: s.StepID, UID: s.UID, GPUs: s.GPUs}
		steps = append(steps, *s)
	}
	r.publishLocked()
	return steps, true
}

// Deny turns an unconfirmed adopted job to deny with why (slurmctld's
// later answer was ambiguous): its steps hold no GPU. It returns the steps
// for their kernel entries; ok is false when the job is not unconfirmed.
func (r *Registry) Deny(id uint32, why string) (steps []Step, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, had := r.jobs[id]
	if !had || j.Unconfirmed == "" {
		return nil, false
	}
	j.Unconfirmed, j.Adopted, j.GPUs = UnconfirmedDeny, why, []int{}
	r.putJobLocked(j.Job)
	for _, s := range j.steps {
		s.GPUs, s.AuditOnly = []int{}, false
		r.putStepLocked(s)
		r.owners[s.Cgroup.ID] = Owner{JobID: s.JobID, StepID: s.StepID, UID: s.UID, GPUs: s.GPUs}
		steps = append(steps, *s)
	}
	r.publishLocked()
	return steps, true
}

// Job returns job id's record.
func (r *Registry) Job(id uint32) (Job, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, ok := r.jobs[id]
	if !ok {
		return Job{}, false
	}
	c := j.Job
	c.GPUs = slices.Clone(j.GPUs)
	return c, true
}

// Step returns a registered step.
func (r *Registry) Step(jobID, stepID uint32) (Step, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, ok := r.jobs[jobID]
	if !ok || j.steps[stepID] == nil {
		return Step{}, false
	}
	return *j.steps[stepID], true
}

// AddStep registers s in the job's record, made as a placeholder when the
// job has none (a step without prolog: CPU-only use only). It reports
// whether it made the placeholder.
func (r *Registry) AddStep(s Step, jobDir string) (placeholder bool) {
	s.GPUs = slices.Clone(s.GPUs)
	r.mu.Lock()
	defer r.mu.Unlock()
	j, ok := r.jobs[s.JobID]
	if !ok {
		j = &job{Job: Job{ID: s.JobID, UID: s.UID, GPUs: []int{}, NoProlog: true, Created: time.Now()}, steps: map[uint32]*Step{}}
		r.putJobLocked(j.Job)
		r.jobs[s.JobID] = j
		placeholder = true
	}
	if prev := j.steps[s.StepID]; prev != nil && prev.Cgroup.ID != s.Cgroup.ID {
		delete(r.owners, prev.Cgroup.ID)
		r.deleteStepLocked(prev.Cgroup.ID)
	}
	if prev := j.steps[s.StepID]; prev != nil {
		for _, t := range prev.Tasks {
			delete(r.owners, t.ID)
		}
	}
	s.Tasks = nil
	r.putStepLocked(&s)
	j.steps[s.StepID] = &s
	j.Dir, j.Stepless = jobDir, time.Time{}
	r.owners[s.Cgroup.ID] = Owner{JobID: s.JobID, StepID: s.StepID, UID: s.UID, GPUs: s.GPUs}
	r.publishLocked()
	return placeholder
}

// SetIMEX records the IMEX channels of the step registered on cgroup id
// (written through to the store) and returns the step; false when no such
// step is registered, or it is another job's or step's.
func (r *Registry) SetIMEX(jobID, stepID uint32, id uint64, channels []uint32) (Step, bool, error) {
	if _, err := store.IMEXFlags(channels); err != nil {
		return Step{}, false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	j, ok := r.jobs[jobID]
	if !ok || j.steps[stepID] == nil || j.steps[stepID].Cgroup.ID != id {
		return Step{}, false, nil
	}
	s := j.steps[stepID]
	s.IMEXChannels = slices.Clone(channels)
	r.putStepLocked(s)
	return *s, true, nil
}

// AddTask records task, a task cgroup of the step registered on cgroup
// stepCg, as having a kernel entry of its own, attributed to the step. It
// returns the step; gpus are the task's, for attribution; false when no such step is registered (it ended, or
// was registered again on another cgroup).
func (r *Registry) AddTask(jobID, stepID uint32, stepCg uint64, task cgroup.Cgroup, gpus []int) (Step, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, ok := r.jobs[jobID]
	if !ok || j.steps[stepID] == nil || j.steps[stepID].Cgroup.ID != stepCg {
		return Step{}, false
	}
	s := j.steps[stepID]
	if !slices.ContainsFunc(s.Tasks, func(t cgroup.Cgroup) bool { return t.ID == task.ID }) {
		s.Tasks = append(slices.Clone(s.Tasks), task)
	}
	r.owners[task.ID] = Owner{JobID: s.JobID, StepID: s.StepID, UID: s.UID, GPUs: slices.Clone(gpus)}
	r.publishLocked()
	return *s, true
}

// RemoveStep forgets a step, if registered, and returns it.
func (r *Registry) RemoveStep(jobID, stepID uint32) (Step, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, ok := r.jobs[jobID]
	if !ok || j.steps[stepID] == nil {
		return Step{}, false
	}
	s := r.removeStepLocked(j, stepID)
	r.publishLocked()
	return s, true
}

// RemoveCgroup forgets the step registered on cgroup id, if any.
func (r *Registry) RemoveCgroup(id uint64) (Step, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.owners[id]
	if !ok || o.Exempt != "" {
		return Step{}, false
	}
	j := r.jobs[o.JobID]
	if j == nil || j.steps[o.StepID] == nil || j.steps[o.StepID].Cgroup.ID != id {
		return Step{}, false
	}
	s := r.removeStepLocked(j, o.StepID)
	r.publishLocked()
	return s, true
}

func (r *Registry) removeStepLocked(j *job, stepID uint32) Step {
	s := *j.steps[stepID]
	delete(j.steps, stepID)
	delete(r.owners, s.Cgroup.ID)
	for _, t := range s.Tasks {
		delete(r.owners, t.ID)
	}
	r.deleteStepLocked(s.Cgroup.ID)
	if len(j.steps) == 0 {
		j.Stepless = time.Now()
	}
	return s
}

// DropJob forgets a job and its steps, and returns the steps.
func (r *Registry) DropJob(id uint32) []Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, ok := r.jobs[id]
	if !ok {
		return nil
	}
	var out []Step
	for sid := range j.steps {
		out = append(out, r.removeStepLocked(j, sid))
	}
	delete(r.jobs, id)
	if r.store != nil {
		if err := r.store.DeleteJob(id); err != nil {
			r.log.Error("forget stored job", "job_id", id, "err", err)
		}
	}
	r.publishLocked()
	return out
}

// DropIf forgets job id only if it still has no step and was not
// replaced since it was read as was (a prolog or a step came meanwhile).
func (r *Registry) DropIf(id uint32, was Job) bool {
	r.mu.Lock()
	j, ok := r.jobs[id]
	same := ok && len(j.steps) == 0 && j.Created.Equal(was.Created) && j.NoProlog == was.NoProlog
	r.mu.Unlock()
	if !same {
		return false
	}
	r.DropJob(id)
	return true
}

// SetCheck records when to ask slurmctld about job id's end again.
func (r *Registry) SetCheck(id uint32, next time.Time, every time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if j, ok := r.jobs[id]; ok {
		j.NextCheck, j.CheckEvery = next, every
	}
}

// Jobs returns every job record.
func (r *Registry) Jobs() []Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.jobsLocked()
}

// Steps returns every registered step.
func (r *Registry) Steps() []Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Step
	for _, j := range r.jobs {
		for _, s := range j.steps {
			out = append(out, *s)
		}
	}
	slices.SortFunc(out, func(a, b Step) int {
		return cmp.Or(cmp.Compare(a.JobID, b.JobID), cmp.Compare(a.StepID, b.StepID))
	})
	return out
}

// HoldsGPUs reports whether a kernel entry was made from the GPU table: a
// registered step holds a GPU or is audit-only, or an adopted job is not
// confirmed yet (its steps' lists may change with the table).
func (r *Registry) HoldsGPUs() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range r.jobs {
		if j.Unconfirmed != "" {
			return true
		}
		for _, s := range j.steps {
			if len(s.GPUs) > 0 || s.AuditOnly {
				return true
			}
		}
	}
	return false
}

// StepsOf returns job id's registered steps.
func (r *Registry) StepsOf(id uint32) []Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Step
	if j, ok := r.jobs[id]; ok {
		for _, s := range j.steps {
			out = append(out, *s)
		}
	}
	return out
}

// SetExempt records Slurm's cgroup name (system, slurmd) as cg; a zero cg
// forgets it.
func (r *Registry) SetExempt(name string, cg cgroup.Cgroup) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.exempts[name]; ok {
		delete(r.owners, old.ID)
		delete(r.exempts, name)
	}
	if cg.ID != 0 {
		r.exempts[name] = cg
		r.owners[cg.ID] = Owner{Exempt: name}
	}
	r.publishLocked()
}

// Exempts returns Slurm's exempt cgroups by name.
func (r *Registry) Exempts() map[string]cgroup.Cgroup {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]cgroup.Cgroup, len(r.exempts))
	for n, cg := range r.exempts {
		out[n] = cg
	}
	return out
}

// Owned reports whether a step or exempt cgroup is registered with id.
func (r *Registry) Owned(id uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.owners[id]
	return ok
}

// Restore takes records back at start (from the store, or an older
// agent's state file), without writing them again.
func (r *Registry) Restore(jobs []Job, steps []Step) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range jobs {
		if j.GPUs == nil {
			j.GPUs = []int{}
		}
		r.jobs[j.ID] = &job{Job: j, steps: map[uint32]*Step{}}
	}
	for _, s := range steps {
		j, ok := r.jobs[s.JobID]
		if !ok {
			// A step whose job record was lost: a placeholder keeps its
			// attribution; it carries no trusted list.
			j = &job{Job: Job{ID: s.JobID, UID: s.UID, GPUs: []int{}, NoProlog: true, Created: time.Now()}, steps: map[uint32]*Step{}}
			r.jobs[s.JobID] = j
		}
		st := s
		j.steps[s.StepID] = &st
		r.owners[s.Cgroup.ID] = Owner{JobID: s.JobID, StepID: s.StepID, UID: s.UID, GPUs: s.GPUs}
	}
	r.publishLocked()
}

// WriteAll writes every record into the store (records restored from an
// older agent's state file).
func (r *Registry) WriteAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range r.jobs {
		r.putJobLocked(j.Job)
		for _, s := range j.steps {
			r.putStepLocked(s)
		}
	}
}

// Counts is what the registry holds now, for gauges.
type Counts struct {
	Jobs, Steps, Exempt int
}

// Counts returns how many jobs, steps and exempt cgroups are recorded.
func (r *Registry) Counts() Counts {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := Counts{Jobs: len(r.jobs), Exempt: len(r.exempts)}
	for _, j := range r.jobs {
		c.Steps += len(j.steps)
	}
	return c
}

// Busy reports whether the registry's lock is held at this moment: a check
// (for tests) that no slow call, such as a user-name lookup, runs under it.
func (r *Registry) Busy() bool {
	if r.mu.TryLock() {
		r.mu.Unlock()
		return false
	}
	return true
}
