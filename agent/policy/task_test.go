// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"slices"
	"strings"
	"testing"
)

// A task's binding narrows within its step and never widens: whatever the
// task's CUDA_VISIBLE_DEVICES says (the user sets the srun environment),
// the result is a subset of the step's list.
func TestForTask(t *testing.T) {
	s := func(v string) *string { return &v }
	tests := []struct {
		name     string
		step     []int
		visible  *string
		want     []int
		wantNote string
	}{
		{"one of two (gpus-per-task, single:1, map_gpu)", []int{0, 1}, s("1"), []int{1}, ""},
		{"the whole step (no binding, none)", []int{1, 3}, s("1,3"), []int{1, 3}, ""},
		{"empty binding opens nothing", []int{0, 1}, s(""), []int{}, ""},
		{"unset keeps the step", []int{0, 1}, nil, []int{0, 1}, "unset"},
		{"forged wider list is cut to the step", []int{2}, s("0,1,2,3"), []int{2}, "[0,1,3]"},
		{"forged list outside the step opens nothing", []int{2}, s("0,1"), []int{}, "[0,1]"},
		{"UUIDs keep the step", []int{0, 1}, s("GPU-8a1b,GPU-77"), []int{0, 1}, "not a GPU index list"},
		{"a range is not a list", []int{0, 1, 2}, s("0-1"), []int{0, 1, 2}, "not a GPU index list"},
		{"unsorted is not a list", []int{0, 1}, s("1,0"), []int{0, 1}, "not a GPU index list"},
		{"a step without GPUs gives none", []int{}, s("0"), []int{}, "[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, note := ForTask(tt.step, tt.visible)
			if !slices.Equal(got, tt.want) || got == nil {
				t.Errorf("ForTask(%v, %v) = %v; want %v", tt.step, tt.visible, got, tt.want)
			}
			for _, g := range got {
				if !slices.Contains(tt.step, g) {
					t.Errorf("GPU %d is outside the step %v", g, tt.step)
				}
			}
			if (tt.wantNote == "") != (note == "") || !strings.Contains(note, tt.wantNote) {
				t.Errorf("note %q; want one with %q", note, tt.wantNote)
			}
		})
	}
}
