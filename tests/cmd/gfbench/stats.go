// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// shapes is the table's order; settle-* come from the new-job and
// step-in-alloc samples' SettleMs.
var shapes = []string{shNewJob, shStep, shSettleJob, shSettleStep, shBurst}

// summary is what the table prints for one shape in one variant.
type summary struct {
	Shape   string  `json:"shape"`
	Variant string  `json:"variant"`
	N       int     `json:"n"`
	Median  float64 `json:"median_ms"`
	P90     float64 `json:"p90_ms"`
	Min     float64 `json:"min_ms"`
	Max     float64 `json:"max_ms"`
	Queued  int     `json:"queued"` // sruns that reported waiting for resources
}

// quantile is the q-quantile of ms by linear interpolation between closest
// ranks (numpy's default), so a median of an even count is the mean of the
// middle two.
func quantile(ms []float64, q float64) float64 {
	if len(ms) == 0 {
		return math.NaN()
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// values picks the counted samples of shape in variant: warm-ups left out.
func values(shape, variant string, ss []sample) (ms []float64, queued int) {
	src := shape
	switch shape {
	case shSettleJob:
		src = shNewJob
	case shSettleStep:
		src = shStep
	}
	for _, s := range ss {
		if s.Warmup || s.Variant != variant || s.Shape != src {
			continue
		}
		if src != shape {
			ms = append(ms, s.SettleMs)
			continue
		}
		ms = append(ms, s.Ms)
		queued += s.Queued
	}
	return ms, queued
}

func summarize(shape, variant string, ss []sample) summary {
	ms, queued := values(shape, variant, ss)
	sum := summary{Shape: shape, Variant: variant, N: len(ms), Queued: queued,
		Median: quantile(ms, 0.5), P90: quantile(ms, 0.9), Min: math.NaN(), Max: math.NaN()}
	if len(ms) > 0 {
		sum.Min, sum.Max = slices.Min(ms), slices.Max(ms)
	}
	return sum
}

// summarizeAll summarises every shape in every variant the samples have,
// in table order.
func summarizeAll(ss []sample) []summary {
	var out []summary
	for _, sh := range shapes {
		for _, v := range variants {
			if slices.ContainsFunc(ss, func(s sample) bool { return s.Variant == v.Name }) {
				out = append(out, summarize(sh, v.Name, ss))
			}
		}
	}
	return out
}

// ratio compares one shape's variant against none and constrain.
type ratio struct {
	Shape   string `json:"shape"`
	Variant string `json:"variant"`
	// Against none (stock Slurm) in the same run.
	MedianRatio float64 `json:"median_ratio"`
	P90Ratio    float64 `json:"p90_ratio"`
	MedianDelta float64 `json:"median_delta_ms"`
	// Against ConstrainDevices=yes in the same run.
	DeltaVsConstrain float64 `json:"median_delta_vs_constrain_ms"`
	// PairedRatio is the median over rounds of this variant's round median
	// over none's round median in the same round index (minutes apart at
	// most): less moved by load that other work puts on the machine for a
	// while. PairedRounds is how many rounds had both.
	PairedRatio  float64 `json:"paired_median_ratio"`
	PairedRounds int     `json:"paired_rounds"`
}

// addPaired fills the paired ratios from the samples.
func addPaired(rs []ratio, ss []sample) []ratio {
	for i := range rs {
		rs[i].PairedRatio, rs[i].PairedRounds = pairedRatio(ss, rs[i].Shape, rs[i].Variant)
	}
	return rs
}

func pairedRatio(ss []sample, shape, variant string) (float64, int) {
	byRound := func(v string) map[int][]sample {
		m := map[int][]sample{}
		for _, s := range ss {
			if s.Variant == v {
				m[s.Round] = append(m[s.Round], s)
			}
		}
		return m
	}
	mine, none := byRound(variant), byRound(vNone.Name)
	var rs []float64
	for round, m := range mine {
		a, _ := values(shape, variant, m)
		b, _ := values(shape, vNone.Name, none[round])
		if len(a) > 0 && len(b) > 0 {
			rs = append(rs, quantile(a, 0.5)/quantile(b, 0.5))
		}
	}
	return quantile(rs, 0.5), len(rs)
}

func maxLoad(rs []roundInfo) float64 {
	m := 0.0
	for _, r := range rs {
		m = max(m, r.LoadStart, r.LoadEnd)
	}
	return m
}

func find(sums []summary, shape, variant string) summary {
	for _, s := range sums {
		if s.Shape == shape && s.Variant == variant {
			return s
		}
	}
	return summary{Shape: shape, Variant: variant, Median: math.NaN(), P90: math.NaN()}
}

func ratios(sums []summary) []ratio {
	var rs []ratio
	for _, sh := range shapes {
		none, con := find(sums, sh, vNone.Name), find(sums, sh, vConstrain.Name)
		for _, v := range variants {
			if v == vNone || (v == vNoop && !slices.ContainsFunc(sums, func(s summary) bool { return s.Variant == v.Name })) {
				continue
			}
			s := find(sums, sh, v.Name)
			rs = append(rs, ratio{
				Shape: sh, Variant: v.Name,
				MedianRatio: s.Median / none.Median, P90Ratio: s.P90 / none.P90,
				MedianDelta: s.Median - none.Median, DeltaVsConstrain: s.Median - con.Median,
			})
		}
	}
	return rs
}

func findRatio(rs []ratio, shape, variant string) (ratio, bool) {
	for _, r := range rs {
		if r.Shape == shape && r.Variant == variant {
			return r, true
		}
	}
	return ratio{}, false
}

func printTable(w io.Writer, sums []summary, rs []ratio) {
	fmt.Fprintf(w, "%-14s %-10s %4s %10s %9s %9s %9s %6s %8s %9s %12s %9s\n",
		"shape", "variant", "N", "median ms", "p90 ms", "min ms", "max ms", "queued", "x none", "+ms none", "+ms constr.", "x paired")
	for _, s := range sums {
		ratioCol, deltaCol, conCol, pairCol := "", "", "", ""
		if r, ok := findRatio(rs, s.Shape, s.Variant); ok {
			ratioCol = fmt.Sprintf("%.3f", r.MedianRatio)
			pairCol = fmt.Sprintf("%.3f", r.PairedRatio)
			deltaCol = fmt.Sprintf("%+.1f", r.MedianDelta)
			if s.Variant != vConstrain.Name {
				conCol = fmt.Sprintf("%+.1f", r.DeltaVsConstrain)
			}
		}
		fmt.Fprintf(w, "%-14s %-10s %4d %10.1f %9.1f %9.1f %9.1f %6d %8s %9s %12s %9s\n",
			s.Shape, s.Variant, s.N, s.Median, s.P90, s.Min, s.Max, s.Queued, ratioCol, deltaCol, conCol, pairCol)
	}
	fmt.Fprintln(w, "(x none, +ms: the median against \"none\" and \"constrain\" of the same run. settle-*: from srun's exit until")
	fmt.Fprintln(w, " squeue no longer lists the job / step, not part of its latency. burst: until the last of the concurrent sruns exited.")
	fmt.Fprintln(w, " x paired: the median over rounds of the round's median against none's in the same round.)")
}

// target is one of issue 12's targets, checked against this run.
type target struct {
	What  string  `json:"what"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Holds bool    `json:"holds"`
}

// checkTargets: step ≤ 1.05× and ≤ +2 ms, new job ≤ 1.03× and ≤ +5 ms,
// settle ≤ +5 ms, burst ≤ 1.05×, agent StepStart p99 ≤ 1 ms during the
// bursts, and never more than 2 ms slower than ConstrainDevices=yes.
func checkTargets(rs []ratio, agent []agentRow) []target {
	var ts []target
	add := func(what string, v, limit float64) {
		ts = append(ts, target{What: what, Value: v, Limit: limit, Holds: !math.IsNaN(v) && v <= limit})
	}
	g := func(shape string) ratio {
		r, ok := findRatio(rs, shape, vGpufence.Name)
		if !ok {
			return ratio{MedianRatio: math.NaN(), MedianDelta: math.NaN(), DeltaVsConstrain: math.NaN()}
		}
		return r
	}
	add("step-in-alloc x none", g(shStep).MedianRatio, 1.05)
	add("step-in-alloc +ms none", g(shStep).MedianDelta, 2)
	add("new-job x none", g(shNewJob).MedianRatio, 1.03)
	add("new-job +ms none", g(shNewJob).MedianDelta, 5)
	add("settle-job +ms none", g(shSettleJob).MedianDelta, 5)
	add("burst x none", g(shBurst).MedianRatio, 1.05)
	p99 := math.NaN()
	for _, a := range agent {
		if a.Type == metricStepSrt && a.During == duringBurst {
			p99 = a.P99 * 1000
		}
	}
	add("agent step_start p99 ms in bursts", p99, 1)
	for _, sh := range shapes {
		add(sh+" +ms constrain", g(sh).DeltaVsConstrain, 2)
	}
	return ts
}

func printTargets(w io.Writer, ts []target) {
	fmt.Fprintf(w, "%-36s %10s %8s  %s\n", "target (issue 12)", "measured", "limit", "")
	for _, t := range ts {
		verdict := "holds"
		if !t.Holds {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "%-36s %10.3f %8.3f  %s\n", t.What, t.Value, t.Limit, verdict)
	}
}

// waitedForResources tells whether srun's stderr says the job or step
// waited for resources, which would measure the scheduler's retry interval
// rather than launch cost.
func waitedForResources(stderr string) bool {
	for _, m := range []string{"queued and waiting for resources", "Requested nodes are busy", "step creation temporarily disabled"} {
		if strings.Contains(stderr, m) {
			return true
		}
	}
	return false
}
