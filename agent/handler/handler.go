// SPDX-License-Identifier: Apache-2.0

// Package handler answers the SPANK plugin's requests, each in one pass:
// the request → the policy decision (agent/policy) → the kernel map update
// (agent/enforcer) → the record (agent/registry) → the reply. It holds no
// lock of its own; nothing it waits for does I/O beyond reading /proc and a
// map update, except asking slurmctld about a job without a prolog record.
package handler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/enforcer"
	"github.com/gpufence/gpufence/agent/gpulist"
	"github.com/gpufence/gpufence/agent/imexchan"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/recovery"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// Recorder receives lifecycle audit records.
type Recorder interface {
	Emit(r audit.Record)
}

// Table is the node's GPU table as the decision uses it.
type Table interface {
	Devices(gpus []int) (policy.DeviceSet, error)
	Unknown(gpus []int) (int, bool)
	Untrusted() string
	// GPUs is every GPU of the table, by index (gpufence verify).
	GPUs() []devices.GPU
}

// LateTable asks slurmd again for a GPU table made without its answer
// (*gputable.Late): a request that would give a GPU waits, bounded, for
// the answer in flight, and holds the table from being replaced while it
// reads devices from it and records its step.
type LateTable interface {
	Await(ctx context.Context)
	Hold() (release func())
	// Kick asks again when due; up: slurmd is seen running.
	Kick(up bool)
	// Pending reports whether the table still waits for slurmd's answer.
	Pending() bool
}

func (h *Handler) pending() bool { return h.Late != nil && h.Late.Pending() }

// Settings are Slurm's settings that change the answer (local numbering).
type Settings interface {
	Get() (slurm.Settings, error)
}

// Handler answers requests. Its methods are safe for concurrent use.
type Handler struct {
	Log      *slog.Logger
	Mount    string
	Scope    string // configured; "" = any slurmstepd scope
	Registry *registry.Registry
	Enforcer *enforcer.Enforcer
	Table    Table
	Settings Settings
	Recorder Recorder
	Users    *users.Cache
	// Recovery, when set, asks slurmctld for a job without prolog record.
	Recovery *recovery.Recovery
	// UnconfirmedMax bounds how long an adopted job stays audit-only
	// unconfirmed (adopt_unconfirmed_max); 0: no bound.
	UnconfirmedMax time.Duration
	// Cgroups reads /proc and cgroupfs; nil: this node's.
	Cgroups Cgroups
	// Watch, when set, is told each registered step's cgroup (its end).
	Watch Watcher
	// Mode is what records say the filter enforces; nil: enforce.
	Mode *Mode
	// IMEXMajor is the IMEX channel major the filter narrows (0: none);
	// with IMEXFromSlurm, a GPU step may open the channel Slurm's
	// switch/nvidia_imex made for it (StepChannel), else none.
	IMEXMajor     uint32
	IMEXFromSlurm bool
	// IMEX reads a process's channel; nil reads /proc.
	IMEX IMEXReader
	// TaskBinding narrows each task of a numbered GPU step to its own
	// binding (task_binding: slurm; scope mode only): the StepStart answer
	// asks the plugin for each task's TaskBind.
	TaskBinding bool
	// Late, when set, is slurmd's answer for a table made without it; nil:
	// the table is what it was at start.
	Late LateTable

	// verifying are the cgroups gpufence verify registered, by id.
	verifyMu  sync.Mutex
	verifying map[uint64]verifying
	// saidNoTask are the steps logged as having no per-task cgroups (under
	// verifyMu).
	saidNoTask map[uint64]bool
}

func (h *Handler) emit(ev audit.Event, sev audit.Severity, msg string, fill func(*audit.Record)) {
	r := audit.Record{Event: ev, Severity: sev, Message: msg}
	if fill != nil {
		fill(&r)
	}
	h.Recorder.Emit(r)
}

// Handle answers one plugin request.
func (h *Handler) Handle(ctx context.Context, p peer.Peer, req *pb.Request) *pb.Response {
	var resp *pb.Response
	var err error
	switch m := req.Msg.(type) {
	case *pb.Request_JobProlog:
		h.jobProlog(ctx, m.JobProlog)
		resp = &pb.Response{}
	case *pb.Request_StepStart:
		resp, err = h.stepStart(ctx, p, m.StepStart)
	case *pb.Request_StepEnd:
		h.stepEnd(m.StepEnd.GetJobId(), m.StepEnd.GetStepId())
		resp = &pb.Response{}
	case *pb.Request_StepChannel:
		resp, err = h.stepChannel(p, m.StepChannel)
	case *pb.Request_TaskBind:
		resp, err = h.taskBind(p, m.TaskBind)
	case *pb.Request_JobEpilog:
		h.JobEnded(m.JobEpilog.GetJobId(), "job ended")
		resp = &pb.Response{}
	case *pb.Request_VerifyStart:
		resp, err = h.verifyStart(p, m.VerifyStart)
	case *pb.Request_VerifyEnd:
		resp, err = h.verifyEnd(m.VerifyEnd)
	default:
		err = errors.New("empty or unknown request (plugin newer than agent?)")
	}
	if err != nil {
		return &pb.Response{Error: err.Error()}
	}
	return resp
}

// jobProlog records the job's trusted list, written to the store before
// the prolog is answered.
func (h *Handler) jobProlog(ctx context.Context, m *pb.JobProlog) {
	j := registry.Job{ID: m.GetJobId(), UID: m.GetUid(), GPUs: []int{}, Created: time.Now()}
	log := h.Log.With("job_id", j.ID, "uid", j.UID)
	if m.JobGpus != nil {
		gpus, err := gpulist.Parse(m.GetJobGpus())
		if err == nil && len(gpus) > 0 && h.Late != nil {
			// slurmd runs the prolog: its table is asked for now, and the
			// list is checked against it when it comes in time.
			h.Late.Await(ctx)
		}
		if err != nil {
			j.Broken = fmt.Sprintf("job %d: SLURM_JOB_GPUS from the job prolog: %v", j.ID, err)
		} else if g, bad := h.Table.Unknown(gpus); bad && !(h.pending() && h.Table.Untrusted() != "") {
			j.Broken = fmt.Sprintf("job %d was given GPU %d, which is not in this node's GPU table (gres.conf); refusing to guess which device it is", j.ID, g)
		} else {
			if bad {
				// Only slurmd knows the GPUs (AutoDetect) and its answer
				// is still awaited: the table gives no GPU to any step
				// until it comes (Untrusted), and a step of a job whose
				// list names an index the table then lacks is refused
				// (stepStart), as a broken job's would be.
				log.Warn("job prolog recorded with a GPU the table does not have yet; it waits for slurmd's answer (slurmd -G)", "gpu", g)
			}
			j.GPUs = gpus
		}
	}
	h.Registry.Prolog(j)
	if h.Recovery != nil {
		h.Recovery.Forget(j.ID)
	}
	if j.Broken != "" {
		log.Error("job prolog recorded with an unusable GPU list; its GPU steps will be refused", "reason", j.Broken)
		return
	}
	log.Info("job prolog recorded", "gpus", gpulist.Format(j.GPUs))
}

func (h *Handler) stepStart(ctx context.Context, p peer.Peer, m *pb.StepStart) (*pb.Response, error) {
	jobID, stepID, uid := m.GetJobId(), m.GetStepId(), m.GetUid()
	name := fmt.Sprintf("%d.%s", jobID, policy.StepName(stepID))
	log := h.Log.With("job_id", jobID, "step_id", policy.StepName(stepID), "uid", uid)
	// NSS, maybe LDAP: cached after the first of the user's steps.
	user := h.Users.Name(uid)

	// Where the step lives: from slurmstepd's own cgroup, and every task
	// pid (older plugins send them) must be in the same step.
	lookupFailed := func(err error) error {
		h.emit(audit.EventLookupFailed, audit.SeverityError, "the step's cgroup could not be found; the step is refused", func(r *audit.Record) {
			r.JobID, r.StepID, r.UID, r.User, r.PID, r.Error = jobID, policy.StepName(stepID), audit.UID(uid), user, uint32(p.PID), err.Error()
		})
		return err
	}
	loc, err := h.forPID(p.PID)
	if err == nil {
		// The pid was read from the socket; the cgroup from /proc. Both
		// name slurmstepd only if it is still the same process.
		err = p.Verify()
	}
	if err != nil {
		return nil, lookupFailed(fmt.Errorf("step %s: cannot place slurmstepd in Slurm's cgroup tree (%w); gpufence needs CgroupPlugin=cgroup/v2 with ProctrackType=proctrack/cgroup", name, err))
	}
	for _, pid := range m.GetTaskPids() {
		tl, err := h.forPID(int(pid))
		if err != nil {
			return nil, lookupFailed(fmt.Errorf("step %s: task pid %d: %w", name, pid, err))
		}
		if tl.Step != loc.Step {
			return nil, lookupFailed(fmt.Errorf("step %s: task pid %d is in %s, not in its step's cgroup %s", name, pid, tl.Step, loc.Step))
		}
	}
	cgID, err := h.cgroups().ID(loc.Step)
	if err != nil {
		return nil, lookupFailed(fmt.Errorf("step %s: %w", name, err))
	}
	cg := cgroup.Cgroup{ID: cgID, Path: loc.Step}
	st, err := h.Settings.Get()
	if err != nil {
		return nil, fmt.Errorf("step %s: %w", name, err)
	}

	j, known := h.Registry.Job(jobID)
	if known && h.expireUnconfirmed(j) {
		j, known = h.Registry.Job(jobID)
	}
	if known && j.Unconfirmed != "" && h.Recovery != nil && h.Recovery.Due(jobID) {
		h.retryUnconfirmed(j)
		j, known = h.Registry.Job(jobID)
	}
	if (!known || j.NoProlog) && h.Recovery != nil && h.Recovery.Due(jobID) {
		h.recover(jobID, uid, user)
		j, known = h.Registry.Job(jobID)
	}

	if err := h.Enforcer.Ensure(loc.Scope); err != nil {
		return nil, fmt.Errorf("step %s: %w", name, err)
	}
	// Slurm makes its stepd parking cgroup when the first step starts.
	h.Enforcer.RefreshExempt()
	var pj *policy.Job
	auditOnly := false
	if known {
		if j.UID != uid && !(j.Unconfirmed != "" && j.UID == UnknownUID) {
			return nil, fmt.Errorf("step %s runs as uid %d but the job's prolog recorded uid %d", name, uid, j.UID)
		}
		if j.Broken != "" {
			return nil, errors.New(j.Broken)
		}
		switch {
		case j.Unconfirmed == registry.UnconfirmedAuditOnly:
			// Audited, not enforced: the step gets what it asks for, and
			// every open beyond that is a would-deny record.
			pj, auditOnly = &policy.Job{ID: j.ID, UID: uid, GPUs: h.askedFor(stepID, m.StepGpus)}, true
		case j.Unconfirmed == registry.UnconfirmedDeny:
		case !j.NoProlog:
			pj = &policy.Job{ID: j.ID, UID: j.UID, GPUs: j.GPUs}
		}
	}
	dec, err := policy.ForStep(pj, jobID, stepID, m.StepGpus)
	if err != nil {
		if known && j.Unconfirmed == registry.UnconfirmedDeny {
			return nil, fmt.Errorf("job %d has no trusted GPU list on this node (it was running when the gpufence agent started: %s); refusing to start a GPU step", jobID, j.Adopted)
		}
		return nil, err
	}
	if h.Late != nil {
		if len(dec.GPUs) > 0 {
			h.Late.Await(ctx)
		} else {
			h.Late.Kick(true)
		}
		// From reading the table to recording the step: slurmd's late
		// answer replaces the table only while no step holds a GPU.
		release := h.Late.Hold()
		defer release()
	}
	if why := h.Table.Untrusted(); why != "" && len(dec.GPUs) > 0 {
		return nil, fmt.Errorf("step %s: %s", name, why)
	}
	if known && !j.NoProlog && j.Unconfirmed == "" {
		// A list recorded while the table waited for slurmd (jobProlog)
		// is checked against the table as it is now: a GPU it lacks
		// fails the job's steps, as at the prolog.
		if g, bad := h.Table.Unknown(j.GPUs); bad {
			return nil, fmt.Errorf("job %d was given GPU %d, which is not in this node's GPU table; refusing to guess which device it is", j.ID, g)
		}
	}
	if dec.Note != "" {
		log.Warn(dec.Note)
	}
	set, err := h.Table.Devices(dec.GPUs)
	if err != nil {
		return nil, fmt.Errorf("step %s: %w", name, err)
	}
	resp := &pb.Response{SlurmLocalIndices: st.LocalGPUIndices(), StepCgroup: "/" + strings.TrimPrefix(strings.TrimPrefix(loc.Step, h.Mount), "/"),
		// A step without GPUs never gets a channel: IMEX shares GPU memory,
		// and the channel it has not got is denied in the kernel.
		ImexPending: h.IMEXMajor != 0 && h.IMEXFromSlurm && len(dec.GPUs) > 0}
	for _, g := range dec.GPUs {
		resp.Gpus = append(resp.Gpus, uint32(g))
	}
	// Per-task entries only for what Slurm binds per task (task/cgroup
	// never narrows batch, extern or interactive steps), under an entry
	// that is enforced, and where Slurm's own numbering is not local
	// (ConstrainDevices=yes narrows each task itself).
	resp.TaskBind = h.TaskBinding && h.scopeMode() && !policy.WholeJobStep(stepID) && len(dec.GPUs) > 0 &&
		!auditOnly && !st.LocalGPUIndices()
	var imex []uint32
	prev, hadPrev := h.Registry.Step(jobID, stepID)
	if hadPrev && prev.Cgroup.ID == cg.ID && slices.Equal(prev.GPUs, dec.GPUs) && prev.AuditOnly == auditOnly {
		return resp, nil // a repeated request
	} else if hadPrev && prev.Cgroup.ID == cg.ID && resp.ImexPending {
		imex = prev.IMEXChannels // learned already, from this very cgroup
	}
	if hadPrev {
		// The step's list changes: its tasks' entries, narrowed within
		// the old one, go, and the tasks fall back to the step's entry.
		h.releaseTasks(prev)
	}
	// The record first, then the kernel entry: a crash between them leaves
	// a record whose entry the next start writes (WriteRecorded), never an
	// entry the agent has no record of.
	placeholder := h.Registry.AddStep(registry.Step{JobID: jobID, StepID: stepID, UID: uid, Cgroup: cg, GPUs: dec.GPUs, AuditOnly: auditOnly, IMEXChannels: imex}, loc.Job)
	if err := h.Enforcer.Set(cg, devfilter.Policy{GPUMinors: set.GPUMinors, CapsMinors: set.CapsMinors, AuditOnly: auditOnly, IMEXChannels: imex}); err != nil {
		h.Registry.RemoveCgroup(cg.ID)
		if hadPrev && prev.Cgroup.ID == cg.ID {
			h.Registry.AddStep(prev, loc.Job) // its entry is still the kernel's
		}
		return nil, fmt.Errorf("step %s: cannot install its GPU policy: %w", name, err)
	}
	if placeholder {
		// No prolog (CPU-only use only, see policy.ForStep): the record
		// lets the step's entry go when it ends.
		h.emit(audit.EventJobWithoutProlog, audit.SeverityWarning, dec.Note, func(r *audit.Record) {
			r.JobID, r.StepID, r.UID, r.User = jobID, policy.StepName(stepID), audit.UID(uid), user
		})
	}
	h.watch(cg)
	mode, msg := h.Mode.String(), fmt.Sprintf("job %d step %s may open GPUs [%s]", jobID, policy.StepName(stepID), gpulist.Format(dec.GPUs))
	if auditOnly {
		mode, msg = audit.ModeAuditOnly, msg+"; its job is unconfirmed (adopt_unconfirmed: audit-only): any other GPU opens too, audited as would-deny"
	}
	log.Info("step policy applied", "gpus", gpulist.Format(dec.GPUs), "cgroup", cg.Path, "audit_only", auditOnly)
	h.emit(audit.EventPolicyApplied, audit.SeverityInfo, msg, func(r *audit.Record) {
		r.JobID, r.StepID, r.UID, r.User = jobID, policy.StepName(stepID), audit.UID(uid), user
		r.GPUs, r.Cgroup, r.CgroupID, r.PolicyMode = append([]int{}, dec.GPUs...), cg.Path, cg.ID, mode
	})
	return resp, nil
}

// recover asks slurmctld for the GPUs of a job the agent has no prolog
// record of, records them as its trusted list, and audits it either way.
func (h *Handler) recover(jobID, uid uint32, user string) {
	o := h.Recovery.Ask(jobID, uid)
	if o.Job != nil && !h.Registry.Recovered(*o.Job) {
		return // a prolog came meanwhile
	}
	if o.Job != nil {
		h.Recovery.Forget(jobID)
	}
	h.Log.Warn(o.Message, "job_id", jobID)
	h.emit(audit.EventJobWithoutProlog, o.Severity, o.Message, func(r *audit.Record) {
		r.JobID, r.UID, r.User = jobID, audit.UID(uid), user
		if o.Err != nil {
			r.Error = o.Err.Error()
		}
		if o.Job != nil {
			r.GPUs = append([]int{}, o.Job.GPUs...)
		}
	})
}

// askedFor is the GPU list a step of an unconfirmed job asks for
// (SLURM_STEP_GPUS; none for a whole-job step), only as a reply and a policy that is audited, not
// enforced; indices the table lacks are left out.
func (h *Handler) askedFor(stepID uint32, stepGPUs *string) []int {
	if stepGPUs == nil || policy.WholeJobStep(stepID) {
		return []int{}
	}
	gpus, err := gpulist.Parse(*stepGPUs)
	if err != nil {
		return []int{}
	}
	return slices.DeleteFunc(gpus, func(g int) bool { _, bad := h.Table.Unknown([]int{g}); return bad })
}

// stepEnd is what older plugins sent at a step's end; the agent now learns
// of it from the step's cgroup going (StepGone).
func (h *Handler) stepEnd(jobID, stepID uint32) {
	if s, ok := h.Registry.RemoveStep(jobID, stepID); ok {
		h.release(s, "step ended")
	}
}

// StepGone releases the step registered on cgroup id, which Slurm removed:
// the step ended, or its slurmstepd died.
func (h *Handler) StepGone(id uint64, why string) {
	if s, ok := h.Registry.RemoveCgroup(id); ok {
		h.release(s, why)
	}
}

// JobEnded releases the job and every step of it: its epilog came, or
// slurmctld says it ended.
func (h *Handler) JobEnded(jobID uint32, why string) {
	for _, s := range h.Registry.DropJob(jobID) {
		h.release(s, why)
	}
	if h.Recovery != nil {
		h.Recovery.Forget(jobID)
	}
	h.Log.Info("job released", "job_id", jobID, "reason", why)
}

// release takes a forgotten step's entry from the kernel and audits it.
func (h *Handler) release(s registry.Step, why string) {
	o := registry.Owner{JobID: s.JobID, StepID: s.StepID, UID: s.UID, GPUs: s.GPUs}
	if err := h.Enforcer.Release(s.Cgroup, o); err != nil {
		h.Log.Error("remove step policy", "job_id", s.JobID, "step_id", policy.StepName(s.StepID), "cgroup", s.Cgroup.Path, "err", err)
	}
	h.releaseTasks(s)
	h.Log.Info("step policy removed", "job_id", s.JobID, "step_id", policy.StepName(s.StepID), "reason", why)
	h.emit(audit.EventPolicyReleased, audit.SeverityInfo, fmt.Sprintf("job %d step %s released (%s)", s.JobID, policy.StepName(s.StepID), why), func(r *audit.Record) {
		r.JobID, r.StepID, r.UID, r.User = s.JobID, policy.StepName(s.StepID), audit.UID(s.UID), h.Users.Name(s.UID)
		r.Cgroup, r.CgroupID, r.Reason = s.Cgroup.Path, s.Cgroup.ID, why
		r.GPUs = append([]int{}, s.GPUs...)
	})
}

// stepChannel learns the step's IMEX channel from the connecting process's
// own mount namespace, where Slurm's switch/nvidia_imex made it (see
// agent/imexchan for why no user can set it), and lets the step's cgroup
// open it and no other. The peer must be in the step's registered cgroup
// (slurmstepd, from task_post_fork, before any task may exec). Any doubt
// refuses: the step then opens no channel, and its tasks do not start.
func (h *Handler) stepChannel(p peer.Peer, m *pb.StepChannel) (*pb.Response, error) {
	jobID, stepID := m.GetJobId(), m.GetStepId()
	name := fmt.Sprintf("%d.%s", jobID, policy.StepName(stepID))
	if h.IMEXMajor == 0 || !h.IMEXFromSlurm {
		return nil, fmt.Errorf("step %s asked for its IMEX channel, but this agent does not take channels from Slurm (imex_channels)", name)
	}
	s, ok := h.Registry.Step(jobID, stepID)
	if !ok {
		return nil, fmt.Errorf("step %s asked for its IMEX channel but is not registered", name)
	}
	loc, err := h.forPID(p.PID)
	if err != nil {
		return nil, fmt.Errorf("step %s: cannot place the caller in Slurm's cgroup tree: %w", name, err)
	}
	if id, err := h.cgroups().ID(loc.Step); err != nil || id != s.Cgroup.ID {
		return nil, fmt.Errorf("step %s: the caller is in %s, not in the step's cgroup %s", name, loc.Step, s.Cgroup.Path)
	}
	if len(s.GPUs) == 0 {
		return &pb.Response{}, nil // no GPU, no channel (stepStart did not ask)
	}
	channels, err := h.imex().Read(p.PID, h.IMEXMajor)
	if errors.Is(err, imexchan.ErrNoMount) {
		channels, err = nil, nil // Slurm made none for this step
	}
	if err == nil {
		// Read through /proc/<pid>: only slurmstepd's if it still runs.
		err = p.Verify()
	}
	if err != nil {
		return nil, fmt.Errorf("step %s: cannot read its IMEX channel from slurmstepd: %w", name, err)
	}
	if len(channels) > 0 {
		set, err := h.Table.Devices(s.GPUs)
		if err != nil {
			return nil, fmt.Errorf("step %s: %w", name, err)
		}
		if _, ok, err := h.Registry.SetIMEX(jobID, stepID, s.Cgroup.ID, channels); err != nil || !ok {
			return nil, fmt.Errorf("step %s: cannot record its IMEX channel %v (%v)", name, channels, err)
		}
		if err := h.Enforcer.Set(s.Cgroup, devfilter.Policy{GPUMinors: set.GPUMinors, CapsMinors: set.CapsMinors, AuditOnly: s.AuditOnly, IMEXChannels: channels}); err != nil {
			return nil, fmt.Errorf("step %s: cannot install its IMEX channel: %w", name, err)
		}
	}
	resp := &pb.Response{}
	msg := fmt.Sprintf("job %d step %s may open no IMEX channel (Slurm made none for it)", jobID, policy.StepName(stepID))
	if len(channels) > 0 {
		resp.ImexChannel = &channels[0]
		msg = fmt.Sprintf("job %d step %s may open IMEX channel %d (made by Slurm in slurmstepd's namespace)", jobID, policy.StepName(stepID), channels[0])
	}
	h.Log.Info("step IMEX channel", "job_id", jobID, "step_id", policy.StepName(stepID), "imex_channels", fmt.Sprint(channels), "cgroup", s.Cgroup.Path)
	h.emit(audit.EventPolicyApplied, audit.SeverityInfo, msg, func(r *audit.Record) {
		r.JobID, r.StepID, r.UID, r.User = jobID, policy.StepName(stepID), audit.UID(s.UID), h.Users.Name(s.UID)
		r.GPUs, r.Cgroup, r.CgroupID, r.PolicyMode = append([]int{}, s.GPUs...), s.Cgroup.Path, s.Cgroup.ID, h.Mode.String()
	})
	return resp, nil
}

// scopeMode reports whether the filter looks entries up by ancestor
// (scope mode): only there does a task cgroup's own entry decide; the
// per-cgroup program sits on step cgroups alone.
func (h *Handler) scopeMode() bool {
	f := h.Enforcer.Filter()
	return f != nil && f.Mode() == devfilter.ModeScope
}

// noTaskCgroupSaid reports whether the step on cgroup id was already
// logged as having no per-task cgroups, and marks it so.
func (h *Handler) noTaskCgroupSaid(id uint64) bool {
	h.verifyMu.Lock()
	defer h.verifyMu.Unlock()
	if h.saidNoTask == nil {
		h.saidNoTask = map[uint64]bool{}
	}
	if len(h.saidNoTask) > 4096 {
		clear(h.saidNoTask) // bounded: a line more now and then
	}
	said := h.saidNoTask[id]
	h.saidNoTask[id] = true
	return said
}

// releaseTasks takes the entries of s's task cgroups from the kernel.
func (h *Handler) releaseTasks(s registry.Step) {
	o := registry.Owner{JobID: s.JobID, StepID: s.StepID, UID: s.UID, GPUs: s.GPUs}
	for _, t := range s.Tasks {
		if err := h.Enforcer.Release(t, o); err != nil {
			h.Log.Error("remove task policy", "job_id", s.JobID, "step_id", policy.StepName(s.StepID), "cgroup", t.Path, "err", err)
		}
	}
}

// taskBind narrows one task of a registered step to its binding
// (task_binding: slurm): the GPUs of the step that the task's
// CUDA_VISIBLE_DEVICES names, as Slurm set it for the task. The task is
// the connecting process (SO_PEERCRED: the task child, which connected as
// root from task_init_privileged), found in its own cgroup, which must be
// a task of the step's registered cgroup; nothing in the message names a
// cgroup. The result only ever narrows within the step's list, so no
// value the user put in the task's environment opens more than the step
// holds. A task whose list is the step's needs no entry: it inherits the
// step's.
func (h *Handler) taskBind(p peer.Peer, m *pb.TaskBind) (*pb.Response, error) {
	jobID, stepID := m.GetJobId(), m.GetStepId()
	name := fmt.Sprintf("%d.%s task %d", jobID, policy.StepName(stepID), m.GetTaskId())
	if !h.TaskBinding {
		return nil, fmt.Errorf("step %s sent its task binding, but this agent keeps one list per step (task_binding: step)", name)
	}
	s, ok := h.Registry.Step(jobID, stepID)
	if !ok {
		return nil, fmt.Errorf("step %s sent its task binding but is not registered", name)
	}
	if policy.WholeJobStep(stepID) || s.AuditOnly {
		return nil, fmt.Errorf("step %s: its tasks are not bound one by one (a batch, extern, interactive or audit-only step)", name)
	}
	cgPath, err := h.cgroups().PathOf(p.PID)
	var dir string
	if err == nil {
		dir, err = jobcgroup.TaskOf(h.Mount, cgPath, s.Cgroup.Path)
	}
	if errors.Is(err, jobcgroup.ErrNoTaskCgroup) {
		if err := p.Verify(); err != nil {
			return nil, fmt.Errorf("step %s: cannot place the task in its step's cgroup: %w", name, err)
		}
		// Nothing to narrow by: the task keeps its step's entry, as under
		// task_binding: step. Said once per step in the log, with the fix.
		if !h.noTaskCgroupSaid(s.Cgroup.ID) {
			h.Log.Warn("task keeps its step's GPUs: "+err.Error(), "job_id", jobID, "step_id", policy.StepName(stepID), "cgroup", filepath.Join(h.Mount, cgPath))
		}
		resp := &pb.Response{}
		for _, g := range s.GPUs {
			resp.Gpus = append(resp.Gpus, uint32(g))
		}
		return resp, nil
	}
	var id uint64
	if err == nil {
		id, err = h.cgroups().ID(dir)
	}
	if err == nil {
		// The step's directory is still the registered cgroup, not one
		// made again under its name.
		if now, serr := h.cgroups().ID(s.Cgroup.Path); serr != nil || now != s.Cgroup.ID {
			err = fmt.Errorf("the step's cgroup %s is no longer the one registered", s.Cgroup.Path)
		}
	}
	if err == nil {
		// Read through /proc/<pid>: only the task's if it still runs.
		err = p.Verify()
	}
	if err != nil {
		return nil, fmt.Errorf("step %s: cannot place the task in its step's cgroup: %w", name, err)
	}
	gpus, note := policy.ForTask(s.GPUs, m.VisibleDevices)
	log := h.Log.With("job_id", jobID, "step_id", policy.StepName(stepID), "task_id", m.GetTaskId())
	if note != "" {
		log.Warn(note)
	}
	resp := &pb.Response{}
	for _, g := range gpus {
		resp.Gpus = append(resp.Gpus, uint32(g))
	}
	if slices.Equal(gpus, s.GPUs) {
		log.Debug("task keeps its step's GPUs", "gpus", gpulist.Format(gpus))
		return resp, nil
	}
	set, err := h.Table.Devices(gpus)
	if err != nil {
		return nil, fmt.Errorf("step %s: %w", name, err)
	}
	cg := cgroup.Cgroup{ID: id, Path: dir}
	var imex []uint32
	if len(gpus) > 0 {
		imex = s.IMEXChannels // a task without a GPU gets no channel, as a step
	}
	// The record first, then the kernel entry, as for a step.
	if _, ok := h.Registry.AddTask(jobID, stepID, s.Cgroup.ID, cg, gpus); !ok {
		return nil, fmt.Errorf("step %s ended or was registered again while its task was bound", name)
	}
	if err := h.Enforcer.Set(cg, devfilter.Policy{GPUMinors: set.GPUMinors, CapsMinors: set.CapsMinors, IMEXChannels: imex}); err != nil {
		return nil, fmt.Errorf("step %s: cannot install the task's GPU policy: %w", name, err)
	}
	log.Info("task policy applied", "gpus", gpulist.Format(gpus), "cgroup", dir)
	h.emit(audit.EventPolicyApplied, audit.SeverityInfo,
		fmt.Sprintf("job %d step %s task %d may open GPUs [%s] of its step's [%s] (task_binding: slurm)", jobID, policy.StepName(stepID), m.GetTaskId(), gpulist.Format(gpus), gpulist.Format(s.GPUs)),
		func(r *audit.Record) {
			r.JobID, r.StepID, r.UID, r.User = jobID, policy.StepName(stepID), audit.UID(s.UID), h.Users.Name(s.UID)
			r.GPUs, r.Cgroup, r.CgroupID, r.PolicyMode = append([]int{}, gpus...), dir, id, h.Mode.String()
		})
	return resp, nil
}
