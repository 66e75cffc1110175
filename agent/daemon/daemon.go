// SPDX-License-Identifier: Apache-2.0

// Package daemon puts the gpufence node agent together from its stages
// (docs/architecture.md, "The agent's stages"): requests (agent/handler)
// decide with agent/policy, write the kernel's map (agent/enforcer) and
// record (agent/registry, written through to the pinned agent/store);
// the kernel's access reports go reader → queue → attribution → sinks
// (agent/events); agent/reconcile and the state file writer
// (statefile.Writer) run beside them.
// Each stage is a package with one job; this one only wires them and runs
// their loops.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpufence/gpufence/agent/adopt"
	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/cgwatch"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/enforcer"
	"github.com/gpufence/gpufence/agent/events"
	"github.com/gpufence/gpufence/agent/failopen"
	"github.com/gpufence/gpufence/agent/gputable"
	"github.com/gpufence/gpufence/agent/handler"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/reconcile"
	"github.com/gpufence/gpufence/agent/recovery"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/shares"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/agent/store"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Filter is the kernel device filter; *devfilter.Filter implements it.
type Filter = enforcer.Filter

// FilterFactory attaches a filter on Slurm's slurmstepd scope directory.
type FilterFactory = enforcer.Factory

// Recorder receives audit records; *audit.Pipeline implements it.
type Recorder = events.Recorder

// NewKernelFilter is the FilterFactory for the real kernel filter; opts
// holds everything but the scope.
var NewKernelFilter = enforcer.KernelFilter

// jobSource is slurmctld as the agent asks it; tests replace it.
var jobSource = func(cfg config.Config) recovery.JobSource {
	return &slurm.Controller{SlurmConf: cfg.SlurmConf, Node: cfg.NodeName, BinDir: cfg.SlurmBinDir}
}

// Daemon is the running agent.
type Daemon struct {
	cfg   config.Config
	log   *slog.Logger
	mount string
	rec   Recorder

	table    *gputable.Table
	reg      *registry.Registry
	store    *store.Store
	enf      *enforcer.Enforcer
	ev       *events.Events
	h        *handler.Handler
	rc       *reconcile.Reconciler
	recovery *recovery.Recovery
	// shares names jobs' shard and mps shares in records; nil on a node
	// without them.
	shares  *shares.Book
	watch   *cgwatch.Watcher
	users   *users.Cache
	adopter *adopt.Adopter

	mode *handler.Mode
	// late asks slurmd again for a table made without its answer; nil
	// when the table had it (or slurmd_gpu_table is off).
	late     *gputable.Late
	lateStop context.CancelFunc

	// gresConf is the gres.conf the table was read beside.
	gresConf string

	persistStop context.CancelFunc
	persistDone chan struct{}
	closeOnce   sync.Once
}

// New builds the agent: it reads Slurm's GPU table and device numbers,
// takes back the records an earlier agent left (the pinned store, else its
// state file), and attaches the filter at once when Slurm's scope exists.
func New(cfg config.Config, log *slog.Logger, newFilter FilterFactory, nvidiaMajor uint32, rec Recorder) (*Daemon, error) {
	mount, err := jobcgroup.Mountpoint()
	if err != nil {
		return nil, err
	}
	if rec == nil {
		rec = events.Discard{}
	}
	d := &Daemon{cfg: cfg, log: log.With("component", "agent"), mount: mount, rec: rec, users: &users.Cache{},
		mode: handler.NewMode(cfg.Enforcement == config.EnforcementAuditOnly)}
	settings := &handler.SettingsFile{Path: cfg.SlurmConf}
	st, err := settings.Get()
	if err != nil {
		return nil, err
	}
	in := readTableSources(context.Background(), cfg, st.GresConf)
	if cfg.SlurmdGPUTable == config.SlurmdGPUTableRequired && in.SlurmdErr != nil {
		return nil, fmt.Errorf("slurmd_gpu_table is required: %w", in.SlurmdErr)
	}
	if d.table, err = gputable.Build(in, nvidiaMajor, cfg.NvidiaCapsMajor); err != nil {
		return nil, err
	}
	d.gresConf = st.GresConf
	d.logTable(st.GresConf)
	if d.table.Pending() {
		// Under the packaged unit the agent starts before slurmd, and
		// slurmd -G fails until slurmd runs: it is asked again then.
		gresConf := st.GresConf
		d.late = &gputable.Late{Table: d.table, Log: log.With("component", "gputable"), Recorder: rec,
			Ask: func(ctx context.Context) gputable.Input { return readTableSources(ctx, cfg, gresConf) }}
	}

	if cfg.PinDir != "" {
		if err := devfilter.EnsureBPFFS(cfg.PinDir); err != nil {
			return nil, fmt.Errorf("pin directory: %w", err)
		}
		if d.store, err = store.Open(cfg.PinDir); err != nil {
			return nil, err
		}
	}
	var records registry.Store // a nil *store.Store is no store
	if d.store != nil {
		records = d.store
	}
	d.reg = registry.New(records, d.log.With("component", "registry"))
	if d.late != nil {
		d.late.Held = d.reg.HoldsGPUs
		d.late.Changed = d.writeState
	}
	var resume *events.Reported
	if p := d.countsPath(); p != "" {
		// What the last agent reported of the pinned counters: what the
		// kernel counted after it stopped is reported now, not dropped.
		if resume, err = events.LoadReported(p); err != nil {
			d.log.Warn("cannot read the last agent's audit counts; accesses counted while no agent ran are not reported", "err", err)
		}
	}
	// A table slurmd settles late may gain shares; the book asks
	// slurmctld only while the table has them.
	if cfg.RecoverFromSlurmctld && (d.table.HasShares() || d.late != nil) {
		d.shares = shares.New(jobSource(cfg), d.table, log.With("component", "shares"))
	}
	d.ev = events.New(events.Options{Log: log.With("component", "events"), Recorder: rec, Owners: d.reg, Table: d.table,
		Fabric:    devices.Fabric{NVSwitchMajor: cfg.NVSwitchMajor, NVLinkMajor: cfg.NVLinkMajor},
		IMEXMajor: cfg.IMEXChannelsMajor,
		Users:     d.users, AuditOnly: d.mode.AuditOnly, QueueSize: cfg.Audit.QueueSize, Resume: resume, Shares: d.shares.Of})
	if cfg.RecoverFromSlurmctld {
		d.recovery = &recovery.Recovery{Source: jobSource(cfg), Table: d.table, Node: cfg.NodeName}
	}
	if d.watch, err = cgwatch.New(); err != nil {
		d.log.Warn("step ends are found by the periodic reconcile only", "err", err)
		d.watch = nil
	} else if st, err := settings.Get(); err == nil {
		// slurmd writes it at its start: its cgroup outside the scope is
		// found then, not at the next reconcile pass.
		if err := d.watch.WatchMade(st.SlurmdPid(cfg.NodeName)); err != nil {
			d.log.Warn("slurmd's start is found by the periodic reconcile only", "err", err)
		}
	}
	d.h = &handler.Handler{Log: d.log, Mount: mount, Scope: cfg.Scope, Registry: d.reg, Table: d.table,
		Settings: settings, Recorder: rec, Users: d.users, Recovery: d.recovery, Mode: d.mode,
		IMEXMajor: cfg.IMEXChannelsMajor, IMEXFromSlurm: cfg.IMEXChannels == config.IMEXSlurm,
		TaskBinding:    cfg.TaskBinding == config.TaskBindingSlurm,
		UnconfirmedMax: cfg.AdoptUnconfirmedMax.Duration}
	if d.late != nil {
		d.h.Late = d.late
	}
	var asker adopt.Asker
	if d.recovery != nil {
		asker = d.recovery
	}
	d.adopter = &adopt.Adopter{Log: d.log.With("component", "adopt"), Registry: d.reg, Asker: asker, Table: d.table,
		Recorder: rec, Users: d.users, Unconfirmed: cfg.AdoptUnconfirmed}
	eo := enforcer.Options{
		Log: d.log, Mount: mount, Scope: cfg.Scope, Node: cfg.NodeName, Exempt: cfg.ExemptCgroups, PinDir: cfg.PinDir,
		Settings: settings, NewFilter: newFilter, Registry: d.reg, Recorder: rec,
		Events: d.ev, OnRelease: d.ev.Release, TaskBinding: cfg.TaskBinding == config.TaskBindingSlurm,
		// The recorded steps' entries (again: a crash may have come
		// between a record and its entry), then the adopted jobs'.
		Restore: []func(func(cgroup.Cgroup, devfilter.Policy) error){d.h.WriteRecorded, d.adopter.ApplyHeld},
	}
	if d.watch != nil { // a nil *cgwatch.Watcher is no watcher
		d.h.Watch, eo.SlurmdWatch = d.watch, d.watch
	}
	d.enf = enforcer.New(eo)
	d.h.Enforcer = d.enf
	d.rc = &reconcile.Reconciler{Log: d.log, Registry: d.reg, Enforcer: d.enf, Handler: d.h, Recovery: d.recovery,
		Spool: &failopen.Spool{Path: cfg.FailOpenSpool, Log: d.log, Recorder: rec, Users: d.users}}
	if d.watch != nil {
		d.rc.Watcher = d.watch
	}
	if d.late != nil {
		d.rc.Table = d.late
		ctx, cancel := context.WithCancel(context.Background())
		d.lateStop = cancel
		d.late.Start(ctx)
	}

	d.restore()
	if d.store != nil {
		// Only a store filled to the end counts as one at the next start.
		if err := d.store.Commit(); err != nil {
			d.Close()
			return nil, err
		}
	}
	// Now, not at the first job: gpufence status shows the table's source.
	d.writeState()
	found := d.enf.FindScope()
	if scope := found.Scope; scope != "" {
		// Jobs already running with no record (gpufence put on a busy
		// node): slurmctld is asked now, and their entries are written
		// before the filter's program first runs (enforcer.Options.Restore).
		t0 := time.Now()
		plan := d.adopter.Plan(scope)
		if len(plan) > 0 {
			d.log.Info("running jobs found with no record; slurmctld asked", "jobs", len(plan), "took", time.Since(t0))
		}
		d.adopter.Hold(plan)
		if err := d.enf.Ensure(scope); err != nil {
			d.Close()
			return nil, err
		}
		// Steps that ended while the agent was away.
		d.rc.Pass()
	} else if found.Err == nil {
		d.log.Info("Slurm's slurmstepd scope does not exist yet; the filter is attached when the first step registers", "cgroup_mount", mount, "expected", found.Expected)
	}
	if p := d.countsPath(); p != "" {
		// Taken (or not needed): after a crash the next agent must not
		// report these counts again.
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("remove the last agent's audit counts", "file", p, "err", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.persistStop, d.persistDone = cancel, make(chan struct{})
	w := &statefile.Writer{Path: cfg.StateFile, Snapshot: d.snapshot, Changed: d.reg.Changed(), Log: d.log}
	go func() { defer close(d.persistDone); w.Run(ctx) }()
	if d.shares != nil {
		d.watchShares(ctx)
	}
	return d, nil
}

// readTableSources reads what the GPU table is chosen from: gres.conf,
// and slurmd's own table (slurmd -G) unless slurmd_gpu_table is off.
func readTableSources(ctx context.Context, cfg config.Config, gresConf string) gputable.Input {
	in := gputable.Input{GresConf: gresConf}
	in.Gres, in.GresErr = slurm.ReadGres(gresConf, cfg.NodeName)
	if cfg.SlurmdGPUTable == config.SlurmdGPUTableOff {
		in.SlurmdOff = true
		return in
	}
	bin, err := slurm.FindSlurmd(cfg.Slurmd, cfg.SlurmBinDir, cfg.SlurmConf)
	if err != nil {
		in.SlurmdErr = err
		return in
	}
	sd := &slurm.Slurmd{Bin: bin, SlurmConf: cfg.SlurmConf, Node: cfg.NodeName}
	in.Slurmd, in.SlurmdErr = sd.GPUs(ctx)
	return in
}

// logTable logs the table, where it came from and why, and audits a
// disagreement of its sources.
func (d *Daemon) logTable(gresConf string) {
	o := d.table.Origin()
	gpus := d.table.GPUs()
	attrs := []any{"source", o.Source, "gpus", len(gpus), "detail", o.Detail, "gres_conf", gresConf}
	if o.Slurmd != "" {
		attrs = append(attrs, "slurmd", o.Slurmd)
	}
	switch o.Severity {
	case gputable.SeverityError:
		d.log.Error("GPU table: Slurm's sources disagree; failing closed: steps that ask for a GPU are refused, CPU-only steps run", append(attrs, "untrusted", o.Untrusted)...)
	case gputable.SeverityWarning:
		d.log.Warn("GPU table", attrs...)
	default:
		d.log.Info("GPU table", attrs...)
	}
	d.auditOrigin(o, "at start")
	if len(gpus) == 0 {
		d.log.Warn("no GPU for this node in Slurm's GPU table; every job gets no GPU", "source", o.Source, "gres_conf", gresConf, "node", d.cfg.NodeName)
	}
	for _, g := range gpus {
		if g.MIG {
			d.log.Info("gpu", "gpu", g.Index, "path", g.Path, "device", fmt.Sprintf("%d:%d", g.Major, g.Minor),
				"mig_slice", g.Type, "caps", fmt.Sprintf("%d:%v", d.table.CapsMajor, g.CapsMinors()))
			continue
		}
		d.log.Info("gpu", "gpu", g.Index, "path", g.Path, "device", fmt.Sprintf("%d:%d", g.Major, g.Minor))
	}
}

// auditOrigin records where the GPU table came from when its sources
// disagree or one failed; when they agree there is nothing to record.
func (d *Daemon) auditOrigin(o gputable.Origin, when string) {
	if o.Kind == "" {
		return
	}
	sev, msg := audit.SeverityWarning, fmt.Sprintf("%s, the GPU table is %s's; GPUs are still given out", when, o.Source)
	if o.Untrusted != "" {
		sev, msg = audit.SeverityError, fmt.Sprintf("%s, Slurm's GPU table sources (slurmd -G, gres.conf) cannot be trusted; steps that ask for a GPU are refused", when)
	}
	d.rec.Emit(audit.Record{Event: audit.EventGPUTableMismatch, Severity: sev, Message: msg, Error: o.Kind + ": " + o.Detail})
}

// ReloadGPUTable reads Slurm's GPU table again (on SIGHUP) and compares it
// with the one in use, which stays: when it changed, or its sources now
// disagree, steps that ask for a GPU are refused until the agent restarts
// with the new table; the finding is logged and, when it refuses GPUs,
// audited. It returns whether the table in use is trusted.
func (d *Daemon) ReloadGPUTable(ctx context.Context) bool {
	in := readTableSources(ctx, d.cfg, d.gresConf)
	if d.late != nil && d.table.Pending() {
		// slurmd's first answer settles the table as a late one does.
		if s := d.late.Offer(in); s.Outcome != gputable.SettleFailed && s.Outcome != "" {
			return d.table.Untrusted() == ""
		}
	}
	msg, ok := d.table.Recheck(in)
	if ok {
		d.log.Info("GPU table rechecked", "detail", msg)
	} else {
		d.log.Error("GPU table rechecked: failing closed: steps that ask for a GPU are refused, CPU-only steps run", "detail", msg)
		d.rec.Emit(audit.Record{Event: audit.EventGPUTableMismatch, Severity: audit.SeverityError,
			Message: "at reload, Slurm's GPU table no longer matches the one in use; steps that ask for a GPU are refused", Error: "table_changed: " + msg})
	}
	d.writeState()
	return ok
}

// writeState writes the state file now (the table changed); the registry's
// changes are written by persist.
func (d *Daemon) writeState() {
	if d.cfg.StateFile == "" {
		return
	}
	if err := statefile.Write(d.cfg.StateFile, d.snapshot()); err != nil {
		d.log.Error("write the state file (gpufence status reads it while the agent is down)", "file", d.cfg.StateFile, "err", err)
	}
}

// restore takes back what an earlier agent recorded (registry.Reload):
// the pinned store, else, where it is new, the state file, copied into
// the store (which New then commits: a crash before that leaves no store,
// and the next start copies the file again).
func (d *Daemon) restore() {
	steps, from := d.reg.Reload(d.store != nil && !d.store.Created, d.cfg.StateFile)
	d.h.WatchRecorded()
	if n := len(d.reg.Jobs()); n > 0 {
		d.log.Info("restored jobs", "jobs", n, "steps", len(steps), "from", from, "pin_dir", d.cfg.PinDir)
	}
}

func (d *Daemon) snapshot() statefile.File {
	jobs := d.reg.State()
	for i := range jobs {
		jobs[i].Shares = d.shares.Of(jobs[i].ID)
	}
	return statefile.File{Scope: d.enf.Scope(), Jobs: jobs, GPUTable: d.tableState()}
}

// watchShares asks slurmctld about each recorded job with GPUs, once, off
// every request's path (agent/shares), until ctx ends.
func (d *Daemon) watchShares(ctx context.Context) {
	d.shares.Changed = d.reg.Touch
	go d.shares.Run(ctx)
	d.reg.AddWatcher(func(jobs []registry.Job) {
		ids := make([]uint32, 0, len(jobs))
		for _, j := range jobs {
			if len(j.GPUs) > 0 && !j.NoProlog {
				ids = append(ids, j.ID)
			}
		}
		d.shares.Jobs(ids)
	})
}

// tableState is the GPU table as gpufence status shows it.
func (d *Daemon) tableState() *statefile.GPUTable {
	o := d.table.Origin()
	t := &statefile.GPUTable{Source: o.Source, Detail: o.Detail, Slurmd: o.Slurmd, GresConf: o.GresConf,
		AutoDetect: o.AutoDetect, Untrusted: d.table.Untrusted(), GPUs: []statefile.TableGPU{}}
	for _, g := range d.table.GPUs() {
		files := g.Files
		if len(files) == 0 {
			files = []string{g.Path}
		}
		t.GPUs = append(t.GPUs, statefile.TableGPU{Index: g.Index, Type: g.Type, Files: files})
	}
	return t
}

// Handler answers the plugin's requests; the server calls it directly.
func (d *Daemon) Handler() *handler.Handler { return d.h }

// Run reconciles and flushes the audit counters periodically until ctx
// ends, then closes the agent.
func (d *Daemon) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() { d.rc.Run(ctx, d.cfg.ReconcileInterval.Duration); close(done) }()
	flush := time.NewTicker(d.cfg.Audit.FlushInterval.Duration)
	defer flush.Stop()
	for {
		select {
		case <-ctx.Done():
			<-done
			return d.Close()
		case <-flush.C:
			if f := d.enf.Filter(); f != nil {
				d.ev.Flush(f)
			}
		}
	}
}

// Healthy returns once the records and the filter can be reached; the
// systemd watchdog pings only after it returns, so a wedged agent gets
// restarted.
func (d *Daemon) Healthy() {
	d.reg.Counts()
	d.enf.Scope()
}

// SetAuditOnly switches between enforcing and audit-only at run time.
func (d *Daemon) SetAuditOnly(on bool) error {
	d.mode.Set(on)
	return d.enf.SetAuditOnly(on)
}

// Close stops the loops, writes the state a last time, flushes the audit
// counters and detaches the filter (with pin_dir its pins keep enforcing).
func (d *Daemon) Close() error {
	var err error
	d.closeOnce.Do(func() {
		if d.lateStop != nil {
			d.lateStop()
		}
		if d.persistStop != nil {
			d.persistStop()
			<-d.persistDone
		}
		if f := d.enf.Detach(); f != nil {
			// Every event the kernel reported is read and attributed
			// before the suppressed counts are taken: the books then
			// add up to what the program saw.
			if dr, ok := f.(interface{ Drain() error }); ok {
				if derr := dr.Drain(); derr != nil {
					d.log.Warn("events left in the ring buffer go to the next agent", "err", derr)
				} else {
					d.ev.Close()
				}
			}
			d.ev.Flush(f)
			err = f.Close()
		}
		d.ev.Close()
		if p := d.countsPath(); p != "" {
			if serr := events.SaveReported(p, d.ev.Reported()); serr != nil {
				d.log.Warn("save the audit counts for the next agent; what the kernel counts until it starts goes unreported", "file", p, "err", serr)
			}
		}
		if d.watch != nil {
			d.watch.Close()
		}
		if d.store != nil {
			err = errors.Join(err, d.store.Close())
		}
	})
	return err
}

// countsPath is where a stopping agent leaves what it reported of the
// pinned counters (events.Reported) for the next one: beside the state
// file; "" without pins or state file.
func (d *Daemon) countsPath() string {
	if d.cfg.PinDir == "" || d.cfg.StateFile == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(d.cfg.StateFile), "audit-counts.json")
}

// SetInventory checks Slurm's GPU table against the GPUs the NVIDIA driver
// reports, logs and audits each mismatch, and returns them. Call it once,
// before serving requests. When a mismatch is an error, the agent fails
// closed: every step that would get a GPU is refused with the reason,
// while CPU-only steps still run and the agent stays reachable for
// gpufence status and doctor.
func (d *Daemon) SetInventory(gpus []inventory.GPU) []inventory.Mismatch {
	ids, ms := d.table.CheckNVML(gpus)
	for _, id := range ids {
		g, n := id.GPU, id.NVML
		attrs := []any{"gpu", g.Index, "path", g.Path, "device", fmt.Sprintf("%d:%d", g.Major, g.Minor),
			"nvml_index", n.Index, "uuid", n.UUID, "bus_id", n.PCIBusID, "name", n.Name, "mig", migSummary(n)}
		if id.MIG != nil {
			attrs = append(attrs, "caps", g.CapsMinors(), "mig_uuid", id.MIG.UUID, "mig_profile", id.MIG.Profile)
		}
		d.log.Info("gpu identified by NVML", attrs...)
	}
	for _, m := range ms {
		sev, msg := audit.SeverityWarning, "Slurm's GPU table ("+d.table.Origin().Source+") and the NVIDIA driver disagree; GPUs are still given out"
		if m.Severity == inventory.SeverityError {
			d.log.Error("GPU table mismatch", "kind", m.Kind, "detail", m.Message)
			sev, msg = audit.SeverityError, "Slurm's GPU table ("+d.table.Origin().Source+") does not match the NVIDIA driver; steps that ask for a GPU are refused"
		} else {
			d.log.Warn("GPU table warning", "kind", m.Kind, "detail", m.Message)
		}
		d.rec.Emit(audit.Record{Event: audit.EventGPUTableMismatch, Severity: sev, Message: msg, Error: string(m.Kind) + ": " + m.Message})
	}
	if why := d.table.Untrusted(); why != "" {
		d.log.Error("Slurm's GPU table does not match the NVIDIA driver; failing closed: steps that ask for a GPU are refused, CPU-only steps run", "mismatches", len(inventory.Errors(ms)))
	}
	return ms
}

func migSummary(g inventory.GPU) string {
	if !g.MIGEnabled {
		return "off"
	}
	s := fmt.Sprintf("on, %d devices", len(g.MIG))
	for _, m := range g.MIG {
		s += fmt.Sprintf(" [%s gi%d/ci%d %s caps %d/%d]", m.Profile, m.GI, m.CI, m.UUID, m.GICapMinor, m.CICapMinor)
	}
	return s
}

// Table is the node's GPU table.
func (d *Daemon) Table() *gputable.Table { return d.table }

// Registry is the node's records (for metrics and dcgm job mapping).
func (d *Daemon) Registry() *registry.Registry { return d.reg }

// Counts is what the agent holds now, for gauges.
type Counts struct {
	Jobs  int // jobs with a record (prolog, recovered or restored)
	Steps int // step policies in the kernel
	// Exempt counts allow-all entries of Slurm's own cgroups (system, slurmd).
	Exempt int
	// FilterAttached is false until Slurm's scope exists or when attaching
	// failed; then GPU steps are refused.
	FilterAttached bool
}

// Counts returns the agent's current jobs, steps and filter state.
func (d *Daemon) Counts() Counts {
	c := d.reg.Counts()
	return Counts{Jobs: c.Jobs, Steps: c.Steps, Exempt: c.Exempt, FilterAttached: d.enf.Filter() != nil}
}
