// SPDX-License-Identifier: Apache-2.0

package recovery

import (
	"context"
	"errors"
	"testing"

	"github.com/gpufence/gpufence/agent/slurm"
)

type source struct {
	j   slurm.ControllerJob
	err error
}

func (s source) Job(context.Context, uint32) (slurm.ControllerJob, error) { return s.j, s.err }

type table struct{}

func (table) Unknown([]int) (int, bool) { return 0, false }

// Only the client's connect failure is an outage (adopt_unconfirmed
// applies); a slow, oversize, malformed or odd answer refuses the job, as
// an ambiguous one does: a user can cause each of them.
func TestAdoptClassifiesErrors(t *testing.T) {
	running := slurm.ControllerJob{ID: 7, UID: 1000, State: "RUNNING", OnNode: true, GPUs: []int{1}, Source: "test"}
	for _, tc := range []struct {
		name                   string
		src                    source
		unreachable, ambiguous bool
		confirmed              bool
	}{
		{"connect failure", source{err: &slurm.UnreachableError{Msg: "connect failure"}}, true, false, false},
		{"no answer in time", source{err: &slurm.AmbiguousError{Reason: "squeue --json gave no complete answer in 1.8s"}}, false, true, false},
		{"over the cap", source{err: &slurm.AmbiguousError{Reason: "squeue --json printed more than 67108864 bytes"}}, false, true, false},
		{"another error", source{err: errors.New("scontrol: exit status 1: Socket timed out on send/recv operation")}, false, true, false},
		{"unknown", source{err: slurm.ErrJobUnknown}, false, false, false},
		{"confirmed", source{j: running}, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Recovery{Source: tc.src, Table: table{}, Node: "n1"}
			o := r.Adopt(7)
			if o.Unreachable != tc.unreachable || o.Ambiguous != tc.ambiguous || (o.Job != nil) != tc.confirmed {
				t.Errorf("got unreachable %v ambiguous %v job %+v (%s); want %v %v confirmed %v", o.Unreachable, o.Ambiguous, o.Job, o.Message, tc.unreachable, tc.ambiguous, tc.confirmed)
			}
		})
	}
}
