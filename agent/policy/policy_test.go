package policy

import (
	"slices"
	"strings"
	"testing"
)

func TestParseGPUList(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{"", []int{}, false},
		{"0", []int{0}, false},
		{"2,0,2", []int{0, 2}, false},
		{"0-2,5", []int{0, 1, 2, 5}, false},
		{" 1 , 3 ", []int{1, 3}, false},
		{"x", nil, true},
		{"-1", nil, true},
		{"3-1", nil, true},
		{"0,,1", nil, true},
		{"99999", nil, true},
	}
	for _, tt := range tests {
		got, err := ParseGPUList(tt.in)
		if (err != nil) != tt.wantErr || (!tt.wantErr && !slices.Equal(got, tt.want)) {
			t.Errorf("ParseGPUList(%q) = %v, %v; want %v, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

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
