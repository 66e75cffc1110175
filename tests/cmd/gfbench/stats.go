// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// summary is what the table prints for one variant.
type summary struct {
	Variant string  `json:"variant"`
	N       int     `json:"n"`
	Median  float64 `json:"median_ms"`
	P90     float64 `json:"p90_ms"`
	Min     float64 `json:"min_ms"`
	Max     float64 `json:"max_ms"`
	Queued  int     `json:"queued"` // samples whose srun reported waiting for resources
	Settle  float64 `json:"settle_median_ms"`
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

func summarize(variant string, ss []sample) summary {
	var ms, settle []float64
	queued := 0
	for _, s := range ss {
		if s.Warmup || s.Variant != variant {
			continue
		}
		ms = append(ms, s.Ms)
		settle = append(settle, s.SettleMs)
		if s.Queued {
			queued++
		}
	}
	sum := summary{Variant: variant, N: len(ms), Queued: queued,
		Median: quantile(ms, 0.5), P90: quantile(ms, 0.9), Min: math.NaN(), Max: math.NaN(),
		Settle: quantile(settle, 0.5)}
	if len(ms) > 0 {
		sum.Min, sum.Max = slices.Min(ms), slices.Max(ms)
	}
	return sum
}

// ratio is one shape's with/without comparison.
type ratio struct {
	Shape       string  `json:"shape"`
	MedianRatio float64 `json:"median_ratio"`
	P90Ratio    float64 `json:"p90_ratio"`
	MedianDelta float64 `json:"median_delta_ms"`
}

func ratios(sums map[string]summary) []ratio {
	var rs []ratio
	for _, sh := range shapes {
		w, wo := sums[variantName(sh, true)], sums[variantName(sh, false)]
		rs = append(rs, ratio{
			Shape:       sh.name,
			MedianRatio: w.Median / wo.Median,
			P90Ratio:    w.P90 / wo.P90,
			MedianDelta: w.Median - wo.Median,
		})
	}
	return rs
}

func printTable(w io.Writer, sums []summary, rs []ratio) {
	fmt.Fprintf(w, "%-22s %4s %10s %10s %10s %10s %7s %16s\n", "variant", "N", "median ms", "p90 ms", "min ms", "max ms", "queued", "settle median ms")
	for _, s := range sums {
		fmt.Fprintf(w, "%-22s %4d %10.1f %10.1f %10.1f %10.1f %7d %16.0f\n", s.Variant, s.N, s.Median, s.P90, s.Min, s.Max, s.Queued, s.Settle)
	}
	fmt.Fprintln(w, "(settle: from srun's exit until squeue no longer lists the job or step; not part of the latency)")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-22s %14s %12s %16s\n", "with/without", "median ratio", "p90 ratio", "median delta ms")
	for _, r := range rs {
		fmt.Fprintf(w, "%-22s %14.2f %12.2f %+16.1f\n", r.Shape, r.MedianRatio, r.P90Ratio, r.MedianDelta)
	}
}

// variantName is "<shape>/<with|without>".
func variantName(sh shape, with bool) string {
	if with {
		return sh.name + "/with"
	}
	return sh.name + "/without"
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
