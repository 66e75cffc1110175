// SPDX-License-Identifier: Apache-2.0

package recovery

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/slurm"
)

type source struct {
	j   slurm.ControllerJob
	err error
}

func (s source) Job(context.Context, uint32) (slurm.ControllerJob, error) { return s.j, s.err }

// table has GPUs 0-3; its shard devices 0-3 are on GPUs 0-3 and its mps
// device 0 on GPU 2 (mps only there); mps device 1 is no GPU's.
type table struct{}

func (table) Unknown(g []int) (int, bool) {
	for _, i := range g {
		if i < 0 || i > 3 {
			return i, true
		}
	}
	return 0, false
}

func (table) ShareGPU(kind string, dev int) (int, bool) {
	switch {
	case kind == "shard" && dev >= 0 && dev <= 3:
		return dev, true
	case kind == "mps" && dev == 0:
		return 2, true
	}
	return 0, false
}

// A share job adopted from slurmctld gets the GPU its share is on and no
// other; a share the table cannot place gives the job no GPU, and says so.
func TestAdoptShares(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cj     slurm.ControllerJob
		want   []int
		broken string
	}{
		{"shard", slurm.ControllerJob{Shares: []slurm.Share{{Kind: "shard", Device: 1, Count: 5}}}, []int{1}, ""},
		{"two shards on two GPUs", slurm.ControllerJob{Shares: []slurm.Share{{Kind: "shard", Device: 3, Count: 2}, {Kind: "shard", Device: 0}}}, []int{0, 3}, ""},
		{"mps placed by the table", slurm.ControllerJob{Shares: []slurm.Share{{Kind: "mps", Device: 0, Count: 50}}}, []int{2}, ""},
		{"gpu and shard", slurm.ControllerJob{GPUs: []int{0}, Shares: []slurm.Share{{Kind: "shard", Device: 0, Count: 1}}}, []int{0}, ""},
		{"mps device of no GPU", slurm.ControllerJob{GPUs: []int{0}, Shares: []slurm.Share{{Kind: "mps", Device: 1, Count: 50}}}, []int{}, "holds mps:50 on mps device 1 per slurmctld, which this node's GPU table places on no GPU"},
		{"shard on a node without shards", slurm.ControllerJob{Shares: []slurm.Share{{Kind: "shard", Device: 7}}}, []int{}, "holds shard on shard device 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cj := tc.cj
			cj.ID, cj.UID, cj.State, cj.OnNode, cj.Source = 7, 1000, "RUNNING", true, "test"
			o := (&Recovery{Source: source{j: cj}, Table: table{}, Node: "n1"}).Adopt(7)
			if o.Job == nil {
				t.Fatalf("no job: %s", o.Message)
			}
			if !slices.Equal(o.Job.GPUs, tc.want) || (tc.broken == "") != (o.Job.Broken == "") || !strings.Contains(o.Job.Broken, tc.broken) {
				t.Errorf("GPUs %v broken %q; want %v, broken containing %q (%s)", o.Job.GPUs, o.Job.Broken, tc.want, tc.broken, o.Message)
			}
		})
	}
}

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
