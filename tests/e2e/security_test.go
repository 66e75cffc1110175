// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"github.com/gpufence/gpufence/agent/gpulist"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/tests/cluster"
)

// allocated returns the GPU indices Slurm allocated to each running job on
// the node, read by the test from slurmctld's JSON (squeue --json, which
// every release prints): the expected values of the attack tests, never
// taken from anything the job user wrote.
func (st *suite) allocated(t *testing.T) map[uint32][]int {
	t.Helper()
	r := st.c.Run(st.ctx, "", "squeue", "--json")
	mustOK(t, r)
	var doc struct {
		Jobs []struct {
			JobID      uint32          `json:"job_id"`
			State      json.RawMessage `json:"job_state"`
			GresDetail []string        `json:"gres_detail"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
		t.Fatalf("squeue --json: %v", err)
	}
	idx := regexp.MustCompile(`^gpu(:[^:(]+)?:\d+\(IDX:([0-9,-]+)\)$`)
	out := map[uint32][]int{}
	for _, j := range doc.Jobs {
		if !strings.Contains(string(j.State), "RUNNING") {
			continue
		}
		out[j.JobID] = []int{}
		for _, g := range j.GresDetail {
			m := idx.FindStringSubmatch(g)
			if m == nil {
				t.Fatalf("job %d: gres_detail %q", j.JobID, g)
			}
			gpus, err := gpulist.ParseIDX(m[2])
			if err != nil {
				t.Fatal(err)
			}
			out[j.JobID] = append(out[j.JobID], gpus...)
		}
	}
	return out
}

// allocate makes an allocation with salloc --no-shell (extern step only,
// PrologFlags=Contain), as usr, and returns its id.
func (st *suite) allocate(t *testing.T, usr string, args ...string) uint32 {
	t.Helper()
	r := st.c.Run(st.ctx, usr, "salloc", append([]string{"--no-shell"}, args...)...)
	mustOK(t, r)
	m := regexp.MustCompile(`Granted job allocation (\d+)`).FindStringSubmatch(r.Stderr)
	if m == nil {
		t.Fatalf("no job id from salloc: %s", r)
	}
	id, _ := strconv.ParseUint(m[1], 10, 32)
	t.Cleanup(func() { st.c.Run(st.ctx, "", "scancel", m[1]) })
	return uint32(id)
}

// probeStep runs gf-open as the job user in a new step of job id.
func (st *suite) probeStep(t *testing.T, id uint32, env []string, args ...string) cluster.OpenReport {
	t.Helper()
	full := append([]string{fmt.Sprintf("--jobid=%d", id), "--overlap"}, args...)
	full = append(append(full, st.open, "-env"), st.paths()...)
	r := st.c.RunEnv(st.ctx, user, env, "srun", full...)
	mustOK(t, r)
	return cluster.ParseOpen(r.Stdout)
}

// kernelEntries reads the policies map of the filter on the scope: which
// GPU minors each cgroup id may open (nil for an allow-all entry).
func kernelEntries(t *testing.T, scope string) map[uint64][]int {
	t.Helper()
	fd, err := unix.Open(scope, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Programs {
		prog, err := ebpf.NewProgramFromID(p.ID)
		if err != nil {
			continue
		}
		info, err := prog.Info()
		prog.Close()
		if err != nil {
			continue
		}
		ids, _ := info.MapIDs()
		for _, mid := range ids {
			m, err := ebpf.NewMapFromID(mid)
			if err != nil {
				continue
			}
			mi, _ := m.Info()
			if mi.Name != "policies" {
				m.Close()
				continue
			}
			out := map[uint64][]int{}
			var k uint64
			v := make([]byte, m.ValueSize())
			it := m.Iterate()
			for it.Next(&k, &v) {
				// struct policy: cgroup id, flags, pad, minors[4], caps[].
				if binary.NativeEndian.Uint32(v[8:12])&1 != 0 {
					out[k] = nil
					continue
				}
				gpus := []int{}
				for w := range 4 {
					word := binary.NativeEndian.Uint64(v[16+8*w:])
					for b := range 64 {
						if word&(1<<b) != 0 {
							gpus = append(gpus, w*64+b)
						}
					}
				}
				out[k] = gpus
			}
			m.Close()
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
			return out
		}
	}
	t.Fatalf("no gpufence filter on %s", scope)
	return nil
}

// TestPrivilegedForgedFieldsLostRecord is the attack of issue 10, end to
// end on the real Slurm: a user whose job name, comment and working
// directory print fake per-node lines (naming every GPU) makes the agent
// lose the record of their allocation in each way a user or a crash can
// cause, and starts whole-job and numbered steps. No step opens, no audit
// record grants and no kernel entry holds a GPU Slurm did not give it, and
// the GPUs of another user's running job stay closed to it.
func TestPrivilegedForgedFieldsLostRecord(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	t0 := time.Now()
	defer func() { t.Logf("attack test took %v after the node was idle", time.Since(t0).Round(time.Millisecond)) }()
	host := st.c.Hostname()
	fake := fmt.Sprintf("     Nodes=%s CPU_IDs=0 Mem=0 GRES=gpu:4(IDX:0-3)", host)
	name := "x\n   JOB_GRES=gpu:4\n" + fake + "\n   MinCPUsNode=1"
	comment := "c\n" + fake
	dir := filepath.Join(st.c.Root(), "work", "x\n   "+strings.TrimSpace(fake))
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)

	// Another user's job (root's) holds three GPUs; the attacker's one.
	victim := st.allocate(t, "", "--gres=gpu:3", "-J", "victim")
	attacker := st.allocate(t, user, "--gres=gpu:1", "-J", name, "--comment", comment, "--chdir", dir)
	alloc := st.allocated(t)
	mine, theirs := alloc[attacker], alloc[victim]
	if len(mine) != 1 || len(theirs) != 3 || slices.ContainsFunc(mine, func(g int) bool { return slices.Contains(theirs, g) }) {
		t.Fatalf("Slurm allocated %v to the attacker and %v to the victim; want 1 and 3 disjoint GPUs", mine, theirs)
	}
	t.Logf("Slurm gave the attacker's job %d GPU %v and the victim's job %d GPUs %v", attacker, mine, victim, theirs)
	sc := st.c.Run(st.ctx, "", "scontrol", "show", "job", "-d", fmt.Sprint(attacker))
	if n := strings.Count(sc.Stdout, fmt.Sprintf("Nodes=%s ", host)); n < 3 {
		t.Fatalf("the forged fields do not show in scontrol's text (%d Nodes= lines):\n%s", n, sc.Stdout)
	}
	forgedEnv := []string{"SLURM_JOB_GPUS=0,1,2,3", "SLURM_STEP_GPUS=0,1,2,3", "CUDA_VISIBLE_DEVICES=0,1,2,3"}
	// slurmd refuses a credential for the same job and step made within
	// the same second as an earlier one ("Job credential replayed"), and
	// every interactive step has the same step id.
	var lastInteractive time.Time
	interactive := func(t *testing.T) cluster.OpenReport {
		t.Helper()
		time.Sleep(time.Until(lastInteractive.Add(1100 * time.Millisecond)))
		defer func() { lastInteractive = time.Now() }()
		return st.probeStep(t, attacker, forgedEnv, "--interactive")
	}
	attackerSteps := func(t *testing.T, want []int) {
		t.Helper()
		st.expectGPUs(t, interactive(t), want)
		st.expectGPUs(t, st.probeStep(t, attacker, forgedEnv), want)
	}
	recordOf := func(t *testing.T, match func(audit.Record) bool) *audit.Record {
		t.Helper()
		var found *audit.Record
		st.waitRecords(t, attacker, func(rs []audit.Record) bool {
			for _, r := range rs {
				if match(r) {
					found = &r
					return true
				}
			}
			return false
		})
		return found
	}

	t.Run("own steps cancelled, extern included", func(t *testing.T) {
		name, err := st.c.JobDirName(st.ctx, fmt.Sprint(attacker))
		if err != nil {
			t.Fatal(err)
		}
		jobDir := filepath.Join(st.c.ScopeDir(), name)
		if _, err := os.Stat(jobDir); err != nil {
			t.Fatalf("job cgroup before: %v", err)
		}
		r := st.c.Run(st.ctx, user, "scancel", fmt.Sprintf("%d.%d", attacker, policy.ExternStep))
		mustOK(t, r)
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := os.Stat(jobDir); err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the job's cgroup stayed after its extern step was cancelled")
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Two reconcile passes (reconcile_interval 2s) with a step-less job
		// whose cgroup is gone, and slurmctld saying it runs.
		time.Sleep(5 * time.Second)
		if a := st.allocated(t); !slices.Equal(a[attacker], mine) {
			t.Fatalf("the allocation did not live on: %v", a[attacker])
		}
		attackerSteps(t, mine)
	})

	t.Run("records lost with kill -9", func(t *testing.T) {
		st.killAgentLoseState(t, agentOpts{})
		attackerSteps(t, mine)
		// Recovered at the next step, or adopted at the agent's start when
		// the job's cgroup was there.
		r := recordOf(t, func(r audit.Record) bool {
			return (r.Event == audit.EventJobWithoutProlog && strings.Contains(r.Message, "recovered from slurmctld")) ||
				(r.Event == audit.EventJobAdopted && strings.Contains(r.Message, "confirmed"))
		})
		switch {
		case r == nil:
			t.Error("no record of the recovery from slurmctld")
		case !slices.Equal(r.GPUs, mine) || !strings.Contains(r.Message, "--json"):
			t.Errorf("recovery record %q names GPUs %v, want %v read from JSON", r.Message, r.GPUs, mine)
		}
	})

	t.Run("records lost, only text from slurmctld", func(t *testing.T) {
		// Clients that print no JSON, as a build without the JSON
		// serializer: the agent sees the real scontrol text with the
		// forged lines, finds it ambiguous and gives no GPU.
		bin := filepath.Join(st.c.Root(), "bin", "nojson")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, tool := range []string{"scontrol", "squeue"} {
			real, err := lookPath(st.c, tool)
			if err != nil {
				t.Fatal(err)
			}
			script := fmt.Sprintf("#!/bin/sh\nfor a; do [ \"$a\" = --json ] && { echo \"%s: unrecognized option '--json'\" >&2; exit 1; }; done\nexec %s \"$@\"\n", tool, real)
			if err := os.WriteFile(filepath.Join(bin, tool), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		st.killAgentLoseState(t, agentOpts{slurmBinDir: bin})
		// The whole-job step runs with no GPU; a numbered step that Slurm
		// gave a GPU is refused, with the reason.
		st.expectGPUs(t, interactive(t), nil)
		full := append([]string{fmt.Sprintf("--jobid=%d", attacker), "--overlap", st.open, "-env"}, st.paths()...)
		if r := st.c.RunEnv(st.ctx, user, forgedEnv, "srun", full...); r.Code == 0 || !strings.Contains(r.Stderr, "no trusted GPU list") {
			t.Errorf("GPU step of a job slurmctld could not vouch for: %s", r)
		}
		if r := recordOf(t, func(r audit.Record) bool {
			return (r.Event == audit.EventJobWithoutProlog || r.Event == audit.EventJobAdopted) && r.Severity == audit.SeverityError && strings.Contains(r.Message, "ambiguous")
		}); r == nil {
			t.Error("no error record saying slurmctld's answer was ambiguous")
		} else {
			t.Logf("audited: %s", r.Message)
		}
		st.killAgentLoseState(t, agentOpts{}) // the suite's usual agent again
	})

	// In every phase: no audit record granted the attacker more than
	// Slurm gave it, and no kernel entry holds a GPU for a cgroup that is
	// not the job's own.
	owner := map[uint64]uint32{}
	for _, f := range st.auditFiles {
		if _, err := os.Stat(f); err != nil {
			continue // an earlier test's audit file on a file system it removed
		}
		for _, r := range readAudit(t, f) {
			if r.Event != audit.EventPolicyApplied {
				continue
			}
			owner[r.CgroupID] = r.JobID
			if r.JobID == attacker {
				for _, g := range r.GPUs {
					if !slices.Contains(mine, g) {
						t.Errorf("audit: %s granted job %d GPU %d", f, attacker, g)
					}
				}
			}
		}
	}
	for id, gpus := range kernelEntries(t, st.c.ScopeDir()) {
		if gpus == nil {
			continue
		}
		want := alloc[owner[id]]
		for _, g := range gpus {
			if !slices.Contains(want, g) {
				t.Errorf("kernel entry of cgroup %d (job %d) holds GPU %d; that job was given %v", id, owner[id], g, want)
			}
		}
	}
}

// killAgentLoseState kills the agent with SIGKILL, removes its state file
// and its pinned records (the store: the filter's own pins stay, so the
// kernel keeps enforcing), and starts it again with o.
func (st *suite) killAgentLoseState(t *testing.T, o agentOpts) {
	t.Helper()
	st.killAgent(t)
	st.loseRecords(t, true)
	if err := st.startAgent(o); err != nil {
		t.Fatal(err)
	}
}

// killAgent kills the agent with SIGKILL and waits until it is gone.
func (st *suite) killAgent(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(st.agent.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; st.agent.Alive() && i < 50; i++ {
		time.Sleep(100 * time.Millisecond)
	}
}

// loseRecords removes the stopped agent's state file and, with store, its
// pinned records.
func (st *suite) loseRecords(t *testing.T, store bool) {
	t.Helper()
	files := []string{filepath.Join(st.c.Root(), "run", "agent-state.json")}
	if store {
		for _, pin := range []string{"store_jobs", "store_steps"} {
			files = append(files, filepath.Join(st.bpffs, "gpufence", pin))
		}
	}
	for _, f := range files {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
}

func lookPath(c *cluster.Cluster, tool string) (string, error) {
	// The cluster's release first: a source build's prefix, a Debian
	// root's wrappers (cluster.ToolPATH), as the agent finds them.
	for _, d := range strings.Split(c.ToolPATH(), ":") {
		p := filepath.Join(d, tool)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", tool)
}

// TestPrivilegedScopeRecreatedE2E: slurmd stopped with no job running, its
// empty scope removed, slurmd started again (what stopping the scope unit
// does on a systemd node). The next job is isolated, and the re-attach is
// in the audit trail.
func TestPrivilegedScopeRecreatedE2E(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	before, after, err := st.c.RecreateScope(st.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before == after {
		t.Fatalf("the scope kept its cgroup id %d", before)
	}
	start := time.Now()
	rep, r := st.srun(t, nil, "--gres=gpu:1")
	mustOK(t, r)
	got := st.allocatedOf(t, rep)
	st.expectGPUs(t, rep, got)
	var found *audit.Record
	for _, rec := range readAudit(t, st.auditFiles[len(st.auditFiles)-1]) {
		if rec.Event == audit.EventFilterReattached && rec.CgroupID == after {
			found = &rec
		}
	}
	if found == nil {
		t.Fatalf("no filter_reattached record for the new scope %d", after)
	}
	t.Logf("scope %d → %d; re-attach: %s; first step done %v after slurmd was back", before, after, found.Message, time.Since(start).Round(time.Millisecond))
	if rep2, r := st.srun(t, nil); r.Code == 0 {
		st.expectGPUs(t, rep2, nil)
	} else {
		t.Errorf("cpu-only step after the re-attach: %s", r)
	}
}

// allocatedOf is the GPUs of a finished srun job, as Slurm recorded them:
// the step's own SLURM_STEP_GPUS is only trusted here because no forged
// variable was set, and its count must match the --gres request.
func (st *suite) allocatedOf(t *testing.T, rep cluster.OpenReport) []int {
	t.Helper()
	g := gpusOf(t, rep, "SLURM_STEP_GPUS")
	if len(g) != 1 {
		t.Fatalf("Slurm gave %v, want 1 GPU", g)
	}
	return g
}

// heldJob runs launch (an srun or sbatch of the job named name) whose
// command first waits for a go-file, reads the job's GPUs from slurmctld
// while it waits, then lets it run: the expected GPUs of a job whose user
// forged every GPU variable come from Slurm's allocation, not from them.
func (st *suite) heldJob(t *testing.T, name string, launch func(goFile string) cluster.Result) ([]int, cluster.Result) {
	t.Helper()
	goFile := filepath.Join(st.c.Root(), "work", "go-"+name)
	done := make(chan cluster.Result, 1)
	go func() { done <- launch(goFile) }()
	defer os.Remove(goFile)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if id, ok := st.jobNamed(t, name); ok {
			if gpus, ok := st.allocated(t)[id]; ok {
				if err := os.WriteFile(goFile, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				return gpus, <-done
			}
		}
		select {
		case r := <-done:
			t.Fatalf("job %s ended before its allocation was read: %s", name, r)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s not running after 60s", name)
		}
	}
}

// jobNamed is the id of the running job with that (test-chosen) name.
func (st *suite) jobNamed(t *testing.T, name string) (uint32, bool) {
	t.Helper()
	r := st.c.Run(st.ctx, "", "squeue", "-h", "-t", "R", "-n", name, "-o", "%A")
	id, err := strconv.ParseUint(strings.TrimSpace(r.Stdout), 10, 32)
	return uint32(id), err == nil
}

func waitFor(goFile string) string {
	return fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done; ", goFile)
}

// forgedEnvChecks: every GPU variable set to all four GPUs before srun and
// sbatch, and again inside the batch script. Each step opens exactly what
// Slurm allocated, read from slurmctld while the job waits.
func forgedEnvChecks(t *testing.T, st *suite) {
	forged := []string{"SLURM_JOB_GPUS=0,1,2,3", "SLURM_STEP_GPUS=0,1,2,3", "CUDA_VISIBLE_DEVICES=0,1,2,3", "GPU_DEVICE_ORDINAL=0,1,2,3"}
	probe := st.open + " -env " + strings.Join(st.paths(), " ")
	n := time.Now().UnixNano()

	name := fmt.Sprintf("forged-srun-%d", n)
	want, r := st.heldJob(t, name, func(goFile string) cluster.Result {
		return st.c.RunEnv(st.ctx, user, forged, "srun", "-J", name, "--gres=gpu:1", "sh", "-c", waitFor(goFile)+"exec "+probe)
	})
	mustOK(t, r)
	if len(want) != 1 {
		t.Fatalf("Slurm allocated %v for --gres=gpu:1", want)
	}
	rep := cluster.ParseOpen(r.Stdout)
	st.expectGPUs(t, rep, want)
	if rep.Env["CUDA_VISIBLE_DEVICES"] != "0" {
		t.Errorf("CUDA_VISIBLE_DEVICES=%q, want 0", rep.Env["CUDA_VISIBLE_DEVICES"])
	}

	name = fmt.Sprintf("forged-cpu-%d", n)
	want, r = st.heldJob(t, name, func(goFile string) cluster.Result {
		return st.c.RunEnv(st.ctx, user, forged, "srun", "-J", name, "sh", "-c", waitFor(goFile)+"exec "+probe)
	})
	mustOK(t, r)
	if len(want) != 0 {
		t.Fatalf("Slurm allocated %v to a CPU-only job", want)
	}
	st.expectGPUs(t, cluster.ParseOpen(r.Stdout), nil)

	// Forged before sbatch (the batch step keeps a forged SLURM_STEP_GPUS)
	// and exported again inside the script before srun.
	name = fmt.Sprintf("forged-batch-%d", n)
	out := filepath.Join(st.c.Root(), "work", name)
	want, r = st.heldJob(t, name, func(goFile string) cluster.Result {
		script := fmt.Sprintf("%s%s > %s.batch\nexport %s\nsrun --gres=gpu:1 %s > %s.step\n",
			waitFor(goFile), probe, out, strings.Join(forged, " "), probe, out)
		f := out + ".sh"
		if err := os.WriteFile(f, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
			return cluster.Result{Stderr: err.Error(), Code: -1}
		}
		return st.c.RunEnv(st.ctx, user, forged, "sbatch", "--wait", "-J", name, "-o", out+".log", "--gres=gpu:1", f)
	})
	mustOK(t, r)
	if len(want) != 1 {
		t.Fatalf("Slurm allocated %v for --gres=gpu:1", want)
	}
	batch := st.readOut(t, out+".batch")
	if batch.Env["SLURM_STEP_GPUS"] == "0,1,2,3" {
		t.Logf("note: the batch step kept the forged SLURM_STEP_GPUS")
	}
	st.expectGPUs(t, batch, want)
	// The inner step asked for one GPU of a one-GPU job: that one.
	st.expectGPUs(t, st.readOut(t, out+".step"), want)
}
