// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpufence/gpufence/tests/cluster"
)

// agentGauges reads from the agent's own /metrics what bounds its cost:
// goroutines, open fds, and the requests it served and shed.
type agentGauges struct {
	goroutines, fds, shed, stepStarts float64
}

func (st *suite) gauges(t *testing.T) agentGauges {
	t.Helper()
	g, err := st.scrapeGauges()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func (st *suite) scrapeGauges() (agentGauges, error) {
	// The process figures are served to an authenticated scraper only.
	code, body, err := st.scrape("/metrics", true)
	if err != nil || code != http.StatusOK {
		return agentGauges{}, fmt.Errorf("scrape the agent: %d %v", code, err)
	}
	var g agentGauges
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		name, val, ok := strings.Cut(l, " ")
		if !ok || strings.HasPrefix(l, "#") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch {
		case name == "go_goroutines":
			g.goroutines = v
		case name == "process_open_fds":
			g.fds = v
		case name == "gpufence_requests_shed_total":
			g.shed = v
		case strings.HasPrefix(name, "gpufence_requests_total{") && strings.Contains(name, `type="step_start"`):
			g.stepStarts += v
		}
	}
	return g, sc.Err()
}

// TestPrivilegedStepBurst: 200 steps register at once, half of them in a
// GPU job and half in a CPU-only job on the same node (the node's two CPUs
// hold the two allocations; the steps overlap inside them). Every step
// starts, none waits out the plugin's timeout, the GPU steps open exactly
// their job's GPUs (from slurmctld), the CPU-only ones none, and the agent
// ends with the goroutines and fds it had before. None is shed: 200 is
// under the server's cap of concurrent connections.
func TestPrivilegedStepBurst(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	const steps = 200
	gpuJob := st.allocate(t, user, "--gres=gpu:2")
	cpuJob := st.allocate(t, user)
	gpus := st.allocated(t)[gpuJob]
	if len(gpus) != 2 {
		t.Fatalf("slurmctld gave job %d GPUs %v, want 2", gpuJob, gpus)
	}
	// Each allocation's first step (its extern step's registration is done
	// by then), so that the burst measures steps, not allocations.
	st.probeStep(t, gpuJob, nil)
	st.probeStep(t, cpuJob, nil)
	time.Sleep(2 * time.Second)
	before := st.gauges(t)

	var peak agentGauges
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			g, err := st.scrapeGauges()
			if err != nil {
				continue
			}
			peak.goroutines = max(peak.goroutines, g.goroutines)
			peak.fds = max(peak.fds, g.fds)
		}
	}()

	results := make([]cluster.Result, steps)
	took := make([]time.Duration, steps)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range steps {
		job := gpuJob
		if i%2 == 1 {
			job = cpuJob
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			results[i] = st.c.Run(st.ctx, user, "srun", append([]string{fmt.Sprintf("--jobid=%d", job), "--overlap", st.open, "-env"}, st.paths()...)...)
			took[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	all := time.Since(start)
	close(stop)
	<-sampled

	failed, slow := 0, 0
	for i, r := range results {
		if r.Code != 0 {
			failed++
			if failed <= 3 {
				t.Errorf("step %d: %s", i, r)
			}
			continue
		}
		if strings.Contains(r.Stderr, "gpufence") {
			t.Errorf("step %d: gpufence said something: %s", i, r.Stderr)
		}
		if took[i] > 30*time.Second {
			slow++
		}
		rep := cluster.ParseOpen(r.Stdout)
		want := gpus
		if i%2 == 1 {
			want = nil
		}
		for g, p := range st.c.DevPaths() {
			exp := "EPERM"
			if slices.Contains(want, g) {
				exp = "ENXIO"
			}
			if rep.Open[p] != exp {
				t.Errorf("step %d (job GPUs %v): GPU %d gave %q, want %s", i, want, g, rep.Open[p], exp)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d steps failed", failed, steps)
	}

	// Every connection is closed once its step is done: back to before.
	var after agentGauges
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		after = st.gauges(t)
		if (after.goroutines <= before.goroutines+5 && after.fds <= before.fds+5) || time.Now().After(deadline) {
			break
		}
	}
	if after.goroutines > before.goroutines+5 || after.fds > before.fds+5 {
		t.Errorf("agent after the burst: %v goroutines, %v fds; before: %v, %v", after.goroutines, after.fds, before.goroutines, before.fds)
	}
	if after.shed != before.shed {
		t.Errorf("%v connections shed during a burst of %d (the cap is 512)", after.shed-before.shed, steps)
	}
	if got := after.stepStarts - before.stepStarts; got < steps {
		t.Errorf("agent served %v StepStart requests during the burst, want at least %d", got, steps)
	}
	slices.Sort(took)
	t.Logf("%d steps at once: all done in %v; per step p50 %v, max %v; %d over 30 s, %d failed; agent goroutines %v → peak %v → %v, fds %v → peak %v → %v, shed %v",
		steps, all.Round(time.Millisecond), took[steps/2].Round(time.Millisecond), took[steps-1].Round(time.Millisecond), slow, failed,
		before.goroutines, peak.goroutines, after.goroutines, before.fds, peak.fds, after.fds, after.shed-before.shed)
}
