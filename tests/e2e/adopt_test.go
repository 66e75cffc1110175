// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
)

// probeLine is one "TIME PATH RESULT" line of gf-open -stamp.
type probeLine struct {
	at     time.Time
	path   string
	result string
}

func readProbe(t *testing.T, path string) []probeLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []probeLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 {
			continue // a line cut by the job's end
		}
		ns, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil {
			t.Fatalf("%s: %q", path, sc.Text())
		}
		out = append(out, probeLine{time.Unix(0, ns), fs[1], fs[2]})
	}
	return out
}

// ctldWrapper makes scontrol and squeue for the agent that fail, as an
// unreachable slurmctld does, while the file it returns exists.
func (st *suite) ctldWrapper(t *testing.T) (dir, down string) {
	t.Helper()
	dir = filepath.Join(st.c.Root(), "ctld-wrapper")
	down = filepath.Join(dir, "down")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"scontrol", "squeue"} {
		real, err := lookPath(st.c, tool)
		if err != nil {
			t.Fatal(err)
		}
		script := fmt.Sprintf("#!/bin/sh\nif [ -e %s ]; then echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1; fi\nexec %s \"$@\"\n", down, real)
		if err := os.WriteFile(filepath.Join(dir, tool), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir, down
}

// TestPrivilegedAdoptRunningJobsE2E: gpufence put on a busy node. Two GPU
// jobs start with no gpufence (empty plugstack, no agent) and probe every
// GPU until told to stop. The agent is started and the plugstack line
// enabled with a slurmd restart while they run: from then on each opens its
// own GPU and no other, and never sees an EPERM on its own. Then the agent loses everything (kill -9, pins and state gone)
// while slurmctld cannot be asked: the jobs are adopted unconfirmed, which
// by default (adopt_unconfirmed: deny) gives them no GPU, their own
// included; once slurmctld answers again they are held to their GPUs.
// A new job after them is isolated. The expected GPUs come from slurmctld's JSON, never from the jobs.
func TestPrivilegedAdoptRunningJobsE2E(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	pins := filepath.Join(st.bpffs, "gpufence")
	stateFile := filepath.Join(st.c.Root(), "run", "agent-state.json")
	loseAll := func() {
		t.Helper()
		if err := syscall.Kill(st.agent.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for i := 0; st.agent.Alive() && i < 50; i++ {
			time.Sleep(100 * time.Millisecond)
		}
		// Dropping the pins detaches the filter: the node has no gpufence.
		if err := os.RemoveAll(pins); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(stateFile); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	// Declared here so that the restore below can end the jobs first: a
	// failure midway must not leave them holding the node's two CPUs.
	work := filepath.Join(st.c.Root(), "work")
	stop := filepath.Join(work, fmt.Sprintf("adopt-stop-%d", time.Now().UnixNano()))
	var ids []string
	defer func() {
		os.WriteFile(stop, nil, 0o644)
		if len(ids) > 0 {
			st.c.Run(st.ctx, "", "scancel", ids...)
		}
		st.waitIdle(t)
		if st.agent.Alive() {
			st.agent.Stop()
		}
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
		if err := st.c.WritePlugstack([]string{st.plugstackLine()}); err != nil {
			t.Fatal(err)
		}
		if err := st.c.RestartSlurmd(false); err != nil {
			t.Fatal(err)
		}
	}()

	// No gpufence on the node.
	loseAll()
	if err := st.c.WritePlugstack(nil); err != nil {
		t.Fatal(err)
	}
	if err := st.c.RestartSlurmd(false); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\n%s -stamp -until %s -sleep 10ms %s > %s/adopt-probe.$SLURM_JOB_ID\nsrun --gres=gpu:1 %s -env %s > %s/adopt-step.$SLURM_JOB_ID\n",
		st.open, stop, strings.Join(st.c.DevPaths(), " "), work, st.open, strings.Join(st.paths(), " "), work)
	sh := filepath.Join(work, "adopt.sh")
	if err := os.WriteFile(sh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		id, err := st.c.Sbatch(st.ctx, user, "--gres=gpu:1", "-o", filepath.Join(work, "adopt-%j.out"), sh)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		t.Cleanup(func() { st.c.Run(st.ctx, "", "scancel", id) })
	}
	for _, id := range ids {
		p := filepath.Join(work, "adopt-probe."+id)
		deadline := time.Now().Add(30 * time.Second)
		for {
			if b, _ := os.ReadFile(p); len(b) > 2000 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s never probed (%s)", id, p)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	alloc := st.allocated(t)
	own := map[string][]int{}
	for _, id := range ids {
		n, _ := strconv.ParseUint(id, 10, 32)
		if own[id] = alloc[uint32(n)]; len(own[id]) != 1 {
			t.Fatalf("slurmctld says job %s holds %v, want one GPU", id, own[id])
		}
	}

	// Install while they run: the agent, then the plugstack line and one
	// slurmd restart (running jobs survive it).
	t1 := time.Now()
	if err := st.startAgent(); err != nil {
		t.Fatal(err)
	}
	t1ready := time.Now()
	auditInstall := st.auditFiles[len(st.auditFiles)-1]
	if err := st.c.WritePlugstack([]string{st.plugstackLine()}); err != nil {
		t.Fatal(err)
	}
	if err := st.c.RestartSlurmdBusy(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)

	// Everything lost, and slurmctld unreachable for the agent.
	wrap, down := st.ctldWrapper(t)
	if err := os.WriteFile(down, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	loseAll()
	if err := st.startAgent(agentOpts{slurmBinDir: wrap}); err != nil {
		t.Fatal(err)
	}
	t2ready := time.Now()
	auditLost := st.auditFiles[len(st.auditFiles)-1]
	time.Sleep(1500 * time.Millisecond)
	t3 := time.Now()
	if err := os.Remove(down); err != nil {
		t.Fatal(err)
	}
	// The reconcile pass (2 s here) asks again once recovery's pause (5 s)
	// is over.
	confirmed := func(recs []audit.Record, id string) bool {
		for _, r := range recs {
			if r.Event == audit.EventJobAdopted && fmt.Sprint(r.JobID) == id && r.Severity == audit.SeverityInfo && strings.Contains(r.Message, "now confirmed") {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		recs := readAudit(t, auditLost)
		if confirmed(recs, ids[0]) && confirmed(recs, ids[1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slurmctld back, the jobs never confirmed:\n%v", recs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t3ready := time.Now()
	time.Sleep(time.Second)
	t4 := time.Now()
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		state, err := st.c.WaitJob(st.ctx, id)
		log, _ := os.ReadFile(filepath.Join(work, "adopt-"+id+".out"))
		if err != nil || state != "COMPLETED" {
			t.Fatalf("job %s: %q %v\n%s", id, state, err, log)
		}
	}
	// A new job (the node's two CPUs were the probing jobs' until now).
	rep, r := st.srun(t, nil, "--gres=gpu:1")
	mustOK(t, r)
	st.expectGPUs(t, rep, st.allocatedOf(t, rep))
	t.Logf("install: agent ready %v after start; lost state: ready %v; confirmed %v after slurmctld was back",
		t1ready.Sub(t1).Round(time.Millisecond), t2ready.Sub(t2).Round(time.Millisecond), t3ready.Sub(t3).Round(time.Millisecond))

	type window struct {
		name     string
		from, to time.Time
		foreign  string // what another job's GPU gives
		own      string // what its own gives
	}
	windows := []window{
		{"before gpufence", time.Time{}, t1, "ENXIO", "ENXIO"},
		{"installed, confirmed", t1ready, t2, "EPERM", "ENXIO"},
		{"state lost, slurmctld down: deny", t2ready, t3, "EPERM", "EPERM"},
		{"slurmctld back, confirmed", t3ready, t4, "EPERM", "ENXIO"},
	}
	for _, id := range ids {
		lines := readProbe(t, filepath.Join(work, "adopt-probe."+id))
		counts := make([]map[string]int, len(windows))
		for i := range counts {
			counts[i] = map[string]int{}
		}
		var bad []string
		for _, l := range lines {
			gpu := slices.Index(st.c.DevPaths(), l.path)
			mine := slices.Contains(own[id], gpu)
			// Between the windows (the agent starting or asking) its own
			// GPU may only be denied while the state is lost.
			if mine && l.result != "ENXIO" && (l.at.Before(t2) || !l.at.Before(t3ready)) {
				bad = append(bad, fmt.Sprintf("its own GPU %d gave %s at %s", gpu, l.result, l.at.Format(time.StampMicro)))
			}
			for i, w := range windows {
				if l.at.Before(w.from) || !l.at.Before(w.to) {
					continue
				}
				key := "own " + l.result
				if mine && l.result != w.own {
					bad = append(bad, fmt.Sprintf("%s: its own GPU %d gave %s at %s, want %s", w.name, gpu, l.result, l.at.Format(time.StampMicro), w.own))
				}
				if !mine {
					key = "foreign " + l.result
					if l.result != w.foreign {
						bad = append(bad, fmt.Sprintf("%s: GPU %d gave %s at %s, want %s", w.name, gpu, l.result, l.at.Format(time.StampMicro), w.foreign))
					}
				}
				counts[i][key]++
			}
		}
		if len(bad) > 0 {
			t.Errorf("job %s: %d wrong opens, first: %s", id, len(bad), strings.Join(bad[:min(len(bad), 5)], "; "))
		}
		for i, w := range windows {
			if counts[i]["own "+w.own] == 0 || counts[i]["foreign "+w.foreign] == 0 {
				t.Errorf("job %s, %s: too few probes %v", id, w.name, counts[i])
			}
			t.Logf("job %s (GPU %v), %s: %v", id, own[id], w.name, counts[i])
		}
		st.expectGPUs(t, st.readOut(t, filepath.Join(work, "adopt-step."+id)), own[id])
	}

	// The audit trail says what happened to each job.
	for _, c := range []struct {
		file  string
		check func(audit.Record, []int) bool
		what  string
	}{
		{auditInstall, func(r audit.Record, g []int) bool {
			return r.Severity == audit.SeverityInfo && slices.Equal(r.GPUs, g)
		}, "confirmed with its GPUs"},
		{auditLost, func(r audit.Record, _ []int) bool {
			return r.Severity == audit.SeverityWarning && r.PolicyMode == audit.ModeEnforce && len(r.GPUs) == 0
		}, "unconfirmed, denied"},
	} {
		recs := readAudit(t, c.file)
		for _, id := range ids {
			var found, ownDenied bool
			for _, r := range recs {
				if fmt.Sprint(r.JobID) != id {
					continue
				}
				if r.Event == audit.EventJobAdopted && c.check(r, own[id]) {
					found = true
				}
				if r.Event == audit.EventGPUAccess && r.Decision == audit.DecisionDenied && r.GPU != nil && slices.Contains(own[id], r.GPU.Index) {
					ownDenied = true
				}
			}
			if !found {
				t.Errorf("%s: no job_adopted record of job %s %s", filepath.Base(c.file), id, c.what)
			}
			if c.file == auditLost && !ownDenied {
				t.Errorf("%s: no denied record of job %s opening its own GPU while it was unconfirmed", filepath.Base(c.file), id)
			}
		}
	}
}
