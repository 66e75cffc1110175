// SPDX-License-Identifier: Apache-2.0

package handler

import (
	"fmt"
	"slices"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/gpulist"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// UnknownUID is the owner of an adopted job whose owner slurmctld did not
// say and no task process showed.
const UnknownUID = ^uint32(0)

// RetryUnconfirmed denies each audit-only unconfirmed job adopted longer
// than UnconfirmedMax ago, and asks slurmctld again about each adopted job
// it could not vouch for, when due (agent/recovery paces it): a job it now
// confirms is held to its GPUs, one it says ended is released, one whose
// answer is ambiguous (or slow) is denied every GPU.
func (h *Handler) RetryUnconfirmed() {
	for _, j := range h.Registry.Jobs() {
		h.expireUnconfirmed(j)
	}
	if h.Recovery == nil {
		return
	}
	for _, j := range h.Registry.Jobs() {
		if j.Unconfirmed != "" && h.Recovery.Due(j.ID) {
			h.retryUnconfirmed(j)
		}
	}
}

// expireUnconfirmed denies j when it has been audit-only unconfirmed for
// longer than UnconfirmedMax: an outage of slurmctld, which a user may
// have caused, never leaves a job open to every GPU for long. It reports
// whether it denied j.
func (h *Handler) expireUnconfirmed(j registry.Job) bool {
	if j.Unconfirmed != registry.UnconfirmedAuditOnly || h.UnconfirmedMax <= 0 || time.Since(j.Created) < h.UnconfirmedMax {
		return false
	}
	why := fmt.Sprintf("job %d, adopted unconfirmed (audit-only) %s ago, was not confirmed by slurmctld within adopt_unconfirmed_max (%s); it now gets no GPU until slurmctld confirms it", j.ID, time.Since(j.Created).Round(time.Second), h.UnconfirmedMax)
	return h.denyUnconfirmed(j, why, nil)
}

// denyUnconfirmed turns unconfirmed job j to deny: no GPU for its steps
// until slurmctld confirms it.
func (h *Handler) denyUnconfirmed(j registry.Job, why string, err error) bool {
	steps, ok := h.Registry.Deny(j.ID, why)
	if !ok {
		return false
	}
	for _, s := range steps {
		if err := h.Enforcer.Set(s.Cgroup, devfilter.Policy{}); err != nil {
			h.Log.Error("unconfirmed job: deny a step", "job_id", j.ID, "cgroup", s.Cgroup.Path, "err", err)
		}
	}
	h.Log.Error(why, "job_id", j.ID)
	fill := h.jobFields(j, err)
	h.emit(audit.EventJobAdopted, audit.SeverityError, why, func(r *audit.Record) {
		fill(r)
		r.GPUs, r.Reason, r.PolicyMode = []int{}, why, audit.ModeEnforce
	})
	return true
}

// jobFields fills a record's job, user and cgroup from j, and its error
// from err when there is one.
func (h *Handler) jobFields(j registry.Job, err error) func(*audit.Record) {
	return func(r *audit.Record) {
		r.JobID, r.UID, r.User, r.Cgroup = j.ID, audit.UID(j.UID), h.Users.Name(j.UID), j.Dir
		if err != nil {
			r.Error = err.Error()
		}
	}
}

func (h *Handler) retryUnconfirmed(j registry.Job) {
	o := h.Recovery.Adopt(j.ID)
	fill := h.jobFields(j, o.Err)
	switch {
	case o.Unreachable:
		h.Log.Debug("unconfirmed job: slurmctld still cannot be asked", "job_id", j.ID, "err", o.Err)
	case o.Job != nil:
		nj := *o.Job
		nj.Dir, nj.Adopted = j.Dir, "confirmed by slurmctld after the agent started ("+nj.Recovered+")"
		if nj.Broken == "" {
			if _, err := h.Table.Devices(nj.GPUs); err != nil {
				nj.Broken, nj.GPUs = fmt.Sprintf("job %d: %v", j.ID, err), []int{}
			}
		}
		steps, ok := h.Registry.Confirm(nj)
		if !ok {
			return
		}
		h.Recovery.Forget(j.ID)
		for _, s := range steps {
			var p devfilter.Policy // Broken: no GPU
			if nj.Broken == "" {
				if set, err := h.Table.Devices(s.GPUs); err == nil {
					p = devfilter.Policy{GPUMinors: set.GPUMinors, CapsMinors: set.CapsMinors, IMEXChannels: s.IMEXChannels}
				}
			}
			if err := h.Enforcer.Set(s.Cgroup, p); err != nil {
				h.Log.Error("confirmed job: set a step's entry", "job_id", j.ID, "cgroup", s.Cgroup.Path, "err", err)
			}
		}
		msg := fmt.Sprintf("job %d, adopted unconfirmed (%s), is now confirmed by slurmctld: GPUs [%s] (%s); its %d steps are held to them", j.ID, j.Unconfirmed, gpulist.Format(nj.GPUs), nj.Recovered, len(steps))
		sev := audit.SeverityInfo
		if nj.Broken != "" {
			msg, sev = fmt.Sprintf("job %d, adopted unconfirmed, is now answered by slurmctld but its list cannot be used (%s); its steps get no GPU", j.ID, nj.Broken), audit.SeverityError
		}
		h.Log.Info(msg, "job_id", j.ID)
		h.emit(audit.EventJobAdopted, sev, msg, func(r *audit.Record) {
			fill(r)
			r.GPUs, r.Reason, r.PolicyMode = slices.Clone(nj.GPUs), nj.Adopted, h.Mode.String()
		})
	case o.Ambiguous:
		if j.Unconfirmed == registry.UnconfirmedDeny {
			// Denied already; asked again at the next pass.
			h.Log.Debug("unconfirmed job: slurmctld's answer still cannot be used", "job_id", j.ID, "err", o.Err)
			return
		}
		h.denyUnconfirmed(j, o.Message+"; the job, adopted unconfirmed, now gets no GPU", o.Err)
	default:
		// Unknown to slurmctld, or not running here: it ended.
		h.JobEnded(j.ID, o.Message)
	}
}
