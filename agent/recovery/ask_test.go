// SPDX-License-Identifier: Apache-2.0

package recovery

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/slurm"
)

// badTable knows GPUs 0..3 only.
type badTable struct{}

func (badTable) Unknown(gpus []int) (int, bool) {
	for _, g := range gpus {
		if g > 3 {
			return g, true
		}
	}
	return 0, false
}

func (badTable) ShareGPU(string, int) (int, bool) { return 0, false }

// A step's job is recovered only when slurmctld says it runs here, as the
// step's own uid; a GPU the table lacks makes the record broken (no GPU),
// never a guess. Each refusal names why.
func TestAsk(t *testing.T) {
	running := slurm.ControllerJob{ID: 7, UID: 1000, State: "RUNNING", OnNode: true, GPUs: []int{1, 2}, Source: "squeue --json"}
	elsewhere := running
	elsewhere.OnNode = false
	pending := running
	pending.State = "PENDING"
	unknownGPU := running
	unknownGPU.GPUs = []int{1, 9}
	for _, tc := range []struct {
		name    string
		src     source
		uid     uint32
		gpus    []int // nil: no record
		broken  bool
		sev     audit.Severity
		message string
	}{
		{"recovered", source{j: running}, 1000, []int{1, 2}, false, audit.SeverityWarning, "recovered from slurmctld (squeue --json)"},
		{"another owner", source{j: running}, 1001, nil, false, audit.SeverityError, "belongs to uid 1000, its step runs as uid 1001"},
		{"not on this node", source{j: elsewhere}, 1000, nil, false, audit.SeverityWarning, "not running on n1"},
		{"not running", source{j: pending}, 1000, nil, false, audit.SeverityWarning, "PENDING"},
		{"unknown job", source{err: slurm.ErrJobUnknown}, 1000, nil, false, audit.SeverityWarning, "does not know it"},
		{"forged answer", source{err: &slurm.AmbiguousError{Reason: "two lines for one job"}}, 1000, nil, false, audit.SeverityError, "two lines for one job"},
		{"unknown GPU", source{j: unknownGPU}, 1000, []int{}, true, audit.SeverityWarning, "recovered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Recovery{Source: tc.src, Table: badTable{}, Node: "n1"}
			o := r.Ask(7, tc.uid)
			if (o.Job != nil) != (tc.gpus != nil) {
				t.Fatalf("job %+v, want a record: %v (%s)", o.Job, tc.gpus != nil, o.Message)
			}
			if o.Job != nil {
				if !reflect.DeepEqual(o.Job.GPUs, tc.gpus) || (o.Job.Broken != "") != tc.broken || o.Job.UID != 1000 || o.Job.Recovered != "squeue --json" {
					t.Errorf("record %+v, want GPUs %v broken %v", o.Job, tc.gpus, tc.broken)
				}
			}
			if o.Severity != tc.sev || !strings.Contains(o.Message, tc.message) {
				t.Errorf("severity %q message %q, want %q containing %q", o.Severity, o.Message, tc.sev, tc.message)
			}
		})
	}
}

// An adopted job's owner is slurmctld's: no uid to match.
func TestAdoptTakesSlurmctldsOwner(t *testing.T) {
	r := &Recovery{Source: source{j: slurm.ControllerJob{ID: 7, UID: 4242, State: "RUNNING", OnNode: true, GPUs: []int{0}, Source: "s"}}, Table: badTable{}, Node: "n1"}
	o := r.Adopt(7)
	if o.Job == nil || o.Job.UID != 4242 || !strings.Contains(o.Message, "confirmed its GPU list [0]") {
		t.Fatalf("Adopt: %+v %q", o.Job, o.Message)
	}
}

// Ended: only slurmctld's word that the job is gone or not running ends
// it; an error keeps the job.
func TestEnded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		src   source
		ended bool
		why   string
		err   bool
	}{
		{"unknown", source{err: slurm.ErrJobUnknown}, true, "no longer knows", false},
		{"unreachable", source{err: &slurm.UnreachableError{Msg: "down"}}, false, "", true},
		{"completed here", source{j: slurm.ControllerJob{State: "COMPLETED", OnNode: true}}, true, "COMPLETED on this node", false},
		{"requeued", source{j: slurm.ControllerJob{State: "PENDING"}}, true, "PENDING on other nodes", false},
		{"running", source{j: slurm.ControllerJob{State: "RUNNING", OnNode: true}}, false, "still runs here", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Recovery{Source: tc.src, Table: badTable{}, Node: "n1"}
			ended, why, err := r.Ended(7)
			if ended != tc.ended || (err != nil) != tc.err || !strings.Contains(why, tc.why) {
				t.Errorf("Ended = %v %q %v, want %v %q error %v", ended, why, err, tc.ended, tc.why, tc.err)
			}
		})
	}
}

// Due paces questions: once per Retry per job, again at once after Forget.
func TestDuePacing(t *testing.T) {
	r := &Recovery{}
	if !r.Due(1) || r.Due(1) {
		t.Fatal("the second question within Retry is due")
	}
	if !r.Due(2) {
		t.Error("another job is paced by the first")
	}
	r.Forget(1)
	if !r.Due(1) {
		t.Error("not due after Forget")
	}
	r.mu.Lock()
	r.asked[1] = time.Now().Add(-Retry - time.Second)
	r.mu.Unlock()
	if !r.Due(1) {
		t.Error("not due after Retry passed")
	}
}
