// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/tests/cluster"
)

// gpuTable polls `gpufence status --json` until the running agent's GPU
// table is shown and done accepts it (the state file may lag an agent
// start by one write), and returns the last table seen (nil: none).
func (st *suite) gpuTable(t *testing.T, done func(*statefile.GPUTable) bool) *statefile.GPUTable {
	t.Helper()
	var last *statefile.GPUTable
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, _ := st.status(t)
		var status struct {
			GPUTable *statefile.GPUTable `json:"gpu_table"`
		}
		if err := json.Unmarshal([]byte(out), &status); err == nil && status.GPUTable != nil {
			last = status.GPUTable
			if done(last) {
				return last
			}
		}
		if time.Now().After(deadline) {
			return last
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestPrivilegedAutoDetect: on a node whose gres.conf says AutoDetect=nvml
// and has no File= line, slurmd finds the GPUs (a fake_gpus.conf beside
// slurm.conf, which every release from 22.05 to 26.05 reads instead of
// NVML) and numbers them by their links, not their minors: Slurm's GPU 0
// is /dev/nvidia2 (cluster.AutoDetectOrder, the recorded autodetect-links
// layout). The agent takes that table from `slurmd -G`, and a job opens
// exactly the devices of the indices slurmctld gave it (read from squeue
// --json, never from the job), in its batch step and in a step inside it;
// denials are audited under Slurm's index of the device. An agent whose
// `slurmd -G` cannot run fails closed: no GPU step starts.
func TestPrivilegedAutoDetect(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	order := cluster.AutoDetectOrder
	restartAgent := func(t *testing.T, o ...agentOpts) {
		t.Helper()
		if err := st.agent.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := st.startAgent(o...); err != nil {
			t.Fatal(err)
		}
	}
	// How the suite's own agent fares with slurmd -G on this host, before
	// the switch (its slurmd is found as on a node: no setting).
	if tb := st.gpuTable(t, func(*statefile.GPUTable) bool { return true }); tb != nil {
		t.Logf("the suite's agent, plain gres.conf: table from %s (%s); slurmd -G: %q", tb.Source, tb.Detail, tb.Slurmd)
	}
	wrapper, err := st.c.SlurmdWrapper()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := st.c.SetAutoDetect(true); err != nil {
		t.Fatal(err)
	}
	setup := time.Since(t0)
	defer func() {
		st.waitIdle(t)
		t1 := time.Now()
		if err := st.c.SetAutoDetect(false); err != nil {
			t.Fatal(err)
		}
		restartAgent(t)
		t.Logf("AutoDetect layout on: %s; back to the plain layout: %s", setup.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	}()
	gres, err := os.ReadFile(filepath.Join(st.c.Root(), "etc", "gres.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(gres), "File=") || !strings.Contains(string(gres), "AutoDetect=nvml") {
		t.Fatalf("gres.conf is not AutoDetect=nvml alone:\n%s", gres)
	}
	// The running slurmd took the fake GPUs.
	fake := filepath.Join(st.c.Root(), "etc", "fake_gpus.conf")
	if b, _ := os.ReadFile(st.c.LogPath("slurmd.log")); !strings.Contains(string(b), "fake system GPU data from "+fake) {
		t.Fatalf("slurmd.log does not say slurmd read %s:\n%s", fake, tailLines(string(b), 30))
	}

	t.Run("slurmd -G as found", func(t *testing.T) {
		// The node's slurmd as the agent finds it, run with the agent's
		// own environment. Where it cannot run here (the host's cgroup
		// hybrid mode without the harness's shim, another release's
		// binary), the table must be untrusted and no GPU step start.
		logOff := fileSize(st.c.LogPath("slurmd.log"))
		restartAgent(t)
		tb := st.gpuTable(t, func(tb *statefile.GPUTable) bool { return tb.AutoDetect == "nvml" })
		if tb == nil || tb.AutoDetect != "nvml" {
			t.Fatalf("gpufence status shows no table read from the AutoDetect gres.conf: %+v", tb)
		}
		t.Logf("table from %s, slurmd -G %q: %s; untrusted: %q", tb.Source, tb.Slurmd, tb.Detail, tb.Untrusted)
		rep, r := st.srun(t, nil, "--gres=gpu:1")
		if tb.Untrusted == "" {
			// slurmd -G worked without help: it must be slurmd's table.
			st.checkAutoDetectTable(t, tb, "")
			mustOK(t, r)
			return
		}
		// slurmd -G logs why it stopped to SlurmdLogFile, not stderr.
		for _, l := range strings.Split(logSince(st.c.LogPath("slurmd.log"), logOff), "\n") {
			if strings.Contains(l, "fatal: ") {
				t.Logf("slurmd.log while the agent ran slurmd -G: %s", l)
			}
		}
		if tb.Source != "gres.conf" || !strings.Contains(tb.Detail, "slurmd -G failed") {
			t.Errorf("untrusted table from %s (%s), want gres.conf after slurmd -G failed", tb.Source, tb.Detail)
		}
		if r.Code == 0 || len(rep.Open) != 0 || !strings.Contains(r.Stderr, "gpufence agent refused") {
			t.Errorf("a GPU step ran with an untrusted AutoDetect table (the agent must refuse it): %s", r)
		}
		t.Logf("the GPU step was refused: %s", firstLine(r.Stderr, "gpufence agent refused"))
		// CPU-only steps still run.
		rep, r = st.srun(t, nil)
		mustOK(t, r)
		st.expectGPUs(t, rep, nil)
	})

	// The cluster's own slurmd, as the harness runs it: what a node's
	// slurmd -G prints.
	restartAgent(t, agentOpts{yaml: fmt.Sprintf("slurmd: %s\n", wrapper)})
	tb := st.gpuTable(t, func(tb *statefile.GPUTable) bool { return strings.HasPrefix(tb.Slurmd, wrapper+" ") })
	if tb == nil {
		t.Fatal("gpufence status shows no GPU table")
	}
	if !st.checkAutoDetectTable(t, tb, wrapper) {
		alog, _ := os.ReadFile(st.agent.Log)
		t.Fatalf("the agent's GPU table is not slurmd's AutoDetect one:\n%s", tailLines(string(alog), 30))
	}
	t.Logf("table from %s: %s", tb.Slurmd, tb.Detail)

	// Two jobs at once, gpu:1 then gpu:2; each waits until the test has
	// read its indices from slurmctld, then probes every device in its
	// batch step and in a step of its own GPUs.
	type job struct {
		n              int
		id, out        string
		marker, goFile string
	}
	var jobs []*job
	for _, n := range []int{1, 2} {
		j := &job{n: n}
		base := filepath.Join(st.c.Root(), "work", fmt.Sprintf("autodetect-%d-%d", n, time.Now().UnixNano()))
		j.out, j.marker, j.goFile = base, base+".running", base+".go"
		probe := st.open + " -env " + strings.Join(st.paths(), " ")
		script := fmt.Sprintf("#!/bin/sh\ntouch %s\ni=0\nwhile [ ! -e %s ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done\n%s > %s.batch\nsrun --gres=gpu:%d %s > %s.step\n",
			j.marker, j.goFile, probe, base, n, probe, base)
		f := base + ".sh"
		if err := os.WriteFile(f, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		r := st.c.Run(st.ctx, user, "sbatch", "--parsable", fmt.Sprintf("--gres=gpu:%d", n), "-o", base+".log", f)
		mustOK(t, r)
		j.id = strings.TrimSpace(strings.Split(r.Stdout, ";")[0])
		t.Cleanup(func() { st.c.Run(st.ctx, "", "scancel", j.id); st.c.WaitJob(st.ctx, j.id) })
		jobs = append(jobs, j)
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, j := range jobs {
		for {
			if _, err := os.Stat(j.marker); err == nil {
				break
			}
			if time.Now().After(deadline) {
				q := st.c.Run(st.ctx, "", "squeue")
				t.Fatalf("job %s (gpu:%d) did not start:\n%s", j.id, j.n, q.Stdout)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	alloc := st.allocated(t)
	held := map[string][]int{}
	for _, j := range jobs {
		var id uint32
		fmt.Sscan(j.id, &id)
		held[j.id] = alloc[id]
		if len(held[j.id]) != j.n {
			t.Fatalf("job %s: slurmctld gave GPUs %v, want %d", j.id, held[j.id], j.n)
		}
	}
	// The first job on the idle node gets Slurm's GPU 0: nvidia2 here.
	if !slices.Equal(held[jobs[0].id], []int{0}) {
		t.Errorf("the gpu:1 job got GPU %v from slurmctld, want 0", held[jobs[0].id])
	}
	for _, j := range jobs {
		if err := os.WriteFile(j.goFile, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, j := range jobs {
		state, err := st.c.WaitJob(st.ctx, j.id)
		if err != nil || state != "COMPLETED" {
			log, _ := os.ReadFile(j.out + ".log")
			t.Fatalf("job %s: state %q, %v\n%s", j.id, state, err, log)
		}
		var minors []int
		for _, i := range held[j.id] {
			minors = append(minors, order[i])
		}
		t.Logf("job %s (gpu:%d): Slurm's GPUs %v are nvidia%v", j.id, j.n, held[j.id], minors)
		for _, step := range []string{"batch", "step"} {
			rep := st.readOut(t, j.out+"."+step)
			if got := gpusOf(t, rep, "SLURM_JOB_GPUS"); !slices.Equal(got, held[j.id]) {
				t.Errorf("job %s %s: SLURM_JOB_GPUS %v, slurmctld says %v", j.id, step, got, held[j.id])
			}
			t.Run(fmt.Sprintf("gpu:%d %s", j.n, step), func(t *testing.T) { st.expectGPUs(t, rep, minors) })
		}
		// Denials are audited under Slurm's index of the device opened.
		var id uint32
		fmt.Sscan(j.id, &id)
		recs := st.waitRecords(t, id, func(rs []audit.Record) bool {
			seen := map[int]bool{}
			for _, r := range access(rs, audit.DecisionDenied) {
				if r.GPU != nil {
					seen[r.GPU.Index] = true
				}
			}
			return len(seen) == 4-j.n
		})
		denied := map[int]bool{}
		for _, r := range access(recs, audit.DecisionDenied) {
			if r.GPU == nil || r.Device == nil || r.GPU.Index < 0 || r.GPU.Index >= len(order) ||
				r.Device.Minor != uint32(order[r.GPU.Index]) || r.Device.Path != st.c.DevPath(order[r.GPU.Index]) {
				t.Errorf("job %s: denied record not attributed by the AutoDetect table (GPU i is nvidia%v[i]): %+v %+v %+v", j.id, order, r, r.GPU, r.Device)
				continue
			}
			if slices.Contains(held[j.id], r.GPU.Index) {
				t.Errorf("job %s: denied its own GPU %d: %+v", j.id, r.GPU.Index, r.Device)
			}
			denied[r.GPU.Index] = true
		}
		if len(denied) != 4-j.n {
			t.Errorf("job %s holding %v: denied records for GPUs %v, want every other one", j.id, held[j.id], denied)
		}
	}
	t.Run("CPU only", func(t *testing.T) {
		rep, r := st.srun(t, nil)
		mustOK(t, r)
		st.expectGPUs(t, rep, nil)
	})
}

// checkAutoDetectTable checks the agent's table against the AutoDetect
// layout: slurmd's, in cluster.AutoDetectOrder, trusted; slurmd is the
// binary it must have run ("" any). It reports whether the table is right.
func (st *suite) checkAutoDetectTable(t *testing.T, tb *statefile.GPUTable, slurmd string) bool {
	t.Helper()
	ok := true
	errorf := func(format string, a ...any) { t.Helper(); t.Errorf(format, a...); ok = false }
	if tb.Source != "slurmd -G" || tb.AutoDetect != "nvml" || tb.Untrusted != "" {
		errorf("table from %q, AutoDetect=%q, untrusted %q (%s); want slurmd -G, nvml, trusted", tb.Source, tb.AutoDetect, tb.Untrusted, tb.Detail)
	}
	if want := fmt.Sprintf("%s -G -L /dev/null -f %s -N %s", slurmd, st.c.SlurmConf(), st.c.Hostname()); slurmd != "" && tb.Slurmd != want {
		errorf("slurmd -G command %q, want %q", tb.Slurmd, want)
	}
	var got, want []string
	for _, g := range tb.GPUs {
		got = append(got, fmt.Sprintf("%d:%s", g.Index, strings.Join(g.Files, ",")))
	}
	for i, m := range cluster.AutoDetectOrder {
		want = append(want, fmt.Sprintf("%d:%s", i, st.c.DevPath(m)))
	}
	if !slices.Equal(got, want) {
		errorf("GPU table %v, want %v", got, want)
	}
	return ok
}
