// SPDX-License-Identifier: Apache-2.0

// Package adopt takes over jobs that were running when the agent started
// with no record of them: the first start on a busy node (gpufence put in
// place while training runs), or records lost. Without it their processes
// would get EPERM on their own GPUs the moment the filter attaches.
//
// Plan finds the job cgroups under Slurm's scope that have no record and
// asks slurmctld about each through the path no job user can steer
// (agent/recovery, agent/slurm.Controller); Apply writes their records and
// kernel entries, which the agent does before its program first runs
// (devfilter.Options.BeforeAttach). A job slurmctld confirms keeps exactly
// its GPUs on this node. A job it cannot confirm because its client could
// not connect is handled as adopt_unconfirmed says (deny, the default, or
// audit-only for that job alone and at most adopt_unconfirmed_max) until
// slurmctld answers or the job ends; a job it refuses (an ambiguous, slow,
// oversize or malformed answer, another owner, not running here) gets no
// GPU: a user can make slurmctld slow, so slowness is not an outage.
package adopt

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/gpulist"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/recovery"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Asker is slurmctld as adoption asks it; *recovery.Recovery implements it.
type Asker interface {
	Adopt(id uint32) recovery.Outcome
}

// Table turns GPU indices into device minors.
type Table interface {
	Devices(gpus []int) (policy.DeviceSet, error)
}

// Recorder receives the audit records.
type Recorder interface {
	Emit(r audit.Record)
}

// Names is the user-name cache.
type Names interface {
	Name(uid uint32) string
}

// Adopter plans and applies adoptions.
type Adopter struct {
	Log      *slog.Logger
	Registry *registry.Registry
	// Asker is nil when recover_from_slurmctld is off: every job found is
	// then unconfirmed.
	Asker    Asker
	Table    Table
	Recorder Recorder
	Users    Names
	// Unconfirmed is registry.UnconfirmedDeny or UnconfirmedAuditOnly.
	Unconfirmed string
	// Parallel bounds the questions to slurmctld in flight; default 8.
	Parallel int
	// Proc is /proc; for tests.
	Proc string

	// held is the plan Hold kept for the filter's attach.
	heldMu sync.Mutex
	held   []Job
}

// Step is a step cgroup found under a job's.
type Step struct {
	ID     uint32
	Cgroup cgroup.Cgroup
}

// Job is one job found running with no record, and what slurmctld said.
type Job struct {
	ID    uint32
	Dir   string
	Steps []Step
	// UID is slurmctld's owner when it confirmed the job, else the owner of
	// the job's task processes (the kernel's, not a job field).
	UID     uint32
	Outcome recovery.Outcome
	// Refused: slurmctld did not vouch for the job (unknown, not running
	// here, an ambiguous, slow or unusable answer): it gets no GPU, whatever
	// adopt_unconfirmed says, since a job user can cause each of those.
	Refused bool
}

// Confirmed reports whether slurmctld vouched for the job's list.
func (j Job) Confirmed() bool { return j.Outcome.Job != nil }

// Plan lists the jobs under scope with no record and asks slurmctld about
// them, at most Parallel at once. It only reads.
func (a *Adopter) Plan(scope string) []Job {
	entries, err := os.ReadDir(scope)
	if err != nil {
		a.Log.Error("adopt running jobs: read Slurm's scope", "scope", scope, "err", err)
		return nil
	}
	var found []Job
	for _, e := range entries {
		if !e.IsDir() || !isJobDir(e.Name()) {
			continue
		}
		dir := filepath.Join(scope, e.Name())
		steps := a.steps(dir)
		id, err := a.jobID(e.Name(), steps)
		if err != nil {
			a.Log.Warn("adopt running jobs: a job cgroup whose job id cannot be read from a source no user can set; it gets no GPU", "cgroup", dir, "err", err)
			a.emit(audit.EventJobAdopted, audit.SeverityError, fmt.Sprintf("job cgroup %s was running when the agent started and its job id could not be read (%v); its processes get no GPU", dir, err), func(r *audit.Record) {
				r.Cgroup, r.Error = dir, err.Error()
			})
			continue
		}
		if _, known := a.Registry.Job(id); known {
			continue
		}
		found = append(found, Job{ID: id, Dir: dir, Steps: steps})
	}
	n := a.Parallel
	if n <= 0 {
		n = 8
	}
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i := range found {
		wg.Add(1)
		sem <- struct{}{}
		go func(j *Job) {
			defer func() { <-sem; wg.Done() }()
			a.ask(j)
		}(&found[i])
	}
	wg.Wait()
	return found
}

func (a *Adopter) ask(j *Job) {
	if a.Asker == nil {
		j.Outcome = recovery.Outcome{Unreachable: true, Severity: audit.SeverityWarning,
			Message: fmt.Sprintf("job %d was running with no record when the agent started and recover_from_slurmctld is off, so slurmctld was not asked", j.ID)}
	} else {
		j.Outcome = a.Asker.Adopt(j.ID)
	}
	switch {
	case j.Outcome.Job != nil:
		j.UID = j.Outcome.Job.UID
	case j.Outcome.Unreachable:
		j.UID = a.taskOwner(j)
	default:
		j.Refused = true
		j.UID = a.taskOwner(j)
	}
}

// Hold keeps plan until the filter's attach writes it (ApplyHeld).
func (a *Adopter) Hold(plan []Job) {
	a.heldMu.Lock()
	defer a.heldMu.Unlock()
	a.held = plan
}

// ApplyHeld applies the plan Hold kept, once: the first filter attached
// writes it (enforcer.Options.Restore).
func (a *Adopter) ApplyHeld(set func(cgroup.Cgroup, devfilter.Policy) error) {
	a.heldMu.Lock()
	plan := a.held
	a.held = nil
	a.heldMu.Unlock()
	a.Apply(plan, set)
}

// Apply records the planned jobs and writes their kernel entries with set.
// It is called with the filter loaded and not yet attached, so it must not
// block: every question was asked in Plan. A job whose entry cannot be
// written keeps no entry (no GPU) and is audited.
func (a *Adopter) Apply(plan []Job, set func(cgroup.Cgroup, devfilter.Policy) error) {
	for _, j := range plan {
		a.apply(j, set)
	}
}

func (a *Adopter) apply(j Job, set func(cgroup.Cgroup, devfilter.Policy) error) {
	user := a.Users.Name(j.UID)
	fill := func(r *audit.Record) {
		r.JobID, r.UID, r.User, r.Cgroup = j.ID, audit.UID(j.UID), user, j.Dir
		if j.Outcome.Err != nil {
			r.Error = j.Outcome.Err.Error()
		}
	}
	rec := registry.Job{ID: j.ID, UID: j.UID, GPUs: []int{}, Dir: j.Dir, Created: time.Now()}
	var p devfilter.Policy
	mode := ""
	switch {
	case j.Confirmed():
		rec.GPUs, rec.Broken, rec.Recovered = j.Outcome.Job.GPUs, j.Outcome.Job.Broken, j.Outcome.Job.Recovered
		rec.Adopted = "confirmed by slurmctld (" + j.Outcome.Job.Recovered + ")"
		if rec.Broken == "" {
			set, err := a.Table.Devices(rec.GPUs)
			if err != nil {
				rec.Broken = fmt.Sprintf("job %d: %v", j.ID, err)
				rec.GPUs = []int{}
			} else {
				p = devfilter.Policy{GPUMinors: set.GPUMinors, CapsMinors: set.CapsMinors}
			}
		}
	case j.Refused:
		// Recorded as denied, so that its entries (in per-cgroup mode its
		// links) are owned, and released once slurmctld says it ended.
		mode = registry.UnconfirmedDeny
		rec.Unconfirmed = mode
		rec.Adopted = "refused: " + j.Outcome.Message
	default:
		mode = a.Unconfirmed
		rec.Unconfirmed = mode
		rec.Adopted = "not confirmed by slurmctld, adopt_unconfirmed: " + mode + ": " + j.Outcome.Message
		p.AuditOnly = mode == registry.UnconfirmedAuditOnly
	}
	var steps []registry.Step
	for _, s := range j.Steps {
		steps = append(steps, registry.Step{JobID: j.ID, StepID: s.ID, UID: j.UID, Cgroup: s.Cgroup,
			GPUs: slices.Clone(rec.GPUs), AuditOnly: p.AuditOnly, Adopted: true})
	}
	if !a.Registry.Adopt(rec, steps) {
		return // a record came meanwhile
	}
	for _, s := range steps {
		if err := set(s.Cgroup, p); err != nil {
			a.Log.Error("adopt running jobs: write a step's kernel entry; it gets no GPU", "job_id", j.ID, "cgroup", s.Cgroup.Path, "err", err)
			a.emit(audit.EventJobAdopted, audit.SeverityError, fmt.Sprintf("job %d step %s: its kernel entry could not be written; it gets no GPU", j.ID, policy.StepName(s.StepID)), func(r *audit.Record) {
				fill(r)
				r.StepID, r.Cgroup, r.CgroupID, r.Error = policy.StepName(s.StepID), s.Cgroup.Path, s.Cgroup.ID, err.Error()
			})
		}
	}
	var msg string
	sev := audit.SeverityInfo
	switch {
	case j.Refused:
		msg, sev = j.Outcome.Message, j.Outcome.Severity
	case j.Confirmed() && rec.Broken != "":
		msg, sev = fmt.Sprintf("job %d was running when the agent started; slurmctld's list cannot be used (%s); its steps get no GPU", j.ID, rec.Broken), audit.SeverityError
	case j.Confirmed():
		msg = fmt.Sprintf("job %d was running when the agent started; slurmctld confirmed GPUs [%s] (%s); its %d running steps keep exactly those", j.ID, gpulist.Format(rec.GPUs), rec.Recovered, len(steps))
	case mode == registry.UnconfirmedAuditOnly:
		msg, sev = fmt.Sprintf("%s; adopt_unconfirmed is audit-only: its %d running steps may open any GPU, each open of one it may not have is audited, until slurmctld confirms it or it ends", j.Outcome.Message, len(steps)), audit.SeverityWarning
	default:
		msg, sev = fmt.Sprintf("%s; adopt_unconfirmed is deny: its %d running steps get no GPU until slurmctld confirms it or it ends", j.Outcome.Message, len(steps)), audit.SeverityWarning
	}
	a.Log.Info("adopted a running job", "job_id", j.ID, "uid", j.UID, "gpus", gpulist.Format(rec.GPUs), "steps", len(steps), "unconfirmed", mode, "detail", msg)
	a.emit(audit.EventJobAdopted, sev, msg, func(r *audit.Record) {
		fill(r)
		r.GPUs, r.Reason = slices.Clone(rec.GPUs), rec.Adopted
		if mode != "" {
			r.PolicyMode = audit.ModeAuditOnly
			if mode == registry.UnconfirmedDeny {
				r.PolicyMode = audit.ModeEnforce
			}
		}
	})
}

func (a *Adopter) emit(ev audit.Event, sev audit.Severity, msg string, fill func(*audit.Record)) {
	r := audit.Record{Event: ev, Severity: sev, Message: msg}
	fill(&r)
	a.Recorder.Emit(r)
}

// isJobDir: Slurm's job cgroups are job_<id>, or (26.05) named by SLUID;
// its own children of the scope are system and slurmd-like names.
func isJobDir(name string) bool {
	if strings.HasPrefix(name, "job_") {
		return true
	}
	switch name {
	case "system", "slurmd", "user":
		return false
	}
	// A SLUID (26.05): a lower-case letter and base-32 digits, no dots.
	return len(name) > 1 && !strings.ContainsAny(name, "._-")
}

// steps lists the step cgroups of a job directory.
func (a *Adopter) steps(dir string) []Step {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []Step
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), "step_")
		if !e.IsDir() || !ok {
			continue
		}
		id, ok := stepID(name)
		if !ok {
			continue
		}
		p := filepath.Join(dir, e.Name())
		cg, err := jobcgroup.ID(p)
		if err != nil {
			continue
		}
		out = append(out, Step{ID: id, Cgroup: cgroup.Cgroup{ID: cg, Path: p}})
	}
	return out
}

func stepID(name string) (uint32, bool) {
	switch name {
	case "batch":
		return policy.BatchStep, true
	case "extern":
		return policy.ExternStep, true
	case "interactive":
		return policy.InteractiveStep, true
	}
	n, err := strconv.ParseUint(name, 10, 32)
	if err != nil || n >= uint64(policy.InteractiveStep) {
		return 0, false
	}
	return uint32(n), true
}

// jobID reads the job id: from the directory name job_<id>, which only
// root (slurmstepd) makes; for SLUID names, from the process title of the
// job's slurmstepd ("slurmstepd: [<job>.<step>]"), a root process whose
// title no job user can write.
func (a *Adopter) jobID(name string, steps []Step) (uint32, error) {
	if s, ok := strings.CutPrefix(name, "job_"); ok {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n == 0 {
			return 0, fmt.Errorf("job cgroup %q: not job_<id>", name)
		}
		return uint32(n), nil
	}
	for _, s := range steps {
		for _, pid := range procs(filepath.Join(s.Cgroup.Path, "slurm")) {
			if id, ok := a.stepdJob(pid); ok {
				return id, nil
			}
		}
	}
	return 0, fmt.Errorf("job cgroup %q: no slurmstepd with a job id in its title", name)
}

func (a *Adopter) proc() string {
	if a.Proc != "" {
		return a.Proc
	}
	return "/proc"
}

// stepdJob returns the job id in the title of pid, when pid is a root
// slurmstepd.
func (a *Adopter) stepdJob(pid int) (uint32, bool) {
	dir := filepath.Join(a.proc(), strconv.Itoa(pid))
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil || st.Uid != 0 {
		return 0, false
	}
	if exe, err := os.Readlink(filepath.Join(dir, "exe")); err != nil || !isSlurmstepd(exe) {
		return 0, false
	}
	cmd, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return 0, false
	}
	title, _, _ := bytes.Cut(cmd, []byte{0})
	rest, ok := strings.CutPrefix(strings.TrimSpace(string(title)), "slurmstepd: [")
	if !ok {
		return 0, false
	}
	job, _, ok := strings.Cut(rest, ".")
	n, err := strconv.ParseUint(job, 10, 32)
	if !ok || err != nil || n == 0 {
		return 0, false
	}
	return uint32(n), true
}

// isSlurmstepd: the binary's name is SchedMD's slurmstepd, or Debian's
// slurmstepd-wlm (/usr/sbin/slurmstepd is an alternatives link to it, and
// the kernel names the file the link resolves to).
func isSlurmstepd(exe string) bool {
	switch filepath.Base(exe) {
	case "slurmstepd", "slurmstepd-wlm":
		return true
	}
	return false
}

// taskOwner is the uid of the job's task processes (the kernel's record
// of who runs them), or registry's "unknown" (MaxUint32) when none runs.
func (a *Adopter) taskOwner(j *Job) uint32 {
	found := noUID
	for _, s := range j.Steps {
		_ = filepath.WalkDir(s.Cgroup.Path, func(p string, d os.DirEntry, err error) error {
			switch {
			case err != nil || !d.IsDir():
				return nil
			case d.Name() == "slurm" && p != s.Cgroup.Path:
				return filepath.SkipDir // slurmstepd, root
			}
			for _, pid := range procs(p) {
				var st syscall.Stat_t
				if syscall.Stat(filepath.Join(a.proc(), strconv.Itoa(pid)), &st) == nil && st.Uid != 0 {
					found = st.Uid
					return filepath.SkipAll
				}
			}
			return nil
		})
		if found != noUID {
			break
		}
	}
	return found
}

const noUID = ^uint32(0)

// procs lists the pids in a cgroup directory (not its children).
func procs(dir string) []int {
	f, err := os.Open(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []int
	sc := bufio.NewScanner(f)
	for sc.Scan() && len(out) < 64 {
		if n, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil {
			out = append(out, n)
		}
	}
	return out
}
