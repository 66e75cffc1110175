// Package daemon is the gpufence node agent: it answers the SPANK plugin,
// keeps each job's trusted GPU list from its prolog, and writes one policy per
// step cgroup into the kernel's device filter.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/server"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/agent/version"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// Log attribute keys (STYLE.md: constant keys).
const (
	keyJob    = "job_id"
	keyStep   = "step_id"
	keyUID    = "uid"
	keyGPU    = "gpu"
	keyCgroup = "cgroup"
)

// Filter is the kernel device filter as the daemon uses it; *devfilter.Filter
// implements it.
type Filter interface {
	Mode() devfilter.Mode
	Set(cg devfilter.Cgroup, p devfilter.Policy) error
	Remove(cg devfilter.Cgroup) error
	ReadEvent() (devfilter.Event, error)
	Suppressed() (map[devfilter.RateKey]uint64, error)
	ForgetRate(cgroupID uint64) error
	Lost() (uint64, error)
	SetAuditOnly(on bool) error
	Policies() (map[uint64]devfilter.Policy, error)
	Close() error
}

// FilterFactory attaches a filter on Slurm's slurmstepd scope directory.
type FilterFactory func(scope string) (Filter, error)

// NewKernelFilter is the FilterFactory for the real kernel filter; opts
// holds everything but the scope.
func NewKernelFilter(opts devfilter.Options) FilterFactory {
	return func(scope string) (Filter, error) {
		o := opts
		o.ScopeDir = scope
		return devfilter.New(o)
	}
}

// Daemon holds the agent's state; Handle is safe for concurrent use.
type Daemon struct {
	cfg       config.Config
	log       *slog.Logger
	mount     string
	gpus      map[int]devices.GPU
	byMinor   map[uint32][]int
	newFilter FilterFactory
	settings  settingsCache
	rec       Recorder
	users     userNames
	supp      suppression
	auditOnly atomic.Bool

	nvidiaMajor uint32
	// capsMajor is the nvidia-caps major (cfg.NvidiaCapsMajor as the caller
	// resolved it); 0: unknown, MIG slices refused.
	capsMajor uint32
	// table is what each GPU index opens (policy.DevicesFor). byMinor and
	// byCaps attribute a device back to the indices that hold it: the MIG
	// slices of one GPU share its minor, the compute instances of one GPU
	// instance its access caps.
	table  map[int]policy.Devices
	byCaps map[uint32][]int

	mu      sync.Mutex
	filter  Filter
	scope   string
	jobs    map[uint32]*job
	owners  map[uint64]owner
	exempts map[string]devfilter.Cgroup
	events  sync.WaitGroup
	// observer follows the jobs' GPUs (metrics, dcgm job mapping).
	observer Observer
	// nvml is what the NVIDIA driver said about Slurm's GPUs (SetInventory);
	// nil without NVML.
	nvml atomic.Pointer[nvmlView]
}

// New builds the daemon: it reads Slurm's GPU table and device numbers, and
// attaches the filter at once when Slurm's scope already exists.
func New(cfg config.Config, log *slog.Logger, newFilter FilterFactory, nvidiaMajor uint32, rec Recorder) (*Daemon, error) {
	mount, err := jobcgroup.Mountpoint()
	if err != nil {
		return nil, err
	}
	d := &Daemon{
		cfg: cfg, log: log.With("component", "agent"), mount: mount, newFilter: newFilter,
		gpus: map[int]devices.GPU{}, table: map[int]policy.Devices{}, byMinor: map[uint32][]int{}, byCaps: map[uint32][]int{},
		jobs: map[uint32]*job{}, owners: map[uint64]owner{}, exempts: map[string]devfilter.Cgroup{},
		settings: settingsCache{path: cfg.SlurmConf},
		rec:      rec, nvidiaMajor: nvidiaMajor, capsMajor: cfg.NvidiaCapsMajor,
	}
	if d.rec == nil {
		d.rec = nopRecorder{}
	}
	d.auditOnly.Store(cfg.Enforcement == config.EnforcementAuditOnly)
	st, err := d.settings.get()
	if err != nil {
		return nil, err
	}
	table, err := slurm.ReadGresGPUs(st.GresConf, cfg.NodeName)
	switch {
	case errors.Is(err, slurm.ErrNoGPUs):
		d.log.Warn("no GPU configured for this node in gres.conf; every job gets no GPU", "gres_conf", st.GresConf, "node", cfg.NodeName)
	case err != nil:
		return nil, err
	}
	resolved, err := devices.Resolve(table, nvidiaMajor, d.capsMajor)
	if err != nil {
		return nil, fmt.Errorf("GPU table from %s: %w", st.GresConf, err)
	}
	for _, g := range resolved {
		d.gpus[g.Index] = g
		d.table[g.Index] = policy.Devices{GPUMinor: g.Minor, CapsMinors: g.CapsMinors()}
		d.byMinor[g.Minor] = append(d.byMinor[g.Minor], g.Index)
		for _, c := range g.Caps {
			d.byCaps[c.Minor] = append(d.byCaps[c.Minor], g.Index)
		}
		if g.MIG {
			d.log.Info("gpu", keyGPU, g.Index, "path", g.Path, "device", fmt.Sprintf("%d:%d", g.Major, g.Minor),
				"mig_slice", g.Type, "caps", fmt.Sprintf("%d:%v", d.capsMajor, g.CapsMinors()))
			continue
		}
		d.log.Info("gpu", keyGPU, g.Index, "path", g.Path, "device", fmt.Sprintf("%d:%d", g.Major, g.Minor))
	}
	saved, _, err := statefile.Read(cfg.StateFile)
	if err != nil {
		d.log.Error("saved agent state unreadable; running jobs lose attribution, their kernel entries stay until their cgroups go", "err", err)
	}
	d.mu.Lock()
	d.restoreLocked(saved)
	d.mu.Unlock()
	if saved != nil && len(saved.Jobs) > 0 {
		d.log.Info("restored jobs from the saved state", "jobs", len(saved.Jobs), "file", cfg.StateFile)
	}
	if scope := d.findScope(); scope != "" {
		d.mu.Lock()
		err := d.attachLocked(scope)
		d.mu.Unlock()
		if err != nil {
			return nil, err
		}
		// Steps that ended while the agent was away.
		d.Reconcile()
	} else {
		d.log.Info("Slurm's slurmstepd scope does not exist yet; the filter is attached when the first step registers", "cgroup_mount", mount)
	}
	return d, nil
}

// findScope returns the configured scope, or this node's slurmstepd scope
// wherever Slurm's CgroupSlice put it (jobcgroup.FindScope).
func (d *Daemon) findScope() string { return jobcgroup.FindScope(d.mount, d.cfg.Scope, d.cfg.NodeName) }

// attachLocked attaches the filter on scope, once. d.mu is held.
func (d *Daemon) attachLocked(scope string) error {
	if d.filter != nil {
		if d.scope != scope {
			return fmt.Errorf("step is under scope %s but the device filter is attached to %s", scope, d.scope)
		}
		return nil
	}
	d.cleanStaleLocked(scope)
	f, err := d.newFilter(scope)
	if err != nil {
		err = fmt.Errorf("attach device filter to %s: %w", scope, err)
		d.lifecycle(audit.EventFilterAttachFailed, audit.SeverityError, "the GPU device filter could not be attached; GPU steps are refused", func(r *audit.Record) {
			r.Cgroup, r.Error = scope, err.Error()
		})
		return err
	}
	d.filter, d.scope = f, scope
	adopted := false
	if a, ok := f.(interface{ Adopted() bool }); ok {
		adopted = a.Adopted()
	}
	d.log.Info("device filter attached", keyCgroup, scope, "mode", f.Mode(), "adopted_pinned", adopted)
	d.events.Add(1)
	go d.readEvents(f)
	d.refreshExemptLocked()
	return nil
}

// refreshExemptLocked keeps an allow-all entry for each exempt child of the
// scope (slurmd, system) and drops entries of ones that vanished.
func (d *Daemon) refreshExemptLocked() {
	if d.filter == nil || d.filter.Mode() == devfilter.ModePerCgroup {
		return
	}
	for _, name := range d.cfg.ExemptCgroups {
		dir := filepath.Join(d.scope, name)
		id, err := jobcgroup.ID(dir)
		old, had := d.exempts[name]
		if had && (err != nil || id != old.ID) {
			if err := d.filter.Remove(old); err != nil {
				d.log.Error("remove exempt entry", keyCgroup, old.Path, "err", err)
			}
			delete(d.exempts, name)
			delete(d.owners, old.ID)
			had = false
		}
		if err != nil || had {
			continue
		}
		cg := devfilter.Cgroup{ID: id, Path: dir}
		if err := d.filter.Set(cg, devfilter.Policy{AllowAll: true}); err != nil {
			d.log.Error("set exempt entry", keyCgroup, dir, "err", err)
			continue
		}
		d.exempts[name] = cg
		d.owners[id] = owner{exempt: name}
		d.log.Info("exempt cgroup keeps all devices", keyCgroup, dir)
	}
}

// Handle answers one plugin request.
func (d *Daemon) Handle(_ context.Context, peer server.Peer, req *pb.Request) *pb.Response {
	var resp *pb.Response
	var err error
	switch m := req.Msg.(type) {
	case *pb.Request_JobProlog:
		err = d.jobProlog(m.JobProlog)
		resp = &pb.Response{}
	case *pb.Request_StepStart:
		resp, err = d.stepStart(peer, m.StepStart)
	case *pb.Request_StepEnd:
		d.stepEnd(m.StepEnd.GetJobId(), m.StepEnd.GetStepId())
		resp = &pb.Response{}
	case *pb.Request_JobEpilog:
		d.jobEpilog(m.JobEpilog.GetJobId())
		resp = &pb.Response{}
	default:
		err = errors.New("empty or unknown request (plugin newer than agent?)")
	}
	if err != nil {
		return &pb.Response{Error: err.Error()}
	}
	return resp
}

func (d *Daemon) jobProlog(m *pb.JobProlog) error {
	j := &job{Job: policy.Job{ID: m.GetJobId(), UID: m.GetUid(), GPUs: []int{}}, steps: map[uint32]*step{}, created: time.Now()}
	log := d.log.With(keyJob, j.ID, keyUID, j.UID)
	if m.JobGpus != nil {
		gpus, err := policy.ParseGPUList(m.GetJobGpus())
		if err != nil {
			j.broken = fmt.Sprintf("job %d: SLURM_JOB_GPUS from the job prolog: %v", j.ID, err)
		}
		for _, g := range gpus {
			if _, ok := d.gpus[g]; !ok {
				j.broken = fmt.Sprintf("job %d was given GPU %d, which is not in this node's GPU table (gres.conf); refusing to guess which device it is", j.ID, g)
			}
		}
		if j.broken == "" {
			j.GPUs = gpus
		}
	}
	d.mu.Lock()
	if old, ok := d.jobs[j.ID]; ok {
		// A requeued job runs its prolog again; keep its live steps.
		j.steps = old.steps
	}
	d.jobs[j.ID] = j
	d.saveLocked()
	d.mu.Unlock()
	if j.broken != "" {
		log.Error("job prolog recorded with an unusable GPU list; its GPU steps will be refused", "reason", j.broken)
		return nil
	}
	log.Info("job prolog recorded", "gpus", policy.FormatGPUList(j.GPUs))
	return nil
}

func (d *Daemon) stepStart(peer server.Peer, m *pb.StepStart) (*pb.Response, error) {
	jobID, stepID := m.GetJobId(), m.GetStepId()
	name := fmt.Sprintf("%d.%s", jobID, policy.StepName(stepID))
	log := d.log.With(keyJob, jobID, keyStep, policy.StepName(stepID), keyUID, m.GetUid())

	// Where the step lives: from slurmstepd's own cgroup, and every task pid
	// must be in the same step.
	lookupFailed := func(err error) error {
		d.lifecycle(audit.EventLookupFailed, audit.SeverityError, "the step's cgroup could not be found; the step is refused", func(r *audit.Record) {
			r.JobID, r.StepID, r.UID, r.User, r.PID, r.Error = jobID, policy.StepName(stepID), audit.UID(m.GetUid()), d.users.get(m.GetUid()), uint32(peer.PID), err.Error()
		})
		return err
	}
	loc, err := jobcgroup.ForPID(d.mount, peer.PID, d.cfg.Scope)
	if err != nil {
		return nil, lookupFailed(fmt.Errorf("step %s: cannot place slurmstepd in Slurm's cgroup tree (%v); gpufence needs CgroupPlugin=cgroup/v2 with ProctrackType=proctrack/cgroup", name, err))
	}
	for _, pid := range m.GetTaskPids() {
		tl, err := jobcgroup.ForPID(d.mount, int(pid), d.cfg.Scope)
		if err != nil {
			return nil, lookupFailed(fmt.Errorf("step %s: task pid %d: %v", name, pid, err))
		}
		if tl.Step != loc.Step {
			return nil, lookupFailed(fmt.Errorf("step %s: task pid %d is in %s, not in its step's cgroup %s", name, pid, tl.Step, loc.Step))
		}
	}
	cgID, err := jobcgroup.ID(loc.Step)
	if err != nil {
		return nil, lookupFailed(fmt.Errorf("step %s: %v", name, err))
	}
	cg := devfilter.Cgroup{ID: cgID, Path: loc.Step}
	st, err := d.settings.get()
	if err != nil {
		return nil, fmt.Errorf("step %s: %v", name, err)
	}

	d.mu.Lock()
	_, known := d.jobs[jobID]
	d.mu.Unlock()
	if !known && d.cfg.RecoverFromSlurmctld {
		d.recoverJob(jobID, m.GetUid())
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.attachLocked(loc.Scope); err != nil {
		return nil, fmt.Errorf("step %s: %v", name, err)
	}
	// Slurm makes its stepd parking cgroup when the first step starts.
	d.refreshExemptLocked()
	j := d.jobs[jobID]
	var pj *policy.Job
	if j != nil {
		if j.UID != m.GetUid() {
			return nil, fmt.Errorf("step %s runs as uid %d but the job's prolog recorded uid %d", name, m.GetUid(), j.UID)
		}
		if j.broken != "" {
			return nil, errors.New(j.broken)
		}
		if !j.noProlog {
			pj = &j.Job
		}
	}
	dec, err := policy.ForStep(pj, jobID, stepID, m.StepGpus)
	if err != nil {
		return nil, err
	}
	if why := d.untrustedTable(); why != "" && len(dec.GPUs) > 0 {
		return nil, fmt.Errorf("step %s: %s", name, why)
	}
	if dec.Note != "" {
		log.Warn(dec.Note)
	}
	set, err := policy.DevicesFor(d.table, dec.GPUs)
	if err != nil {
		return nil, fmt.Errorf("step %s: %v", name, err)
	}
	p := devfilter.Policy{GPUMinors: set.GPUMinors, CapsMinors: set.CapsMinors}
	if j != nil {
		if prev := j.steps[stepID]; prev != nil && prev.cg.ID == cg.ID && slices.Equal(prev.gpus, dec.GPUs) {
			return d.stepResponse(dec.GPUs, st), nil
		}
	}
	if err := d.filter.Set(cg, p); err != nil {
		return nil, fmt.Errorf("step %s: cannot install its GPU policy: %v", name, err)
	}
	if j == nil {
		// No prolog (CPU-only use only, see policy.ForStep): keep a record
		// so the step's entry is removed when it ends.
		j = &job{Job: policy.Job{ID: jobID, UID: m.GetUid(), GPUs: []int{}}, steps: map[uint32]*step{}, noProlog: true, created: time.Now()}
		d.jobs[jobID] = j
		d.lifecycle(audit.EventJobWithoutProlog, audit.SeverityWarning, dec.Note, func(r *audit.Record) {
			r.JobID, r.StepID, r.UID, r.User = jobID, policy.StepName(stepID), audit.UID(m.GetUid()), d.users.get(m.GetUid())
		})
	}
	j.steps[stepID] = &step{jobID: jobID, stepID: stepID, uid: m.GetUid(), cg: cg, gpus: dec.GPUs}
	j.dir = loc.Job
	d.owners[cg.ID] = owner{jobID: jobID, stepID: stepID, uid: m.GetUid()}
	d.saveLocked()
	log.Info("step policy applied", "gpus", policy.FormatGPUList(dec.GPUs), keyCgroup, cg.Path)
	d.lifecycle(audit.EventPolicyApplied, audit.SeverityInfo,
		fmt.Sprintf("job %d step %s may open GPUs [%s]", jobID, policy.StepName(stepID), policy.FormatGPUList(dec.GPUs)), func(r *audit.Record) {
			r.JobID, r.StepID, r.UID, r.User = jobID, policy.StepName(stepID), audit.UID(m.GetUid()), d.users.get(m.GetUid())
			r.GPUs, r.Cgroup, r.CgroupID, r.PolicyMode = append([]int{}, dec.GPUs...), cg.Path, cg.ID, d.policyMode()
		})
	return d.stepResponse(dec.GPUs, st), nil
}

// recoverJob asks slurmctld for the GPUs of a job the agent has no prolog
// record of, and records them as its trusted list; either way it is audited.
func (d *Daemon) recoverJob(jobID, uid uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gpus, found, err := slurm.JobGPUsFromController(ctx, d.cfg.SlurmConf, jobID, d.cfg.NodeName)
	msg := ""
	switch {
	case err != nil:
		msg = fmt.Sprintf("job %d has no prolog record and slurmctld could not be asked (%v); its steps get no GPU", jobID, err)
	case !found:
		msg = fmt.Sprintf("job %d has no prolog record and slurmctld lists no allocation of it on %s; its steps get no GPU", jobID, d.cfg.NodeName)
	}
	var broken string
	for _, g := range gpus {
		if _, ok := d.gpus[g]; !ok {
			broken = fmt.Sprintf("job %d holds GPU %d per slurmctld, which is not in this node's GPU table (gres.conf); refusing to guess which device it is", jobID, g)
		}
	}
	if msg != "" {
		d.log.Warn(msg, keyJob, jobID)
		d.lifecycle(audit.EventJobWithoutProlog, audit.SeverityWarning, msg, func(r *audit.Record) {
			r.JobID, r.UID, r.User = jobID, audit.UID(uid), d.users.get(uid)
		})
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.jobs[jobID]; ok {
		return // a prolog raced us
	}
	j := &job{Job: policy.Job{ID: jobID, UID: uid, GPUs: gpus}, broken: broken, steps: map[uint32]*step{}, created: time.Now()}
	if broken != "" {
		j.GPUs = []int{}
	}
	d.jobs[jobID] = j
	d.saveLocked()
	msg = fmt.Sprintf("job %d had no prolog record; its trusted GPU list [%s] was recovered from slurmctld", jobID, policy.FormatGPUList(gpus))
	d.log.Warn(msg, keyJob, jobID)
	d.lifecycle(audit.EventJobWithoutProlog, audit.SeverityWarning, msg, func(r *audit.Record) {
		r.JobID, r.UID, r.User, r.GPUs = jobID, audit.UID(uid), d.users.get(uid), append([]int{}, gpus...)
	})
}

func (d *Daemon) stepResponse(gpus []int, st slurm.Settings) *pb.Response {
	r := &pb.Response{SlurmLocalIndices: st.LocalGPUIndices()}
	for _, g := range gpus {
		r.Gpus = append(r.Gpus, uint32(g))
	}
	return r
}

func (d *Daemon) stepEnd(jobID, stepID uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	j := d.jobs[jobID]
	if j == nil || j.steps[stepID] == nil {
		return
	}
	d.removeStepLocked(j, j.steps[stepID], "step ended")
	d.saveLocked()
}

func (d *Daemon) jobEpilog(jobID uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	j := d.jobs[jobID]
	if j == nil {
		return
	}
	for _, s := range j.steps {
		d.removeStepLocked(j, s, "job ended")
	}
	delete(d.jobs, jobID)
	d.saveLocked()
	d.log.Info("job released", keyJob, jobID)
}

func (d *Daemon) removeStepLocked(j *job, s *step, why string) {
	if d.filter != nil {
		if err := d.filter.Remove(s.cg); err != nil {
			d.log.Error("remove step policy", keyJob, s.jobID, keyStep, policy.StepName(s.stepID), keyCgroup, s.cg.Path, "err", err)
		}
	}
	delete(j.steps, s.stepID)
	delete(d.owners, s.cg.ID)
	d.supp.mu.Lock()
	if d.supp.forget == nil {
		d.supp.forget = map[uint64]owner{}
	}
	d.supp.forget[s.cg.ID] = owner{jobID: s.jobID, stepID: s.stepID, uid: s.uid}
	d.supp.mu.Unlock()
	d.log.Info("step policy removed", keyJob, s.jobID, keyStep, policy.StepName(s.stepID), "reason", why)
	d.lifecycle(audit.EventPolicyReleased, audit.SeverityInfo, fmt.Sprintf("job %d step %s released (%s)", s.jobID, policy.StepName(s.stepID), why), func(r *audit.Record) {
		r.JobID, r.StepID, r.UID, r.User = s.jobID, policy.StepName(s.stepID), audit.UID(s.uid), d.users.get(s.uid)
		r.Cgroup, r.CgroupID, r.Reason = s.cg.Path, s.cg.ID, why
		r.GPUs = append([]int{}, s.gpus...)
	})
}

// Reconcile removes the entries of step cgroups that no longer exist (a
// slurmstepd that died without its exit callback) and refreshes the exempt
// entries.
func (d *Daemon) Reconcile() {
	d.ingestFailOpen()
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := false
	for _, j := range d.jobs {
		for _, s := range j.steps {
			if id, err := jobcgroup.ID(s.cg.Path); err != nil || id != s.cg.ID {
				d.removeStepLocked(j, s, "step cgroup vanished")
				changed = true
			}
		}
	}
	// A job whose epilog never came (agent down then, or the epilog
	// failed): once it has no step left and its cgroup is gone, or it never
	// had a step for an hour, its record goes too.
	for id, j := range d.jobs {
		if len(j.steps) > 0 {
			continue
		}
		gone := false
		if j.dir != "" {
			_, err := os.Stat(j.dir)
			gone = err != nil
		} else {
			gone = !j.created.IsZero() && time.Since(j.created) > time.Hour
		}
		if gone {
			delete(d.jobs, id)
			changed = true
			d.log.Info("job record dropped: no step left and its cgroup is gone (its epilog never reached the agent)", keyJob, id)
		}
	}
	if changed {
		d.saveLocked()
	}
	d.sweepOrphansLocked()
	if d.filter == nil {
		if scope := d.findScope(); scope != "" {
			if err := d.attachLocked(scope); err != nil {
				d.log.Error("attach device filter", "err", err)
			}
		}
		return
	}
	d.refreshExemptLocked()
}

// Run reconciles periodically until ctx ends, then detaches the filter.
func (d *Daemon) Run(ctx context.Context) error {
	t := time.NewTicker(d.cfg.ReconcileInterval.Duration)
	defer t.Stop()
	flush := time.NewTicker(d.cfg.Audit.FlushInterval.Duration)
	defer flush.Stop()
	for {
		select {
		case <-ctx.Done():
			return d.Close()
		case <-t.C:
			d.Reconcile()
		case <-flush.C:
			d.mu.Lock()
			f := d.filter
			d.mu.Unlock()
			if f != nil {
				d.flushAudit(f)
			}
		}
	}
}

// Healthy returns once the daemon's state lock could be taken; the systemd
// watchdog pings only after it returns, so a wedged agent gets restarted.
func (d *Daemon) Healthy() {
	d.mu.Lock()
	defer d.mu.Unlock()
}

// SetAuditOnly switches between enforcing and audit-only at run time.
func (d *Daemon) SetAuditOnly(on bool) error {
	d.auditOnly.Store(on)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.filter == nil {
		return nil
	}
	return d.filter.SetAuditOnly(on)
}

// Close detaches the filter and waits for the event reader.
func (d *Daemon) Close() error {
	d.mu.Lock()
	f := d.filter
	d.filter = nil
	d.mu.Unlock()
	if f == nil {
		return nil
	}
	d.flushAudit(f)
	err := f.Close()
	d.events.Wait()
	return err
}

// readEvents records each access the kernel reported, attributed to its
// job, step and user.
func (d *Daemon) readEvents(f Filter) {
	defer d.events.Done()
	for {
		ev, err := f.ReadEvent()
		if err != nil {
			if !errors.Is(err, devfilter.ErrClosed) {
				d.log.Error("device filter event reader stopped", "err", err)
			}
			return
		}
		d.mu.Lock()
		o, known := d.owners[ev.CgroupID]
		d.mu.Unlock()
		key := devfilter.RateKey{CgroupID: ev.CgroupID, Major: ev.Major, Minor: ev.Minor, Decision: ev.Decision}
		r := d.accessRecord(ev, o, known, d.supp.take(key, ev.Suppressed))
		d.rec.Emit(r)
		attrs := []any{"decision", r.Decision, "pid", ev.TGID, "comm", ev.Comm, keyUID, ev.UID,
			"device", fmt.Sprintf("%d:%d", ev.Major, ev.Minor), "access", ev.Access.String(), "cgroup_id", ev.CgroupID}
		if r.GPU != nil {
			attrs = append(attrs, keyGPU, r.GPU.Index)
		}
		if r.StepID != "" {
			attrs = append(attrs, keyJob, r.JobID, keyStep, r.StepID)
		} else if !known {
			attrs = append(attrs, "note", "cgroup has no policy entry (job without a registered step)")
		}
		if ev.Decision == devfilter.DecisionAllowed {
			d.log.Info("GPU access allowed", attrs...)
		} else {
			d.log.Warn("GPU access "+r.Decision, attrs...)
		}
	}
}

// Version is logged at start.
func Version() string { return version.Version }
