// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"slices"
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

func TestSummarizeSkipsWarmupOtherVariantsAndShapes(t *testing.T) {
	ss := []sample{
		{Variant: "gpufence", Shape: shNewJob, Ms: 1000, SettleMs: 900, Warmup: true},
		{Variant: "gpufence", Shape: shNewJob, Ms: 10, SettleMs: 40},
		{Variant: "gpufence", Shape: shNewJob, Ms: 30, Queued: 1, SettleMs: 60},
		{Variant: "gpufence", Shape: shStep, Ms: 3, SettleMs: 7},
		{Variant: "none", Shape: shNewJob, Ms: 5},
	}
	got := summarize(shNewJob, "gpufence", ss)
	want := summary{Shape: shNewJob, Variant: "gpufence", N: 2, Median: 20, P90: 28, Min: 10, Max: 30, Queued: 1}
	if got != want {
		t.Errorf("summarize new-job = %+v, want %+v", got, want)
	}
	// settle-job is the new-job samples' settle time.
	got = summarize(shSettleJob, "gpufence", ss)
	want = summary{Shape: shSettleJob, Variant: "gpufence", N: 2, Median: 50, P90: 58, Min: 40, Max: 60}
	if got != want {
		t.Errorf("summarize settle-job = %+v, want %+v", got, want)
	}
}

func TestRatiosAndTargets(t *testing.T) {
	sums := []summary{
		{Shape: shNewJob, Variant: "none", Median: 200, P90: 250},
		{Shape: shNewJob, Variant: "constrain", Median: 201, P90: 250},
		{Shape: shNewJob, Variant: "gpufence", Median: 204, P90: 300},
		{Shape: shStep, Variant: "none", Median: 100, P90: 120},
		{Shape: shStep, Variant: "constrain", Median: 100, P90: 120},
		{Shape: shStep, Variant: "gpufence", Median: 103, P90: 180},
		{Shape: shSettleJob, Variant: "none", Median: 50, P90: 50},
		{Shape: shSettleJob, Variant: "constrain", Median: 50, P90: 50},
		{Shape: shSettleJob, Variant: "gpufence", Median: 54, P90: 50},
		{Shape: shSettleStep, Variant: "none", Median: 10, P90: 10},
		{Shape: shSettleStep, Variant: "constrain", Median: 10, P90: 10},
		{Shape: shSettleStep, Variant: "gpufence", Median: 10, P90: 10},
		{Shape: shBurst, Variant: "none", Median: 1000, P90: 1000},
		{Shape: shBurst, Variant: "constrain", Median: 1000, P90: 1000},
		{Shape: shBurst, Variant: "gpufence", Median: 1100, P90: 1000},
	}
	rs := ratios(sums)
	r, ok := findRatio(rs, shNewJob, "gpufence")
	if !ok || r.MedianRatio != 1.02 || r.P90Ratio != 1.2 || r.MedianDelta != 4 || r.DeltaVsConstrain != 3 {
		t.Errorf("new-job gpufence ratio = %+v", r)
	}
	r, ok = findRatio(rs, shStep, "constrain")
	if !ok || r.MedianRatio != 1 || r.MedianDelta != 0 {
		t.Errorf("step constrain ratio = %+v", r)
	}
	agent := []agentRow{{Type: metricStepSrt, During: duringBurst, P99: 0.0012}}
	want := map[string]bool{
		"step-in-alloc x none":              true,  // 1.03
		"step-in-alloc +ms none":            false, // +3
		"new-job x none":                    true,  // 1.02
		"new-job +ms none":                  true,  // +4
		"settle-job +ms none":               true,  // +4
		"burst x none":                      false, // 1.1
		"agent step_start p99 ms in bursts": false, // 1.2 ms
		"new-job +ms constrain":             false, // +3
		"step-in-alloc +ms constrain":       false, // +3
		"settle-job +ms constrain":          false, // +4
		"settle-step +ms constrain":         true,
		"burst +ms constrain":               false, // +100
	}
	ts := checkTargets(rs, agent)
	if len(ts) != len(want) {
		t.Fatalf("%d targets, want %d: %+v", len(ts), len(want), ts)
	}
	for _, tg := range ts {
		w, ok := want[tg.What]
		if !ok || tg.Holds != w {
			t.Errorf("target %q (%v, limit %v): holds=%v, want %v (known: %v)", tg.What, tg.Value, tg.Limit, tg.Holds, w, ok)
		}
	}
}

func TestTargetsMissedWithoutData(t *testing.T) {
	for _, tg := range checkTargets(nil, nil) {
		if tg.Holds {
			t.Errorf("target %q holds with no measurement", tg.What)
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

// The spank-noop variant is in the summary and the ratios only when the
// run measured it.
func TestNoopVariantOnlyWhenMeasured(t *testing.T) {
	ss := []sample{
		{Variant: "none", Shape: shNewJob, Ms: 100},
		{Variant: "constrain", Shape: shNewJob, Ms: 101},
		{Variant: "gpufence", Shape: shNewJob, Ms: 110},
	}
	has := func(sums []summary, rs []ratio) (bool, bool) {
		return slices.ContainsFunc(sums, func(s summary) bool { return s.Variant == vNoop.Name }),
			slices.ContainsFunc(rs, func(r ratio) bool { return r.Variant == vNoop.Name })
	}
	sums := summarizeAll(ss)
	if s, r := has(sums, ratios(sums)); s || r {
		t.Errorf("spank-noop not measured but in the summary (%v) or ratios (%v)", s, r)
	}
	ss = append(ss, sample{Variant: "spank-noop", Shape: shNewJob, Ms: 108})
	sums = summarizeAll(ss)
	rs := ratios(sums)
	if s, r := has(sums, rs); !s || !r {
		t.Fatalf("spank-noop measured but missing from the summary (%v) or ratios (%v)", s, r)
	}
	r, _ := findRatio(rs, shNewJob, vNoop.Name)
	if r.MedianDelta != 8 || r.DeltaVsConstrain != 7 {
		t.Errorf("spank-noop new-job ratio = %+v", r)
	}
	if len(sums) != len(shapes)*4 {
		t.Errorf("%d summaries, want %d (every shape, 4 variants)", len(sums), len(shapes)*4)
	}
}

// The paired ratio compares each round with none's round of the same
// index, so a slow round (other work on the machine) moves it less than
// the pooled median.
func TestPairedRatio(t *testing.T) {
	var ss []sample
	add := func(v string, round int, ms ...float64) {
		for _, m := range ms {
			ss = append(ss, sample{Variant: v, Shape: shStep, Round: round, Ms: m})
		}
	}
	add("none", 0, 100, 100)
	add("gpufence", 0, 110, 110) // 1.1
	add("none", 1, 300, 300)     // a busy minute
	add("gpufence", 1, 330, 330) // 1.1
	add("none", 2, 100)
	add("gpufence", 2, 120) // 1.2
	add("gpufence", 3, 999) // no none in round 3: not paired
	ss = append(ss, sample{Variant: "gpufence", Shape: shStep, Round: 0, Ms: 5000, Warmup: true})
	got, n := pairedRatio(ss, shStep, "gpufence")
	if n != 3 || math.Abs(got-1.1) > 1e-9 {
		t.Errorf("pairedRatio = %v over %d rounds, want 1.1 over 3", got, n)
	}
	if _, n := pairedRatio(ss, shNewJob, "gpufence"); n != 0 {
		t.Errorf("pairedRatio of an unmeasured shape over %d rounds", n)
	}
	if m := maxLoad([]roundInfo{{LoadStart: 1, LoadEnd: 3.5}, {LoadStart: 2}}); m != 3.5 {
		t.Errorf("maxLoad = %v", m)
	}
}
