// SPDX-License-Identifier: Apache-2.0

// Package recovery asks slurmctld what the agent's own records cannot say:
// the GPUs of a job whose prolog record is missing (agent down at job
// start, state lost), and whether a job whose epilog never came has ended.
// It reads only output no job user can steer (agent/slurm.Controller), and
// paces its questions so a job's burst of steps is not a burst of RPCs.
package recovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/slurm"
)

// JobSource is slurmctld; *slurm.Controller implements it.
type JobSource interface {
	Job(ctx context.Context, id uint32) (slurm.ControllerJob, error)
}

// Table is the node's GPU table, as recovery checks a list against it
// and places a job's shard and mps devices on GPUs.
type Table interface {
	Unknown(gpus []int) (int, bool)
	ShareGPU(kind string, dev int) (int, bool)
}

// Retry is how soon slurmctld is asked again about a job it could not vouch
// for.
const Retry = 5 * time.Second

// Timeout bounds one question. A step of a job the agent holds no record
// of waits for the answer, so it stays well inside one try of the plugin's
// default timeout=5 (slurmctld answers in tens of milliseconds when well):
// a slow slurmctld costs that step a refusal, never the step's whole
// budget of 1.5 × timeout.
const Timeout = 3 * time.Second

// Recovery asks slurmctld. Its methods are safe for concurrent use.
type Recovery struct {
	Source JobSource
	Table  Table
	Node   string

	mu    sync.Mutex
	asked map[uint32]time.Time
}

// Due reports whether slurmctld should be asked for job id's GPUs now: not
// in the last Retry. It marks the job asked.
func (r *Recovery) Due(id uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.asked == nil {
		r.asked = map[uint32]time.Time{}
	}
	if t, ok := r.asked[id]; ok && time.Since(t) < Retry {
		return false
	}
	r.asked[id] = time.Now()
	return true
}

// Forget drops the pacing of job id (recovered, or its epilog came).
func (r *Recovery) Forget(id uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.asked, id)
}

// Outcome is what recovering a job came to.
type Outcome struct {
	// Job is the record to keep; nil when slurmctld could not vouch for
	// the job: its steps get no GPU.
	Job *registry.Job
	// Message and Severity are for the audit record either way; Err is
	// slurmctld's error, if any.
	Message  string
	Severity audit.Severity
	Err      error
	// Unreachable: the client could not connect to slurmctld (down, not
	// listening), as opposed to an answer that refuses the job (unknown,
	// ended, ambiguous, another owner). Only this is an outage; the rest
	// say no. A slow answer is not an outage: any user can make slurmctld
	// slow (issue 18: a flood of held jobs with long names).
	Unreachable bool
	// Ambiguous: slurmctld's answer cannot be trusted (lines a job field
	// can fake, malformed, over the size cap, or not complete in time).
	Ambiguous bool
}

// Ask asks slurmctld for the GPUs job id holds on this node. uid is the
// step's; slurmctld must name the same owner.
func (r *Recovery) Ask(id, uid uint32) Outcome { return r.ask(id, &uid, "has no prolog record") }

// Adopt asks slurmctld for the GPUs of job id, found running with no
// record when the agent started; the owner is slurmctld's.
func (r *Recovery) Adopt(id uint32) Outcome {
	return r.ask(id, nil, "was running with no record when the agent started")
}

func (r *Recovery) ask(id uint32, wantUID *uint32, what string) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	cj, err := r.Source.Job(ctx, id)
	var amb *slurm.AmbiguousError
	var unreach *slurm.UnreachableError
	o := Outcome{Severity: audit.SeverityWarning, Err: err}
	switch {
	case errors.Is(err, slurm.ErrJobUnknown):
		o.Message = fmt.Sprintf("job %d %s and slurmctld does not know it; its steps get no GPU", id, what)
	case errors.As(err, &unreach):
		o.Message, o.Unreachable = fmt.Sprintf("job %d %s and slurmctld could not be asked (%v); its steps get no GPU", id, what, err), true
	case errors.As(err, &amb):
		o.Ambiguous = true
		o.Message, o.Severity = fmt.Sprintf("job %d %s and slurmctld's answer about it is ambiguous (%s), which a job user can cause (fields that imitate Slurm's output, a flood that makes slurmctld slow); its steps get no GPU", id, what, amb.Reason), audit.SeverityError
	case err != nil:
		// Not a connect failure: an answer that cannot be used.
		o.Ambiguous = true
		o.Message, o.Severity = fmt.Sprintf("job %d %s and slurmctld's answer about it cannot be used (%v); its steps get no GPU", id, what, err), audit.SeverityError
	case !cj.Running():
		o.Message = fmt.Sprintf("job %d %s and slurmctld says it is %s, not running on %s; its steps get no GPU", id, what, cj.State, r.Node)
	case wantUID != nil && cj.UID != *wantUID:
		o.Message, o.Severity = fmt.Sprintf("job %d %s; slurmctld says it belongs to uid %d, its step runs as uid %d; its steps get no GPU", id, what, cj.UID, *wantUID), audit.SeverityError
	}
	if o.Message != "" {
		return o
	}
	uid := cj.UID
	gpus, broken := r.place(id, cj)
	j := &registry.Job{ID: id, UID: uid, GPUs: gpus, Recovered: cj.Source, Created: time.Now()}
	if broken == "" {
		if g, bad := r.Table.Unknown(gpus); bad {
			broken = fmt.Sprintf("job %d holds GPU %d per slurmctld, which is not in this node's GPU table (gres.conf); refusing to guess which device it is", id, g)
		}
	}
	if broken != "" {
		j.Broken = broken
		j.GPUs = []int{}
	}
	o.Job = j
	o.Message = fmt.Sprintf("job %d had no prolog record; its trusted GPU list [%s] was recovered from slurmctld (%s)", id, formatList(gpus), cj.Source)
	if wantUID == nil {
		o.Message = fmt.Sprintf("job %d %s; slurmctld confirmed its GPU list [%s] (%s)", id, what, formatList(gpus), cj.Source)
	}
	if len(cj.Shares) > 0 {
		o.Message += "; " + formatShares(cj.Shares)
	}
	return o
}

// place is the GPUs a job holds per slurmctld: those it holds whole and
// those its shard and mps shares are on, ascending. A share the table
// cannot place on a GPU makes the job broken (no GPU), named in why.
func (r *Recovery) place(id uint32, cj slurm.ControllerJob) (gpus []int, why string) {
	gpus = append([]int{}, cj.GPUs...)
	for _, s := range cj.Shares {
		g, ok := r.Table.ShareGPU(s.Kind, s.Device)
		if !ok {
			return []int{}, fmt.Sprintf("job %d holds %s on %s device %d per slurmctld, which this node's GPU table places on no GPU (slurmd -G, gres.conf); refusing to guess which GPU it is", id, shareText(s), s.Kind, s.Device)
		}
		if !slices.Contains(gpus, g) {
			gpus = append(gpus, g)
		}
	}
	slices.Sort(gpus)
	return gpus, ""
}

func shareText(s slurm.Share) string {
	if s.Count == 0 {
		return s.Kind
	}
	return fmt.Sprintf("%s:%d", s.Kind, s.Count)
}

func formatShares(shares []slurm.Share) string {
	parts := make([]string, len(shares))
	for i, s := range shares {
		parts[i] = fmt.Sprintf("%s on %s device %d", shareText(s), s.Kind, s.Device)
	}
	return "shared GRES " + strings.Join(parts, ", ")
}

// Ended asks whether job id's allocation on this node is over: slurmctld no
// longer knows the job, or says it finished or went back to the queue.
// An error means slurmctld could not say; the job is then kept.
func (r *Recovery) Ended(id uint32) (ended bool, why string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	cj, err := r.Source.Job(ctx, id)
	switch {
	case errors.Is(err, slurm.ErrJobUnknown):
		return true, "slurmctld no longer knows it", nil
	case err != nil:
		return false, "", err
	case !cj.Running():
		where := "other nodes"
		if cj.OnNode {
			where = "this node"
		}
		return true, fmt.Sprintf("slurmctld says it is %s on %s", cj.State, where), nil
	}
	return false, "slurmctld says it still runs here (" + cj.State + ")", nil
}

func formatList(gpus []int) string {
	s := ""
	for i, g := range gpus {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprint(g)
	}
	return s
}
