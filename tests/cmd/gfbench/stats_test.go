// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"testing"
)

func TestQuantile(t *testing.T) {
	tests := []struct {
		name string
		ms   []float64
		q    float64
		want float64
	}{
		{"empty", nil, 0.5, math.NaN()},
		{"one", []float64{7}, 0.9, 7},
		{"odd median", []float64{3, 1, 2}, 0.5, 2},
		{"even median is mean of middle two", []float64{4, 1, 3, 2}, 0.5, 2.5},
		{"p90 interpolates", []float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110}, 0.9, 100},
		{"p90 of 5", []float64{1, 2, 3, 4, 5}, 0.9, 4.6},
		{"max", []float64{5, 9, 1}, 1, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := quantile(tt.ms, tt.q)
			if math.IsNaN(tt.want) != math.IsNaN(got) || (!math.IsNaN(got) && math.Abs(got-tt.want) > 1e-9) {
				t.Errorf("quantile(%v, %v) = %v, want %v", tt.ms, tt.q, got, tt.want)
			}
		})
	}
}

func TestSummarizeSkipsWarmupAndOtherVariants(t *testing.T) {
	ss := []sample{
		{Variant: "new-job/with", Ms: 1000, Warmup: true},
		{Variant: "new-job/with", Ms: 10, SettleMs: 40},
		{Variant: "new-job/with", Ms: 30, Queued: true, SettleMs: 60},
		{Variant: "new-job/without", Ms: 5},
	}
	got := summarize("new-job/with", ss)
	want := summary{Variant: "new-job/with", N: 2, Median: 20, P90: 28, Min: 10, Max: 30, Queued: 1, Settle: 50}
	if got != want {
		t.Errorf("summarize = %+v, want %+v", got, want)
	}
}

func TestRatios(t *testing.T) {
	sums := map[string]summary{
		"new-job/without":       {Median: 200, P90: 250},
		"new-job/with":          {Median: 250, P90: 300},
		"step-in-alloc/without": {Median: 100, P90: 120},
		"step-in-alloc/with":    {Median: 150, P90: 180},
	}
	want := []ratio{
		{Shape: "new-job", MedianRatio: 1.25, P90Ratio: 1.2, MedianDelta: 50},
		{Shape: "step-in-alloc", MedianRatio: 1.5, P90Ratio: 1.5, MedianDelta: 50},
	}
	got := ratios(sums)
	if len(got) != len(want) {
		t.Fatalf("ratios = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("ratios[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestWaitedForResources(t *testing.T) {
	tests := []struct {
		stderr string
		want   bool
	}{
		{"", false},
		{"srun: job 12 queued and waiting for resources\nsrun: job 12 has been allocated resources\n", true},
		{"srun: Job 7 step creation temporarily disabled, retrying (Requested nodes are busy)\n", true},
		{"srun: error: something else\n", false},
	}
	for _, tt := range tests {
		if got := waitedForResources(tt.stderr); got != tt.want {
			t.Errorf("waitedForResources(%q) = %v, want %v", tt.stderr, got, tt.want)
		}
	}
}
