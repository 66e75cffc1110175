// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/tests/cluster"
)

// migProbe counts, over the whole MIG test, what each device gave.
type migProbe struct {
	mu     sync.Mutex
	counts map[string]map[string]int
}

func (p *migProbe) add(rep cluster.OpenReport) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for path, res := range rep.Open {
		if p.counts[path] == nil {
			p.counts[path] = map[string]int{}
		}
		p.counts[path][res]++
	}
}

// migPaths are the devices a MIG job probes: both GPUs, nvidiactl,
// nvidia-uvm, and every capability node (each slice's, config, monitor).
func (st *suite) migPaths() []string {
	p := []string{st.c.DevPath(0), st.c.DevPath(1), st.c.CtlPath(), filepath.Join(st.c.Root(), "dev", "nvidia-uvm")}
	for _, m := range cluster.MIGAdminCaps {
		p = append(p, st.c.CapsPath(m))
	}
	for _, s := range cluster.MIGSlices {
		for _, m := range s.Caps {
			p = append(p, st.c.CapsPath(m))
		}
	}
	return p
}

// expectMIG checks one probe against the step's gres indices in the MIG
// layout: index 0 is GPU 0 whole, the others slices of GPU 1. A slice opens
// GPU 1 and exactly its own capability nodes; config and monitor never
// open; nvidiactl and nvidia-uvm always do.
func (st *suite) expectMIG(t *testing.T, rep cluster.OpenReport, held []int) {
	t.Helper()
	want := map[string]string{}
	for _, p := range st.migPaths() {
		want[p] = "EPERM"
	}
	want[st.c.CtlPath()] = "ENXIO"
	want[filepath.Join(st.c.Root(), "dev", "nvidia-uvm")] = "ENXIO"
	for _, idx := range held {
		if idx == 0 {
			want[st.c.DevPath(0)] = "ENXIO"
			continue
		}
		s := cluster.MIGSlices[idx-1]
		want[st.c.DevPath(s.GPU)] = "ENXIO"
		for _, m := range s.Caps {
			want[st.c.CapsPath(m)] = "ENXIO"
		}
	}
	for _, p := range st.migPaths() {
		if got := rep.Open[p]; got != want[p] {
			t.Errorf("gres %v: %s: %q, want %s", held, strings.TrimPrefix(p, st.c.Root()+"/dev/"), got, want[p])
		}
	}
}

// TestPrivilegedMIG: with a MIG-style gres.conf (GPU 0 whole, GPU 1 split
// into three 1g.10gb slices, each a MultipleFiles= record with its caps
// nodes), a job holding a slice opens its parent GPU and its own capability
// nodes only, two jobs on two slices of one GPU each see only theirs, and
// the denials are audited with the slice and its device.
func TestPrivilegedMIG(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	restartAgent := func() {
		t.Helper()
		if err := st.agent.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	if err := st.c.SetMIG(true); err != nil {
		t.Fatal(err)
	}
	// The agent reads gres.conf at its start.
	restartAgent()
	setup := time.Since(t0)
	defer func() {
		st.waitIdle(t)
		t1 := time.Now()
		if err := st.c.SetMIG(false); err != nil {
			t.Fatal(err)
		}
		restartAgent()
		t.Logf("MIG layout on: %s; back to the plain layout: %s", setup.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	}()
	probe := &migProbe{counts: map[string]map[string]int{}}
	defer func() {
		var lines []string
		for path, c := range probe.counts {
			var parts []string
			for res, n := range c {
				parts = append(parts, fmt.Sprintf("%s=%d", res, n))
			}
			sort.Strings(parts)
			lines = append(lines, fmt.Sprintf("%-40s %s", strings.TrimPrefix(path, st.c.Root()+"/dev/"), strings.Join(parts, " ")))
		}
		sort.Strings(lines)
		t.Logf("opens per device over the MIG test:\n%s", strings.Join(lines, "\n"))
	}()
	srun := func(t *testing.T, args ...string) cluster.OpenReport {
		t.Helper()
		full := append(append([]string{}, args...), st.open, "-env")
		r := st.c.Run(st.ctx, user, "srun", append(full, st.migPaths()...)...)
		mustOK(t, r)
		rep := cluster.ParseOpen(r.Stdout)
		probe.add(rep)
		return rep
	}
	slice := cluster.MIGSlices[0].Profile

	t.Run("one slice", func(t *testing.T) {
		rep := srun(t, "--gres=gpu:"+slice+":1")
		held := gpusOf(t, rep, "SLURM_STEP_GPUS")
		if len(held) != 1 || held[0] == 0 {
			t.Fatalf("Slurm gave gres %v, want one slice", held)
		}
		st.expectMIG(t, rep, held)
		// Slurm hands out the global gres index; CUDA numbers only the
		// slices it can open, so the task sees 0.
		if rep.Env["SLURM_STEP_GPUS"] == "0" || rep.Env["CUDA_VISIBLE_DEVICES"] != "0" {
			t.Errorf("SLURM_STEP_GPUS=%q CUDA_VISIBLE_DEVICES=%q, want a slice index renumbered to 0", rep.Env["SLURM_STEP_GPUS"], rep.Env["CUDA_VISIBLE_DEVICES"])
		}

		job := jobOf(t, rep)
		other := cluster.MIGSlices[0]
		if held[0] == other.Index {
			other = cluster.MIGSlices[1]
		}
		recs := st.waitRecords(t, job, func(r []audit.Record) bool { return len(access(r, audit.DecisionDenied)) >= 7 })
		var foreign, admin *audit.Record
		for _, r := range access(recs, audit.DecisionDenied) {
			if r.Device.Major != st.c.CapsMajor() {
				continue
			}
			switch r.Device.Minor {
			case other.Caps[0]:
				foreign = &r
			case cluster.MIGAdminCaps[0]:
				admin = &r
			}
		}
		if foreign == nil || foreign.GPU == nil || foreign.GPU.Index != other.Index || foreign.GPU.MIG == nil ||
			foreign.GPU.MIG.Profile != slice || foreign.Device.Path != st.c.CapsPath(other.Caps[0]) || foreign.StepID != "0" {
			t.Errorf("denied open of slice %d's GPU instance node: %+v", other.Index, foreign)
		} else {
			t.Logf("record: %s (gpu %+v mig %+v, device %+v)", foreign.Message, foreign.GPU, foreign.GPU.MIG, foreign.Device)
		}
		if admin == nil || admin.GPU != nil || admin.Device.Path != "" {
			t.Errorf("denied open of the MIG config node: %+v", admin)
		}
		var own *audit.Record
		for _, r := range access(recs, audit.DecisionAllowed) {
			if r.Device.Major == st.c.CapsMajor() && r.Device.Minor == cluster.MIGSlices[held[0]-1].Caps[1] {
				own = &r
			}
		}
		if own == nil || own.GPU == nil || own.GPU.Index != held[0] {
			t.Errorf("allowed open of its own compute instance node: %+v", own)
		}
	})

	t.Run("whole GPU next to the split one", func(t *testing.T) {
		rep := srun(t, "--gres=gpu:a100:1")
		held := gpusOf(t, rep, "SLURM_STEP_GPUS")
		if !slices.Equal(held, []int{0}) {
			t.Fatalf("Slurm gave gres %v, want 0", held)
		}
		st.expectMIG(t, rep, held)
	})

	t.Run("two concurrent jobs on two slices of one GPU", func(t *testing.T) {
		dir := filepath.Join(st.c.Root(), "work", fmt.Sprintf("mig-meet-%d", time.Now().UnixNano()))
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, 0o777)
		reps := make([]cluster.OpenReport, 2)
		results := make([]cluster.Result, 2)
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				me, other := filepath.Join(dir, fmt.Sprint(i)), filepath.Join(dir, fmt.Sprint(1-i))
				script := fmt.Sprintf("touch %s; for n in $(seq 600); do [ -e %s ] && break; sleep 0.1; done; [ -e %s ] || echo OTHER-NEVER-RAN; exec %s -env %s",
					me, other, other, st.open, strings.Join(st.migPaths(), " "))
				results[i] = st.c.Run(st.ctx, user, "srun", "--gres=gpu:"+slice+":1", "sh", "-c", script)
				reps[i] = cluster.ParseOpen(results[i].Stdout)
			}()
		}
		wg.Wait()
		var all []int
		for i := range 2 {
			mustOK(t, results[i])
			if strings.Contains(results[i].Stdout, "OTHER-NEVER-RAN") {
				t.Fatalf("job %d did not overlap with the other", i)
			}
			probe.add(reps[i])
			g := gpusOf(t, reps[i], "SLURM_STEP_GPUS")
			st.expectMIG(t, reps[i], g)
			all = append(all, g...)
		}
		if slices.Sort(all); len(all) != 2 || all[0] == all[1] || all[0] == 0 {
			t.Errorf("the two jobs held %v, want two different slices", all)
		}
	})

	t.Run("batch job with two slices, a step narrowed to one", func(t *testing.T) {
		batch, step := st.batchAndStep(t, "mig", st.migPaths(), "gpu:"+slice+":2", "gpu:"+slice+":1")
		probe.add(batch)
		probe.add(step)
		jobGPUs := gpusOf(t, batch, "SLURM_JOB_GPUS")
		if len(jobGPUs) != 2 || slices.Contains(jobGPUs, 0) {
			t.Fatalf("batch step has SLURM_JOB_GPUS=%v, want two slices", jobGPUs)
		}
		st.expectMIG(t, batch, jobGPUs)
		stepGPUs := gpusOf(t, step, "SLURM_STEP_GPUS")
		if len(stepGPUs) != 1 || !slices.Contains(jobGPUs, stepGPUs[0]) {
			t.Fatalf("inner step has SLURM_STEP_GPUS=%v, job %v", stepGPUs, jobGPUs)
		}
		st.expectMIG(t, step, stepGPUs)
	})

	t.Run("with ConstrainDevices=yes", func(t *testing.T) {
		// Slurm's own filter allows the files gres.conf lists for the slice
		// and leaves the rest (config, monitor) alone; gpufence's denies
		// those too. Slurm then numbers locally itself.
		if err := st.c.RestartSlurmd(true); err != nil {
			t.Fatal(err)
		}
		defer func() {
			st.waitIdle(t)
			if err := st.c.RestartSlurmd(false); err != nil {
				t.Fatal(err)
			}
		}()
		rep := srun(t, "--gres=gpu:"+slice+":1")
		held := gpusOf(t, rep, "SLURM_STEP_GPUS")
		st.expectMIG(t, rep, held)
		if rep.Env["CUDA_VISIBLE_DEVICES"] != "0" {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q, want 0", rep.Env["CUDA_VISIBLE_DEVICES"])
		}
	})
}
