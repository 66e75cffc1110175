// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"os"
	"strings"
	"testing"
)

// What the agent's exporter writes (client_golang's text format), two
// scrapes of it.
const scrape1 = `# HELP gpufence_request_duration_seconds Time the agent took to answer one SPANK plugin request, by request type.
# TYPE gpufence_request_duration_seconds histogram
gpufence_request_duration_seconds_bucket{type="step_start",le="0.0005"} 2
gpufence_request_duration_seconds_bucket{type="step_start",le="0.001"} 3
gpufence_request_duration_seconds_bucket{type="step_start",le="0.0015"} 4
gpufence_request_duration_seconds_bucket{type="step_start",le="+Inf"} 4
gpufence_request_duration_seconds_sum{type="step_start"} 0.003
gpufence_request_duration_seconds_count{type="step_start"} 4
gpufence_request_duration_seconds_bucket{type="job_prolog",le="0.0005"} 0
gpufence_request_duration_seconds_bucket{type="job_prolog",le="0.001"} 0
gpufence_request_duration_seconds_bucket{type="job_prolog",le="0.0015"} 0
gpufence_request_duration_seconds_bucket{type="job_prolog",le="+Inf"} 0
gpufence_request_duration_seconds_sum{type="job_prolog"} 0
gpufence_request_duration_seconds_count{type="job_prolog"} 0
gpufence_requests_total{result="ok",type="step_start"} 4
`

const scrape2 = `gpufence_request_duration_seconds_bucket{type="step_start",le="0.0005"} 2
gpufence_request_duration_seconds_bucket{type="step_start",le="0.001"} 102
gpufence_request_duration_seconds_bucket{type="step_start",le="0.0015"} 103
gpufence_request_duration_seconds_bucket{type="step_start",le="+Inf"} 104
gpufence_request_duration_seconds_sum{type="step_start"} 0.1
gpufence_request_duration_seconds_count{type="step_start"} 104
`

func TestParseHistograms(t *testing.T) {
	hs, err := parseHistograms(scrape1, requestDurationMetric)
	if err != nil {
		t.Fatal(err)
	}
	h := hs["step_start"]
	if h.Count != 4 || h.Sum != 0.003 || len(h.Bounds) != 3 || len(h.Cum) != 4 || h.Cum[1] != 3 {
		t.Errorf("step_start = %+v", h)
	}
	if _, ok := hs["job_prolog"]; !ok {
		t.Errorf("job_prolog missing: %v", hs)
	}
	if _, ok := hs[""]; ok {
		t.Errorf("another metric read as a series: %v", hs)
	}
}

func TestParseHistogramsRefusesBadInput(t *testing.T) {
	for name, text := range map[string]string{
		"none":            "gpufence_requests_total 3\n",
		"count mismatch":  strings.Replace(scrape2, "_count{type=\"step_start\"} 104", "_count{type=\"step_start\"} 105", 1),
		"bad value":       strings.Replace(scrape2, "} 102", "} x", 1),
		"no +Inf bucket":  strings.Replace(scrape2, `le="+Inf"`, `le="0.002"`, 1),
		"unclosed labels": `gpufence_request_duration_seconds_sum{type="step_start 1` + "\n",
	} {
		if _, err := parseHistograms(text, requestDurationMetric); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestHistogramDiffQuantiles(t *testing.T) {
	a, err := parseHistograms(scrape1, requestDurationMetric)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseHistograms(scrape2, requestDurationMetric)
	if err != nil {
		t.Fatal(err)
	}
	d := subHistos(b, a)["step_start"]
	// 100 new observations: 99 in (0.5, 1] ms, 0 in (1, 1.5], 1 above.
	if d.Count != 100 || d.Cum[0] != 0 || d.Cum[1] != 99 || d.Cum[2] != 99 {
		t.Fatalf("diff = %+v", d)
	}
	if got := d.quantile(0.5); math.Abs(got-(0.0005+0.0005*50/99)) > 1e-12 {
		t.Errorf("p50 = %v", got)
	}
	if got := d.quantile(0.99); math.Abs(got-0.001) > 1e-12 {
		t.Errorf("p99 = %v, want 0.001", got)
	}
	// The rank of p999 lies in +Inf: the highest finite bound.
	if got := d.quantile(0.999); got != 0.0015 {
		t.Errorf("p999 = %v, want 0.0015", got)
	}
	if got := d.shareAtMost(0.001); got != 0.99 {
		t.Errorf("share <= 1 ms = %v, want 0.99", got)
	}
	if got := d.shareAtMost(0.0007); !math.IsNaN(got) {
		t.Errorf("share at a non-bound = %v, want NaN", got)
	}
	sum := map[string]histogram{}
	addHistos(sum, map[string]histogram{"step_start": d})
	addHistos(sum, map[string]histogram{"step_start": d})
	if s := sum["step_start"]; s.Count != 200 || s.Cum[1] != 198 {
		t.Errorf("sum = %+v", s)
	}
	if (histogram{}).quantile(0.5) == (histogram{}).quantile(0.5) {
		t.Error("quantile of an empty histogram is not NaN")
	}
}

func TestAgentRows(t *testing.T) {
	a, _ := parseHistograms(scrape1, requestDurationMetric)
	rows := agentRows([]roundHistos{{Sequential: a, Burst: map[string]histogram{"step_start": a["step_start"]}}})
	// job_prolog has no observation: no row.
	if len(rows) != 2 || rows[0].During != duringSequential || rows[1].During != duringBurst || rows[0].Type != "step_start" {
		t.Fatalf("rows = %+v", rows)
	}
	if rows[0].Count != 4 || rows[0].Within1ms != 0.75 || math.Abs(rows[0].Mean-0.00075) > 1e-12 {
		t.Errorf("row = %+v", rows[0])
	}
}

func TestParseSchedStat(t *testing.T) {
	s, ok := parseSchedStat("622115 154086 3\n")
	if !ok || math.Abs(s.RunMs-0.622115) > 1e-9 || math.Abs(s.WaitMs-0.154086) > 1e-9 {
		t.Errorf("parseSchedStat = %+v, %v", s, ok)
	}
	for _, bad := range []string{"", "1 2", "1 x 3", "1 2 3 4"} {
		if _, ok := parseSchedStat(bad); ok {
			t.Errorf("parseSchedStat(%q) accepted", bad)
		}
	}
	d := schedStat{RunMs: 5, WaitMs: 7}.sub(schedStat{RunMs: 2, WaitMs: 3}).add(schedStat{RunMs: 1, WaitMs: 1})
	if d != (schedStat{RunMs: 4, WaitMs: 5}) {
		t.Errorf("sub/add = %+v", d)
	}
	// This process's own threads: it has run.
	if own := readSchedStat(os.Getpid()); own.RunMs <= 0 {
		t.Errorf("readSchedStat(self) = %+v", own)
	}
}

func TestSumAgentCPU(t *testing.T) {
	a, _ := parseHistograms(scrape1, requestDurationMetric)
	b, _ := parseHistograms(scrape2, requestDurationMetric)
	got := sumAgentCPU([]roundHistos{
		{Sequential: a, Burst: b, BurstSched: schedStat{RunMs: 1, WaitMs: 2}, RoundSched: schedStat{RunMs: 10, WaitMs: 20}},
		{Sequential: a, BurstSched: schedStat{RunMs: 3}, RoundSched: schedStat{RunMs: 5}},
	})
	// Requests: 4 step_start (+0 job_prolog) per scrape1, 104 in scrape2.
	if got.N != 2 || got.Requests != 4+104+4 || got.Burst != (schedStat{RunMs: 4, WaitMs: 2}) || got.Rounds != (schedStat{RunMs: 15, WaitMs: 20}) {
		t.Errorf("sumAgentCPU = %+v", got)
	}
}
