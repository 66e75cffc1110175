// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"slices"
	"strings"
	"testing"
)

func ptr(s string) *string { return &s }

func TestForStep(t *testing.T) {
	job := &Job{ID: 7, UID: 1000, GPUs: []int{1, 3}}
	cpuJob := &Job{ID: 8, UID: 1000, GPUs: []int{}}
	tests := []struct {
		name     string
		job      *Job
		step     uint32
		stepGPUs *string
		want     []int
		note     string
		wantErr  string
	}{
		{name: "step gets its own", job: job, step: 0, stepGPUs: ptr("3"), want: []int{3}},
		{name: "step gets both", job: job, step: 1, stepGPUs: ptr("1,3"), want: []int{1, 3}},
		{name: "step cannot widen", job: job, step: 0, stepGPUs: ptr("0,1,2,3"), want: []int{1, 3}, note: "outside"},
		{name: "cpu-only step in gpu job", job: job, step: 2, stepGPUs: nil, want: []int{}},
		{name: "batch gets the job's, forged step gpus ignored", job: job, step: BatchStep, stepGPUs: ptr("0,1,2,3"), want: []int{1, 3}},
		{name: "extern gets the job's", job: job, step: ExternStep, want: []int{1, 3}},
		{name: "interactive gets the job's", job: job, step: InteractiveStep, want: []int{1, 3}},
		{name: "cpu job gets none", job: cpuJob, step: 0, stepGPUs: ptr("0"), want: []int{}, note: "outside"},
		{name: "cpu job batch", job: cpuJob, step: BatchStep, want: []int{}},
		{name: "no prolog, cpu step", job: nil, step: 0, want: []int{}, note: "no prolog"},
		{name: "no prolog, batch", job: nil, step: BatchStep, stepGPUs: ptr("0"), want: []int{}, note: "no prolog"},
		{name: "no prolog, gpu step refused", job: nil, step: 0, stepGPUs: ptr("0"), wantErr: "no trusted GPU list"},
		{name: "junk request", job: job, step: 0, stepGPUs: ptr("1,x"), wantErr: "SLURM_STEP_GPUS of step 7.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := ForStep(tt.job, 7, tt.step, tt.stepGPUs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(d.GPUs, tt.want) {
				t.Errorf("GPUs = %v, want %v", d.GPUs, tt.want)
			}
			if (tt.note == "") != (d.Note == "") || !strings.Contains(d.Note, tt.note) {
				t.Errorf("Note = %q, want containing %q", d.Note, tt.note)
			}
		})
	}
}

func TestStepName(t *testing.T) {
	for step, want := range map[uint32]string{0: "0", 12: "12", BatchStep: "batch", ExternStep: "extern", InteractiveStep: "interactive"} {
		if got := StepName(step); got != want {
			t.Errorf("StepName(%d) = %q, want %q", step, got, want)
		}
	}
}

// migTable is a node with one whole GPU (index 0, /dev/nvidia0) and GPU 1
// split: indices 1 and 2 are 1g slices (GPU instances with access minors 147
// and 156, compute instances 148 and 157), 3 and 4 are the two compute
// instances of one 2g GPU instance (access minor 165, compute 166 and 167).
var migTable = map[int]Devices{
	0: {GPUMinor: 0},
	1: {GPUMinor: 1, CapsMinors: []uint32{147, 148}},
	2: {GPUMinor: 1, CapsMinors: []uint32{156, 157}},
	3: {GPUMinor: 1, CapsMinors: []uint32{165, 166}},
	4: {GPUMinor: 1, CapsMinors: []uint32{165, 167}},
}

func TestMIGStepDevices(t *testing.T) {
	s := func(v string) *string { return &v }
	tests := []struct {
		name      string
		jobGPUs   []int
		step      uint32
		stepGPUs  *string
		wantGPUs  []uint32
		wantCaps  []uint32
		wantError string
	}{
		{name: "whole GPU: unchanged, no caps", jobGPUs: []int{0}, step: BatchStep, wantGPUs: []uint32{0}, wantCaps: []uint32{}},
		{name: "one slice: its parent and exactly its caps", jobGPUs: []int{2}, step: BatchStep, wantGPUs: []uint32{1}, wantCaps: []uint32{156, 157}},
		{name: "two slices of one GPU: the parent once, both caps", jobGPUs: []int{1, 2}, step: BatchStep, wantGPUs: []uint32{1}, wantCaps: []uint32{147, 148, 156, 157}},
		{name: "step narrows to one slice of the job's two", jobGPUs: []int{1, 2}, step: 0, stepGPUs: s("2"), wantGPUs: []uint32{1}, wantCaps: []uint32{156, 157}},
		{name: "forged step list cannot reach another job's slice", jobGPUs: []int{2}, step: 0, stepGPUs: s("1,2,3"), wantGPUs: []uint32{1}, wantCaps: []uint32{156, 157}},
		{name: "compute instances sharing a GPU instance", jobGPUs: []int{3}, step: ExternStep, wantGPUs: []uint32{1}, wantCaps: []uint32{165, 166}},
		{name: "both compute instances of one GPU instance", jobGPUs: []int{3, 4}, step: BatchStep, wantGPUs: []uint32{1}, wantCaps: []uint32{165, 166, 167}},
		{name: "whole GPU and a slice", jobGPUs: []int{0, 1}, step: BatchStep, wantGPUs: []uint32{0, 1}, wantCaps: []uint32{147, 148}},
		{name: "step without SLURM_STEP_GPUS: nothing", jobGPUs: []int{1}, step: 0, wantGPUs: []uint32{}, wantCaps: []uint32{}},
		{name: "CPU-only job: nothing", jobGPUs: []int{}, step: BatchStep, wantGPUs: []uint32{}, wantCaps: []uint32{}},
		{name: "index outside the table", jobGPUs: []int{7}, step: BatchStep, wantError: "GPU 7 is not in this node's GPU table"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dec, err := ForStep(&Job{ID: 1, UID: 1000, GPUs: tt.jobGPUs}, 1, tt.step, tt.stepGPUs)
			if err != nil {
				t.Fatal(err)
			}
			set, err := DevicesFor(migTable, dec.GPUs)
			if tt.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantError) {
					t.Fatalf("DevicesFor(%v) error = %v, want %q", dec.GPUs, err, tt.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(set.GPUMinors, tt.wantGPUs) || !slices.Equal(set.CapsMinors, tt.wantCaps) {
				t.Errorf("GPUs %v give %+v, want GPU minors %v, caps %v", dec.GPUs, set, tt.wantGPUs, tt.wantCaps)
			}
		})
	}
}

func TestDevicesForDoesNotAlias(t *testing.T) {
	set, err := DevicesFor(migTable, []int{1})
	if err != nil {
		t.Fatal(err)
	}
	set.CapsMinors[0] = 9
	if migTable[1].CapsMinors[0] != 147 {
		t.Fatal("DevicesFor's result shares memory with the table")
	}
}
