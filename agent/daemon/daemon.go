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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/cgwatch"
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
	RateFull() (map[devfilter.Decision]uint64, error)
	SetAuditOnly(on bool) error
	Policies() (map[uint64]devfilter.Policy, error)
	// ScopeCgroupID and Reattach are for ModeScope: the cgroup the scope
	// link is on (0 or a stale id once that cgroup is gone), and moving the
	// program onto the scope as it is now.
	ScopeCgroupID() (uint64, error)
	Reattach(scope string) error
	Close() error
}

// JobSource is slurmctld as the daemon asks it about jobs it has no prolog
// record of, or whose end it did not see; *slurm.Controller implements it.
type JobSource interface {
	Job(ctx context.Context, id uint32) (slurm.ControllerJob, error)
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

	// ctld answers for jobs without a prolog record and for jobs whose
	// end the agent may have missed.
	ctld JobSource
	// watch tells when a registered step's cgroup is removed: the step's
	// end, which the plugin does not send. nil when inotify failed; then
	// Reconcile alone finds ended steps.
	watch *cgwatch.Watcher

	mu     sync.Mutex
	filter Filter
	scope  string
	// scopeID is the scope's cgroup id when the filter was attached (scope
	// mode): a scope made again at the same path has another.
	scopeID uint64
	jobs    map[uint32]*job
	// asked is when slurmctld was last asked for a job's GPUs (recovery).
	asked map[uint32]time.Time
	// ended are per-cgroup mode entries of ended steps, kept deny-all
	// until their cgroup is gone.
	ended   map[uint64]devfilter.Cgroup
	owners  map[uint64]owner
	exempts map[string]devfilter.Cgroup
	events  sync.WaitGroup
	// observer follows the jobs' GPUs (metrics, dcgm job mapping).
	observer Observer
	// spoolWarned: the fail-open spool's bad ownership was reported; only
	// Reconcile's goroutine reads the spool.
	spoolWarned bool
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
		asked: map[uint32]time.Time{}, ended: map[uint64]devfilter.Cgroup{},
		settings: settingsCache{path: cfg.SlurmConf},
		rec:      rec, nvidiaMajor: nvidiaMajor, capsMajor: cfg.NvidiaCapsMajor,
		ctld: &slurm.Controller{SlurmConf: cfg.SlurmConf, Node: cfg.NodeName, BinDir: cfg.SlurmBinDir},
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
	if d.watch, err = cgwatch.New(); err != nil {
		d.log.Warn("step ends are found by the periodic reconcile only", "err", err)
	} else {
		d.events.Add(1)
		go d.watchSteps(d.watch)
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

// findScope returns the configured scope, or the single existing
// slurmstepd scope (this node's own when several exist).
func (d *Daemon) findScope() string {
	if d.cfg.Scope != "" {
		if _, err := os.Stat(d.cfg.Scope); err == nil {
			return d.cfg.Scope
		}
		return ""
	}
	own := filepath.Join(d.mount, "system.slice", d.cfg.NodeName+"_slurmstepd.scope")
	if _, err := os.Stat(own); err == nil {
		return own
	}
	matches, _ := filepath.Glob(filepath.Join(d.mount, "system.slice", "*slurmstepd.scope"))
	if len(matches) == 1 {
		return matches[0]
	}
	return ""
}

// attachLocked attaches the filter on scope, once. d.mu is held.
func (d *Daemon) attachLocked(scope string) error {
	if d.filter != nil {
		return d.ensureScopeLocked(scope)
	}
	d.cleanStaleLocked(scope)
	id, _ := jobcgroup.ID(scope)
	f, err := d.newFilter(scope)
	if err != nil {
		err = fmt.Errorf("attach device filter to %s: %w", scope, err)
		d.lifecycle(audit.EventFilterAttachFailed, audit.SeverityError, "the GPU device filter could not be attached; GPU steps are refused", func(r *audit.Record) {
			r.Cgroup, r.Error = scope, err.Error()
		})
		return err
	}
	d.filter, d.scope, d.scopeID = f, scope, id
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

// ensureScopeLocked makes sure, before a step is answered, that the filter
// is on Slurm's scope as it is now. In scope mode a scope made again at the
// same path (its unit stopped, its keep-alive gone, a Slurm upgrade) is a
// new cgroup with no program on it: every job below it would run
// unfiltered. The scope directory's cgroup id and the link's are compared;
// on a mismatch the program is re-attached to the live scope (pinned,
// atomically) and that is audited. Until that succeeds the error refuses
// the step. d.mu is held.
func (d *Daemon) ensureScopeLocked(scope string) error {
	if d.filter.Mode() != devfilter.ModeScope {
		if scope != d.scope {
			return fmt.Errorf("step is under scope %s but the device filter is attached to %s", scope, d.scope)
		}
		return nil
	}
	id, err := jobcgroup.ID(scope)
	if err != nil {
		return fmt.Errorf("Slurm's scope %s: %w", scope, err)
	}
	linked, lerr := d.filter.ScopeCgroupID()
	if scope == d.scope && id == d.scopeID && lerr == nil && linked == id {
		return nil
	}
	if scope != d.scope {
		// Another scope path: only when the old one is gone (a CgroupSlice
		// change), never two live scopes on one node.
		if oldID, err := jobcgroup.ID(d.scope); err == nil && oldID == d.scopeID && linked == oldID {
			return fmt.Errorf("step is under scope %s but the device filter is attached to %s, which still exists", scope, d.scope)
		}
	}
	why := fmt.Sprintf("Slurm's scope %s is cgroup %d; the device filter's link was on cgroup %d (link reports %d)", scope, id, d.scopeID, linked)
	if lerr != nil {
		why = fmt.Sprintf("Slurm's scope %s is cgroup %d; the device filter's link cannot be read (%v)", scope, id, lerr)
	}
	start := time.Now()
	if err := d.filter.Reattach(scope); err != nil {
		err = fmt.Errorf("re-attach device filter to %s: %w", scope, err)
		d.log.Error("the device filter is not on Slurm's live scope and cannot be re-attached; steps are refused", "reason", why, "err", err)
		d.lifecycle(audit.EventFilterAttachFailed, audit.SeverityError, "the GPU device filter is not on Slurm's live scope and could not be re-attached; steps are refused: "+why, func(r *audit.Record) {
			r.Cgroup, r.CgroupID, r.Error = scope, id, err.Error()
		})
		return err
	}
	old := d.scopeID
	d.scope, d.scopeID = scope, id
	took := time.Since(start)
	d.log.Warn("device filter re-attached to Slurm's recreated scope", keyCgroup, scope, "cgroup_id", id, "old_cgroup_id", old, "took", took)
	d.lifecycle(audit.EventFilterReattached, audit.SeverityWarning,
		fmt.Sprintf("Slurm's scope was made again (%s); the GPU device filter was re-attached to it in %v", why, took.Round(time.Microsecond)), func(r *audit.Record) {
			r.Cgroup, r.CgroupID, r.Reason = scope, id, why
		})
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
	// The user's name is looked up (NSS, maybe LDAP) before any lock is
	// taken; the records below find it cached.
	user := d.users.get(m.GetUid())

	// Where the step lives: from slurmstepd's own cgroup, and every task pid
	// must be in the same step.
	lookupFailed := func(err error) error {
		d.lifecycle(audit.EventLookupFailed, audit.SeverityError, "the step's cgroup could not be found; the step is refused", func(r *audit.Record) {
			r.JobID, r.StepID, r.UID, r.User, r.PID, r.Error = jobID, policy.StepName(stepID), audit.UID(m.GetUid()), user, uint32(peer.PID), err.Error()
		})
		return err
	}
	loc, err := jobcgroup.ForPID(d.mount, peer.PID, d.cfg.Scope)
	if err == nil {
		// The pid was read from the socket; the cgroup from /proc. Both
		// name slurmstepd only if it is still the same process.
		err = peer.Verify()
	}
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

	if d.cfg.RecoverFromSlurmctld && d.recoveryDue(jobID) {
		d.recoverJob(jobID, m.GetUid(), user)
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
	resp := d.stepResponse(dec.GPUs, st)
	resp.StepCgroup = "/" + strings.TrimPrefix(strings.TrimPrefix(loc.Step, d.mount), "/")
	if j != nil {
		if prev := j.steps[stepID]; prev != nil && prev.cg.ID == cg.ID && slices.Equal(prev.gpus, dec.GPUs) {
			return resp, nil
		}
	}
	if err := d.filter.Set(cg, p); err != nil {
		return nil, fmt.Errorf("step %s: cannot install its GPU policy: %v", name, err)
	}
	delete(d.ended, cg.ID)
	if j == nil {
		// No prolog (CPU-only use only, see policy.ForStep): keep a record
		// so the step's entry is removed when it ends.
		j = &job{Job: policy.Job{ID: jobID, UID: m.GetUid(), GPUs: []int{}}, steps: map[uint32]*step{}, noProlog: true, created: time.Now()}
		d.jobs[jobID] = j
		d.lifecycle(audit.EventJobWithoutProlog, audit.SeverityWarning, dec.Note, func(r *audit.Record) {
			r.JobID, r.StepID, r.UID, r.User = jobID, policy.StepName(stepID), audit.UID(m.GetUid()), user
		})
	}
	j.steps[stepID] = &step{jobID: jobID, stepID: stepID, uid: m.GetUid(), cg: cg, gpus: dec.GPUs}
	d.watchLocked(cg)
	j.dir = loc.Job
	j.stepless = time.Time{}
	d.owners[cg.ID] = owner{jobID: jobID, stepID: stepID, uid: m.GetUid()}
	d.saveLocked()
	log.Info("step policy applied", "gpus", policy.FormatGPUList(dec.GPUs), keyCgroup, cg.Path)
	d.lifecycle(audit.EventPolicyApplied, audit.SeverityInfo,
		fmt.Sprintf("job %d step %s may open GPUs [%s]", jobID, policy.StepName(stepID), policy.FormatGPUList(dec.GPUs)), func(r *audit.Record) {
			r.JobID, r.StepID, r.UID, r.User = jobID, policy.StepName(stepID), audit.UID(m.GetUid()), user
			r.GPUs, r.Cgroup, r.CgroupID, r.PolicyMode = append([]int{}, dec.GPUs...), cg.Path, cg.ID, d.policyMode()
		})
	return resp, nil
}

// recoveryRetry is how soon slurmctld is asked again about a job it could
// not vouch for, so a job's burst of steps does not become a burst of RPCs.
const recoveryRetry = 5 * time.Second

// recoveryDue reports whether slurmctld should be asked for job id's GPUs
// now: the agent has no trusted record of it (none, or only the placeholder
// of a step that came without a prolog) and did not ask in the last
// recoveryRetry.
func (d *Daemon) recoveryDue(id uint32) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if j := d.jobs[id]; j != nil && !j.noProlog {
		return false
	}
	if t, ok := d.asked[id]; ok && time.Since(t) < recoveryRetry {
		return false
	}
	d.asked[id] = time.Now()
	return true
}

// recoverJob asks slurmctld for the GPUs of a job the agent has no prolog
// record of, and records them as its trusted list; either way it is
// audited. slurmctld is asked through output no job user can steer
// (slurm.Controller); an ambiguous answer gives the job no GPU.
func (d *Daemon) recoverJob(jobID, uid uint32, user string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cj, err := d.ctld.Job(ctx, jobID)
	var amb *slurm.AmbiguousError
	msg, sev := "", audit.SeverityWarning
	switch {
	case errors.As(err, &amb):
		msg, sev = fmt.Sprintf("job %d has no prolog record and slurmctld's answer about it is ambiguous (%s): a job field (name, comment, working directory) holds lines that look like Slurm's own; its steps get no GPU", jobID, amb.Reason), audit.SeverityError
	case errors.Is(err, slurm.ErrJobUnknown):
		msg = fmt.Sprintf("job %d has no prolog record and slurmctld does not know it; its steps get no GPU", jobID)
	case err != nil:
		msg = fmt.Sprintf("job %d has no prolog record and slurmctld could not be asked (%v); its steps get no GPU", jobID, err)
	case !cj.Running():
		msg = fmt.Sprintf("job %d has no prolog record and slurmctld says it is %s, not running on %s; its steps get no GPU", jobID, cj.State, d.cfg.NodeName)
	case cj.UID != uid:
		msg, sev = fmt.Sprintf("job %d has no prolog record; slurmctld says it belongs to uid %d, its step runs as uid %d; its steps get no GPU", jobID, cj.UID, uid), audit.SeverityError
	}
	if msg != "" {
		d.log.Warn(msg, keyJob, jobID)
		d.lifecycle(audit.EventJobWithoutProlog, sev, msg, func(r *audit.Record) {
			r.JobID, r.UID, r.User = jobID, audit.UID(uid), user
			if err != nil {
				r.Error = err.Error()
			}
		})
		return
	}
	var broken string
	for _, g := range cj.GPUs {
		if _, ok := d.gpus[g]; !ok {
			broken = fmt.Sprintf("job %d holds GPU %d per slurmctld, which is not in this node's GPU table (gres.conf); refusing to guess which device it is", jobID, g)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.jobs[jobID]
	if old != nil && !old.noProlog {
		return // a prolog raced us
	}
	j := &job{Job: policy.Job{ID: jobID, UID: uid, GPUs: cj.GPUs}, broken: broken, steps: map[uint32]*step{}, created: time.Now(), recovered: cj.Source}
	if old != nil {
		j.steps, j.dir = old.steps, old.dir
	}
	if broken != "" {
		j.GPUs = []int{}
	}
	d.jobs[jobID] = j
	delete(d.asked, jobID)
	d.saveLocked()
	msg = fmt.Sprintf("job %d had no prolog record; its trusted GPU list [%s] was recovered from slurmctld (%s)", jobID, policy.FormatGPUList(cj.GPUs), cj.Source)
	d.log.Warn(msg, keyJob, jobID)
	d.lifecycle(audit.EventJobWithoutProlog, audit.SeverityWarning, msg, func(r *audit.Record) {
		r.JobID, r.UID, r.User, r.GPUs = jobID, audit.UID(uid), user, append([]int{}, cj.GPUs...)
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
	if len(j.steps) == 0 {
		j.stepless = time.Now()
	}
	d.saveLocked()
}

func (d *Daemon) jobEpilog(jobID uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.asked, jobID)
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

// removeStepLocked takes a step's policy away. In scope mode its cgroup then
// has no entry and the program denies it every GPU. In per-cgroup mode the
// program on the cgroup is all that narrows it, and a task can outlive its
// step (it ignores SIGTERM, UnkillableStepTimeout): the entry becomes
// deny-all and stays until the cgroup is gone (Reconcile). d.mu is held.
func (d *Daemon) removeStepLocked(j *job, s *step, why string) {
	if d.filter != nil {
		var err error
		if d.filter.Mode() == devfilter.ModePerCgroup {
			if err = d.filter.Set(s.cg, devfilter.Policy{}); err == nil {
				d.ended[s.cg.ID] = s.cg
			}
		} else {
			err = d.filter.Remove(s.cg)
		}
		if err != nil {
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
		r.JobID, r.StepID, r.UID, r.User = s.jobID, policy.StepName(s.stepID), audit.UID(s.uid), d.users.cached(s.uid)
		r.Cgroup, r.CgroupID, r.Reason = s.cg.Path, s.cg.ID, why
		r.GPUs = append([]int{}, s.gpus...)
	})
}

// How soon a job with no step left is first asked about, and how the
// interval grows while slurmctld says it still runs (a job whose user
// cancelled its extern step keeps its allocation and its record).
const (
	endCheckFirst = 30 * time.Second
	endCheckMax   = 15 * time.Minute
	// A step-less job whose cgroup still exists is asked about after this.
	endCheckIdle = 10 * time.Minute
)

// Reconcile removes the entries of step cgroups that no longer exist (a
// slurmstepd that died without its exit callback), drops the records of
// jobs slurmctld says have ended (their epilog never reached the agent),
// makes sure the filter is on the live scope, and refreshes the exempt
// entries.
func (d *Daemon) Reconcile() {
	d.ingestFailOpen()
	d.mu.Lock()
	changed := false
	for _, j := range d.jobs {
		for _, s := range j.steps {
			if id, err := jobcgroup.ID(s.cg.Path); err != nil || id != s.cg.ID {
				d.removeStepLocked(j, s, "step cgroup vanished")
				changed = true
				if len(j.steps) == 0 {
					j.stepless = time.Now()
				}
			}
		}
	}
	d.forgetEndedLocked()
	ask := d.endCheckDueLocked(time.Now())
	if changed {
		d.saveLocked()
	}
	d.mu.Unlock()

	d.dropEnded(ask)

	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweepOrphansLocked()
	if d.filter == nil {
		if scope := d.findScope(); scope != "" {
			if err := d.attachLocked(scope); err != nil {
				d.log.Error("attach device filter", "err", err)
			}
		}
		return
	}
	if d.filter.Mode() == devfilter.ModeScope {
		// A scope removed and not made again yet has nothing to attach
		// to; the first step under the new one re-attaches.
		if scope := d.findScope(); scope != "" {
			if err := d.ensureScopeLocked(scope); err != nil {
				d.log.Error("device filter scope", "err", err)
			}
		}
	}
	d.refreshExemptLocked()
}

// watchLocked asks to be told when cg is removed. d.mu is held.
func (d *Daemon) watchLocked(cg devfilter.Cgroup) {
	if d.watch == nil || cg.Path == "" {
		return
	}
	if err := d.watch.Add(cg.Path, cg.ID); err != nil {
		d.log.Debug("step cgroup not watched; reconcile will find its end", keyCgroup, cg.Path, "err", err)
	}
}

// watchSteps releases each step whose cgroup Slurm removed: the step ended
// (or its slurmstepd died), as soon as the kernel says so.
func (d *Daemon) watchSteps(w *cgwatch.Watcher) {
	defer d.events.Done()
	for id := range w.Gone() {
		d.mu.Lock()
		if o, ok := d.owners[id]; ok && o.exempt == "" {
			if j := d.jobs[o.jobID]; j != nil && j.steps[o.stepID] != nil && j.steps[o.stepID].cg.ID == id {
				d.removeStepLocked(j, j.steps[o.stepID], "step cgroup removed")
				if len(j.steps) == 0 {
					j.stepless = time.Now()
				}
				d.saveLocked()
			}
		}
		d.forgetEndedLocked()
		d.mu.Unlock()
	}
}

// forgetEndedLocked detaches the deny-all entries of ended steps (per-cgroup
// mode) whose cgroup is gone. d.mu is held.
func (d *Daemon) forgetEndedLocked() {
	if d.filter == nil {
		return
	}
	for id, cg := range d.ended {
		if now, err := jobcgroup.ID(cg.Path); err == nil && now == id {
			continue
		}
		if err := d.filter.Remove(cg); err != nil {
			d.log.Error("detach the filter of an ended step", keyCgroup, cg.Path, "err", err)
			continue
		}
		delete(d.ended, id)
	}
}

// endCheckDueLocked lists the jobs with no step whose end slurmctld should
// be asked about now: their cgroup is gone, or they had no step for
// endCheckIdle. A record is never dropped because its steps or its cgroup
// are gone: a job user can end every step of their job, the extern step
// included, while the allocation lives on. d.mu is held.
func (d *Daemon) endCheckDueLocked(now time.Time) map[uint32]*job {
	ask := map[uint32]*job{}
	for id, j := range d.jobs {
		if len(j.steps) > 0 {
			continue
		}
		if j.stepless.IsZero() {
			j.stepless = j.created
		}
		gone := false
		if j.dir != "" {
			_, err := os.Stat(j.dir)
			gone = err != nil
		}
		if !gone && now.Sub(j.stepless) < endCheckIdle {
			continue
		}
		if now.Before(j.nextCheck) {
			continue
		}
		ask[id] = j
	}
	return ask
}

// dropEnded asks slurmctld about each job and drops the records of those it
// says have ended (unknown to it, finished, or back in the queue); a job it
// says still runs, or when it cannot be asked, keeps its record and is
// asked again later.
func (d *Daemon) dropEnded(ask map[uint32]*job) {
	for id, j := range ask {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cj, err := d.ctld.Job(ctx, id)
		cancel()
		ended, why := false, ""
		switch {
		case errors.Is(err, slurm.ErrJobUnknown):
			ended, why = true, "slurmctld no longer knows it"
		case err == nil && !cj.Running():
			ended, why = true, fmt.Sprintf("slurmctld says it is %s on %v", cj.State, map[bool]string{true: "this node", false: "other nodes"}[cj.OnNode])
		}
		d.mu.Lock()
		if d.jobs[id] != j || len(j.steps) > 0 {
			d.mu.Unlock()
			continue // a step or a prolog came meanwhile
		}
		if !ended {
			j.checkEvery = min(max(2*j.checkEvery, endCheckFirst), endCheckMax)
			j.nextCheck = time.Now().Add(j.checkEvery)
			d.mu.Unlock()
			if err != nil {
				d.log.Warn("job with no step left kept: slurmctld could not say whether it ended", keyJob, id, "err", err, "next_check", j.checkEvery)
			} else {
				d.log.Info("job with no step left kept: slurmctld says it still runs here", keyJob, id, "state", cj.State, "next_check", j.checkEvery)
			}
			continue
		}
		delete(d.jobs, id)
		delete(d.asked, id)
		d.saveLocked()
		d.mu.Unlock()
		d.log.Info("job record dropped: its epilog never reached the agent and "+why, keyJob, id)
	}
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
	w := d.watch
	d.watch = nil
	d.mu.Unlock()
	if w != nil {
		w.Close()
	}
	if f == nil {
		d.events.Wait()
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
		attrs := []any{"decision", r.Decision, "pid", ev.TGID, "comm", r.Comm, keyUID, ev.UID,
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
