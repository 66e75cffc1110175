// SPDX-License-Identifier: Apache-2.0

package main

import (
	"testing"

	"github.com/gpufence/gpufence/bpf/devfilter"
)

func TestGPUCountMismatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    devfilter.Policy
		n    int
		want bool
	}{
		{"whole GPUs agree", devfilter.Policy{GPUMinors: []uint32{0, 1}}, 2, false},
		{"whole GPU missing", devfilter.Policy{GPUMinors: []uint32{0}}, 2, true},
		{"no GPU", devfilter.Policy{}, 0, false},
		{"two slices of one GPU", devfilter.Policy{GPUMinors: []uint32{1}, CapsMinors: []uint32{147, 148, 156, 157}}, 2, false},
		{"slices but no GPU minor", devfilter.Policy{CapsMinors: []uint32{147}}, 1, true},
		{"more GPU minors than indices", devfilter.Policy{GPUMinors: []uint32{0, 1}, CapsMinors: []uint32{147}}, 1, true},
	} {
		if got := gpuCountMismatch(tc.p, tc.n); got != tc.want {
			t.Errorf("%s: gpuCountMismatch = %v, want %v", tc.name, got, tc.want)
		}
	}
}
