// SPDX-License-Identifier: Apache-2.0

package status

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// TestStatusGPUSets: a step's kernel entry is held to the devices its GPUs
// open by the agent's table, as sets; the same number of minors is not
// enough.
func TestStatusGPUSets(t *testing.T) {
	whole := map[int]policy.Devices{0: {GPUMinor: 0}, 1: {GPUMinor: 1}, 2: {GPUMinor: 2}, 3: {GPUMinor: 3}}
	// Slurm's indices need not follow the minors (slurmd -G orders by PCI).
	swapped := map[int]policy.Devices{0: {GPUMinor: 1}, 1: {GPUMinor: 0}}
	// Two slices of GPU minor 1 and one of minor 0.
	mig := map[int]policy.Devices{
		0: {GPUMinor: 1, CapsMinors: []uint32{147, 148}},
		1: {GPUMinor: 1, CapsMinors: []uint32{156, 157}},
		2: {GPUMinor: 0, CapsMinors: []uint32{12, 13}},
	}
	tests := []struct {
		name    string
		devices map[int]policy.Devices
		devErr  string
		gpus    []int
		kernel  devfilter.Policy
		want    string // "" for no problem, else a part of it
	}{
		{name: "same set", devices: whole, gpus: []int{0, 1}, kernel: devfilter.Policy{GPUMinors: []uint32{0, 1}}},
		{name: "same set, another order", devices: whole, gpus: []int{1, 0}, kernel: devfilter.Policy{GPUMinors: []uint32{1, 0}}},
		{name: "counts match, sets differ", devices: whole, gpus: []int{0, 1}, kernel: devfilter.Policy{GPUMinors: []uint32{0, 2}},
			want: "the kernel grants minors 0,2, the state's GPU(s) 0,1 are minors 0,1"},
		{name: "one GPU, another one", devices: whole, gpus: []int{3}, kernel: devfilter.Policy{GPUMinors: []uint32{2}},
			want: "the kernel grants minors 2, the state's GPU(s) 3 are minors 3"},
		{name: "index is not the minor", devices: swapped, gpus: []int{0}, kernel: devfilter.Policy{GPUMinors: []uint32{1}}},
		{name: "index taken for the minor", devices: swapped, gpus: []int{0}, kernel: devfilter.Policy{GPUMinors: []uint32{0}},
			want: "the kernel grants minors 0, the state's GPU(s) 0 are minors 1"},
		{name: "fewer", devices: whole, gpus: []int{0, 1}, kernel: devfilter.Policy{GPUMinors: []uint32{0}}, want: "the kernel grants minors 0,"},
		{name: "more", devices: whole, gpus: []int{0}, kernel: devfilter.Policy{GPUMinors: []uint32{0, 1}}, want: "the kernel grants minors 0,1,"},
		{name: "no GPU, none granted", devices: whole, gpus: []int{}, kernel: devfilter.Policy{}},
		{name: "no GPU, one granted", devices: whole, gpus: []int{}, kernel: devfilter.Policy{GPUMinors: []uint32{3}}, want: "the kernel grants minors 3"},
		{name: "two slices of one GPU", devices: mig, gpus: []int{0, 1}, kernel: devfilter.Policy{GPUMinors: []uint32{1}, CapsMinors: []uint32{147, 148, 156, 157}}},
		{name: "slices: same counts, another slice", devices: mig, gpus: []int{0, 1}, kernel: devfilter.Policy{GPUMinors: []uint32{0}, CapsMinors: []uint32{12, 13, 147, 148}},
			want: "the kernel grants minors 0, MIG caps 12,13,147,148, the state's GPU(s) 0,1 are minors 1, MIG caps 147,148,156,157"},
		{name: "slices: caps of the other slice", devices: mig, gpus: []int{0}, kernel: devfilter.Policy{GPUMinors: []uint32{1}, CapsMinors: []uint32{156, 157}},
			want: "MIG caps 156,157, the state's GPU(s) 0 are minors 1, MIG caps 147,148"},
		{name: "slices but no GPU minor", devices: mig, gpus: []int{0}, kernel: devfilter.Policy{CapsMinors: []uint32{147, 148}},
			want: "the kernel grants no GPU minor, MIG caps 147,148"},
		{name: "index not in the table", devices: whole, gpus: []int{7}, kernel: devfilter.Policy{GPUMinors: []uint32{7}},
			want: "GPU 7 is not in this node's GPU table"},
		{name: "no table", gpus: []int{0}, kernel: devfilter.Policy{GPUMinors: []uint32{0}},
			want: "cannot tell which devices GPU(s) 0 are (the state file has no GPU table)"},
		{name: "table not resolved", devErr: "gpu 0: /dev/nvidia0 is not a character device", gpus: []int{0}, kernel: devfilter.Policy{GPUMinors: []uint32{0}},
			want: "the GPU table's devices cannot be resolved: gpu 0: /dev/nvidia0 is not a character device"},
		{name: "no table, no GPU", gpus: []int{}, kernel: devfilter.Policy{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := consistentInput(t)
			in.Devices, in.DevicesErr = tt.devices, tt.devErr
			in.State.Jobs = []statefile.Job{{ID: 7, UID: 1001, GPUs: tt.gpus, Steps: []statefile.Step{
				{ID: 0, UID: 1001, CgroupID: 100, Cgroup: scopeDir + "/job_7/step_0", GPUs: tt.gpus}}}}
			in.Kernel.Entries = map[uint64]devfilter.PinnedEntry{100: {CgroupID: 100, Policy: tt.kernel}, 60: in.Kernel.Entries[60]}
			r := Build(in)
			if tt.want == "" {
				if !r.OK {
					t.Fatalf("problems: %q", r.Problems)
				}
				return
			}
			if r.OK || len(r.Problems) != 1 || !strings.HasPrefix(r.Problems[0], "job 7 step 0: cgroup 100: ") || !strings.Contains(r.Problems[0], tt.want) {
				t.Fatalf("problems %q, want one naming job 7 step 0 and %q", r.Problems, tt.want)
			}
			if st := r.Jobs[0].Steps[0]; !slices.Equal(st.Problems, r.Problems) {
				t.Errorf("step problems %q, want %q", st.Problems, r.Problems)
			}
		})
	}
}

func TestSameSet(t *testing.T) {
	for _, tt := range []struct {
		a, b []uint32
		want bool
	}{
		{nil, []uint32{}, true},
		{[]uint32{2, 0}, []uint32{0, 2}, true},
		{[]uint32{0, 0, 1}, []uint32{1, 0}, true},
		{[]uint32{0, 1}, []uint32{0, 2}, false},
		{[]uint32{0}, []uint32{0, 1}, false},
	} {
		a := slices.Clone(tt.a)
		if got := sameSet(tt.a, tt.b); got != tt.want {
			t.Errorf("sameSet(%v, %v) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
		if !slices.Equal(a, tt.a) {
			t.Errorf("sameSet changed its argument: %v, was %v", tt.a, a)
		}
	}
}
