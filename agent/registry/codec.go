// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"errors"
	"fmt"
	"time"

	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/agent/store"
)

// The records as the store and the state file hold them: both written
// (putJobLocked, putStepLocked, State) and read back (Reload) here.

func storeFlags(j Job) uint32 {
	var f uint32
	if j.Recovered != "" {
		f |= store.FlagRecovered
	}
	if j.Broken != "" {
		f |= store.FlagBroken
	}
	if j.NoProlog {
		f |= store.FlagNoProlog
	}
	switch j.Unconfirmed {
	case UnconfirmedAuditOnly:
		f |= store.FlagUnconfirmedAuditOnly
	case UnconfirmedDeny:
		f |= store.FlagUnconfirmedDeny
	}
	return f
}

// StepFlags are s's flags in the store.
func StepFlags(s Step) uint32 {
	var f uint32
	if s.AuditOnly {
		f |= store.StepFlagAuditOnly
	}
	if s.Adopted {
		f |= store.StepFlagAdopted
	}
	// Checked before a step gets a channel (SetIMEX); never more than one.
	imex, _ := store.IMEXFlags(s.IMEXChannels)
	return f | imex
}

// jobFromStore is a job record as the store holds it. What the store keeps
// as a flag alone (why a list is broken, unconfirmed) reads back as said
// before the agent restarted.
func jobFromStore(j store.Job) Job {
	rj := Job{ID: j.ID, UID: j.UID, GPUs: j.GPUs, NoProlog: j.Flags&store.FlagNoProlog != 0,
		Created: time.Unix(0, j.CreatedUnixNano)}
	if j.Flags&store.FlagBroken != 0 {
		rj.Broken = fmt.Sprintf("job %d's GPU list was found unusable before the agent restarted; its GPU steps are refused", j.ID)
	}
	if j.Flags&store.FlagRecovered != 0 {
		rj.Recovered = "slurmctld, before the agent restarted"
	}
	switch {
	case j.Flags&store.FlagUnconfirmedAuditOnly != 0:
		rj.Unconfirmed, rj.Adopted = UnconfirmedAuditOnly, "not confirmed by slurmctld before the agent restarted"
	case j.Flags&store.FlagUnconfirmedDeny != 0:
		rj.Unconfirmed, rj.Adopted = UnconfirmedDeny, "not confirmed by slurmctld before the agent restarted"
	}
	return rj
}

func stepFromStore(s store.Step) Step {
	return Step{JobID: s.JobID, StepID: s.StepID, UID: s.UID, GPUs: s.GPUs,
		Cgroup:    cgroup.Cgroup{ID: s.CgroupID, Path: s.Cgroup},
		AuditOnly: s.Flags&store.StepFlagAuditOnly != 0, Adopted: s.Flags&store.StepFlagAdopted != 0,
		IMEXChannels: store.IMEXChannels(s.Flags)}
}

// unconfirmed is a state file's unconfirmed mode; anything but audit-only
// (a damaged or hand-edited file) reads as deny.
func unconfirmed(s string) string {
	switch s {
	case "":
		return ""
	case UnconfirmedAuditOnly:
		return s
	}
	return UnconfirmedDeny
}

// Reload takes back what an earlier agent recorded: the store's records
// when it has some (fromStore: the store is not new), which survive any
// crash; else the state file at stateFile ("" = none), whose records are
// then written into the store. It returns the steps restored and where the
// records came from ("" when nothing was read). An unreadable source is
// logged and restores nothing from it: running jobs are then recovered
// from slurmctld.
func (r *Registry) Reload(fromStore bool, stateFile string) (steps []Step, from string) {
	var jobs []Job
	if r.store != nil && fromStore {
		sj, err1 := r.store.Jobs()
		ss, err2 := r.store.Steps()
		if err := errors.Join(err1, err2); err != nil {
			r.log.Error("read the pinned store; running jobs are recovered from slurmctld", "err", err)
		}
		for _, j := range sj {
			jobs = append(jobs, jobFromStore(j))
		}
		for _, s := range ss {
			steps = append(steps, stepFromStore(s))
		}
		r.Restore(jobs, steps)
		return steps, "the pinned store"
	}
	saved, _, err := statefile.Read(stateFile)
	if err != nil {
		r.log.Error("saved agent state unreadable; running jobs are recovered from slurmctld", "err", err)
	}
	if saved == nil {
		return nil, ""
	}
	for _, sj := range saved.Jobs {
		jobs = append(jobs, Job{ID: sj.ID, UID: sj.UID, GPUs: sj.GPUs, Broken: sj.Broken, NoProlog: sj.NoProlog,
			Recovered: sj.Recovered, Adopted: sj.Adopted, Unconfirmed: unconfirmed(sj.Unconfirmed), Dir: sj.Dir, Created: sj.Created})
		for _, ss := range sj.Steps {
			steps = append(steps, Step{JobID: sj.ID, StepID: ss.ID, UID: ss.UID, GPUs: ss.GPUs,
				Cgroup: cgroup.Cgroup{ID: ss.CgroupID, Path: ss.Cgroup}, AuditOnly: ss.AuditOnly, Adopted: ss.Adopted})
		}
	}
	r.Restore(jobs, steps)
	if r.store != nil && len(jobs) > 0 {
		// From an older agent's state file: into the store from now on.
		r.WriteAll()
	}
	return steps, "the state file " + stateFile
}

// State is the records as the state file holds them.
func (r *Registry) State() []statefile.Job {
	byJob := map[uint32][]statefile.Step{}
	for _, s := range r.Steps() {
		byJob[s.JobID] = append(byJob[s.JobID], statefile.Step{ID: s.StepID, UID: s.UID, CgroupID: s.Cgroup.ID, Cgroup: s.Cgroup.Path, GPUs: s.GPUs,
			AuditOnly: s.AuditOnly, Adopted: s.Adopted})
	}
	out := []statefile.Job{}
	for _, j := range r.Jobs() {
		out = append(out, statefile.Job{ID: j.ID, UID: j.UID, GPUs: j.GPUs, Broken: j.Broken, NoProlog: j.NoProlog,
			Recovered: j.Recovered, Adopted: j.Adopted, Unconfirmed: j.Unconfirmed, Dir: j.Dir, Created: j.Created, Steps: byJob[j.ID]})
	}
	return out
}
