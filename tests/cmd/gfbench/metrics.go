// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// requestDurationMetric is the agent's histogram of its answer times, by
// request type (agent/metrics, docs/metrics.md).
const requestDurationMetric = "gpufence_request_duration_seconds"

// histogram is one Prometheus histogram series: cumulative counts per
// upper bound (Bounds ascending, +Inf left out; Cum has one more entry, the
// +Inf bucket, equal to Count).
type histogram struct {
	Bounds []float64 `json:"bounds_s"`
	Cum    []uint64  `json:"cumulative"`
	Sum    float64   `json:"sum_s"`
	Count  uint64    `json:"count"`
}

// parseHistograms reads the series of the histogram name from a Prometheus
// text exposition, keyed by their "type" label.
func parseHistograms(text, name string) (map[string]histogram, error) {
	type bucket struct {
		le  float64
		cum uint64
	}
	buckets := map[string][]bucket{}
	out := map[string]histogram{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"_") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		metric, labelText, _ := strings.Cut(series, "{")
		labels, err := parseLabels(strings.TrimSuffix(labelText, "}"))
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		typ := labels["type"]
		h := out[typ]
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		switch strings.TrimPrefix(metric, name+"_") {
		case "bucket":
			le, err := strconv.ParseFloat(labels["le"], 64)
			if err != nil {
				return nil, fmt.Errorf("metrics line %q: le: %w", line, err)
			}
			buckets[typ] = append(buckets[typ], bucket{le, uint64(v)})
		case "sum":
			h.Sum = v
		case "count":
			h.Count = uint64(v)
		default:
			continue
		}
		out[typ] = h
	}
	for typ, bs := range buckets {
		sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
		h := out[typ]
		for _, b := range bs {
			if !math.IsInf(b.le, 1) {
				h.Bounds = append(h.Bounds, b.le)
			}
			h.Cum = append(h.Cum, b.cum)
		}
		if len(h.Cum) != len(h.Bounds)+1 || h.Cum[len(h.Cum)-1] != h.Count {
			return nil, fmt.Errorf("%s{type=%q}: buckets do not end in +Inf = count", name, typ)
		}
		out[typ] = h
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s in the metrics", name)
	}
	return out, nil
}

// parseLabels reads `a="x",b="y"` (values without escapes, as ours are).
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for s != "" {
		k, rest, ok := strings.Cut(s, `="`)
		if !ok {
			return nil, fmt.Errorf("labels %q", s)
		}
		v, rest, ok := strings.Cut(rest, `"`)
		if !ok {
			return nil, fmt.Errorf("labels %q", s)
		}
		out[k] = v
		s = strings.TrimPrefix(rest, ",")
	}
	return out, nil
}

// sub is a minus b (b an earlier scrape of the same series).
func (a histogram) sub(b histogram) histogram {
	if len(b.Cum) == 0 {
		return a
	}
	d := histogram{Bounds: slices.Clone(a.Bounds), Sum: a.Sum - b.Sum, Count: a.Count - b.Count}
	for i := range a.Cum {
		d.Cum = append(d.Cum, a.Cum[i]-b.Cum[i])
	}
	return d
}

func (a histogram) add(b histogram) histogram {
	if len(a.Cum) == 0 {
		return b
	}
	d := histogram{Bounds: slices.Clone(a.Bounds), Sum: a.Sum + b.Sum, Count: a.Count + b.Count}
	for i := range a.Cum {
		d.Cum = append(d.Cum, a.Cum[i]+b.Cum[i])
	}
	return d
}

func subHistos(a, b map[string]histogram) map[string]histogram {
	out := map[string]histogram{}
	for k, h := range a {
		out[k] = h.sub(b[k])
	}
	return out
}

func addHistos(dst, src map[string]histogram) {
	for k, h := range src {
		dst[k] = dst[k].add(h)
	}
}

// quantile is Prometheus's histogram_quantile: linear within the bucket
// that holds the rank, from its lower bound (0 for the first); a rank in
// the +Inf bucket gives the highest finite bound.
func (a histogram) quantile(q float64) float64 {
	if a.Count == 0 {
		return math.NaN()
	}
	rank := q * float64(a.Count)
	for i, c := range a.Cum {
		if float64(c) < rank {
			continue
		}
		if i == len(a.Bounds) {
			return a.Bounds[len(a.Bounds)-1]
		}
		lo, below := 0.0, uint64(0)
		if i > 0 {
			lo, below = a.Bounds[i-1], a.Cum[i-1]
		}
		in := c - below
		if in == 0 {
			return a.Bounds[i]
		}
		return lo + (a.Bounds[i]-lo)*(rank-float64(below))/float64(in)
	}
	return a.Bounds[len(a.Bounds)-1]
}

// shareAtMost is the fraction of observations at or below bound, which
// must be one of the bucket bounds (exact, unlike a quantile).
func (a histogram) shareAtMost(bound float64) float64 {
	if a.Count == 0 {
		return math.NaN()
	}
	for i, b := range a.Bounds {
		if b == bound {
			return float64(a.Cum[i]) / float64(a.Count)
		}
	}
	return math.NaN()
}

const (
	duringSequential = "one-at-a-time"
	duringBurst      = "burst"
)

// agentRow is one request type's latency in the agent, summed over the
// gpufence rounds.
type agentRow struct {
	Type   string  `json:"type"`
	During string  `json:"during"`
	Count  uint64  `json:"count"`
	P50    float64 `json:"p50_s"`
	P99    float64 `json:"p99_s"`
	Mean   float64 `json:"mean_s"`
	// Within1ms is the share answered within 1 ms (a bucket bound: exact).
	Within1ms float64 `json:"share_within_1ms"`
}

func agentRows(rounds []roundHistos) []agentRow {
	seq, burst := map[string]histogram{}, map[string]histogram{}
	for _, r := range rounds {
		addHistos(seq, r.Sequential)
		addHistos(burst, r.Burst)
	}
	var rows []agentRow
	for _, part := range []struct {
		during string
		hs     map[string]histogram
	}{{duringSequential, seq}, {duringBurst, burst}} {
		types := make([]string, 0, len(part.hs))
		for t := range part.hs {
			types = append(types, t)
		}
		sort.Strings(types)
		for _, t := range types {
			h := part.hs[t]
			if h.Count == 0 {
				continue
			}
			rows = append(rows, agentRow{Type: t, During: part.during, Count: h.Count,
				P50: h.quantile(0.5), P99: h.quantile(0.99), Mean: h.Sum / float64(h.Count), Within1ms: h.shareAtMost(0.001)})
		}
	}
	return rows
}

func printAgent(w io.Writer, rows []agentRow, cpu agentCPU) {
	fmt.Fprintf(w, "agent %s, gpufence rounds (from its histogram buckets)\n", requestDurationMetric)
	fmt.Fprintf(w, "%-12s %-14s %6s %9s %9s %9s %10s\n", "type", "during", "count", "p50 ms", "p99 ms", "mean ms", "<= 1 ms")
	for _, r := range rows {
		fmt.Fprintf(w, "%-12s %-14s %6d %9.3f %9.3f %9.3f %9.1f%%\n", r.Type, r.During, r.Count, r.P50*1000, r.P99*1000, r.Mean*1000, r.Within1ms*100)
	}
	for _, r := range rows {
		if r.Type == metricStepSrt && r.During == duringBurst && cpu.N > 0 {
			fmt.Fprintf(w, "during the bursts the agent's threads ran %.1f ms and waited %.1f ms for a CPU (schedstat), its handlers took %.1f ms in all (histogram sum)\n",
				cpu.Burst.RunMs, cpu.Burst.WaitMs, r.Mean*float64(r.Count)*1000)
		}
	}
	if cpu.Requests > 0 {
		fmt.Fprintf(w, "over the %d gpufence rounds the agent's threads ran %.1f ms for %d requests: %.2f ms of CPU per request, all it does meanwhile included\n",
			cpu.N, cpu.Rounds.RunMs, cpu.Requests, cpu.Rounds.RunMs/float64(cpu.Requests))
	}
}

// schedStat is what the kernel counted for a process's threads
// (/proc/<pid>/task/*/schedstat): time on a CPU, and time runnable but
// waiting for one. A thread that exits between two reads is lost; the
// agent's Go threads live as long as it does.
type schedStat struct {
	RunMs  float64 `json:"on_cpu_ms"`
	WaitMs float64 `json:"runqueue_wait_ms"`
}

// readSchedStat sums the schedstat of pid's threads; a zero schedStat if
// it cannot be read (a kernel without CONFIG_SCHEDSTATS).
func readSchedStat(pid int) schedStat {
	var s schedStat
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if d, ok := parseSchedStat(string(data)); ok {
			s = s.add(d)
		}
	}
	return s
}

// parseSchedStat reads one schedstat line: "<on-cpu ns> <wait ns> <slices>".
func parseSchedStat(line string) (schedStat, bool) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return schedStat{}, false
	}
	run, err1 := strconv.ParseUint(f[0], 10, 64)
	wait, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return schedStat{}, false
	}
	return schedStat{RunMs: float64(run) / 1e6, WaitMs: float64(wait) / 1e6}, true
}

func (a schedStat) add(b schedStat) schedStat {
	return schedStat{RunMs: a.RunMs + b.RunMs, WaitMs: a.WaitMs + b.WaitMs}
}

func (a schedStat) sub(b schedStat) schedStat {
	return schedStat{RunMs: a.RunMs - b.RunMs, WaitMs: a.WaitMs - b.WaitMs}
}

// agentCPU sums the agent's schedstat over the gpufence rounds, for the
// bursts and for the whole rounds, and counts the requests of the rounds.
type agentCPU struct {
	Burst, Rounds schedStat
	Requests      uint64
	N             int // rounds
}

func sumAgentCPU(rounds []roundHistos) agentCPU {
	var a agentCPU
	for _, r := range rounds {
		a.Burst = a.Burst.add(r.BurstSched)
		a.Rounds = a.Rounds.add(r.RoundSched)
		for _, hs := range []map[string]histogram{r.Sequential, r.Burst} {
			for _, h := range hs {
				a.Requests += h.Count
			}
		}
		a.N++
	}
	return a
}
