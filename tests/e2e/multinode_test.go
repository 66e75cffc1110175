// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/gpulist"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/tests/cluster"
)

// mnSuite is a two-node cluster (two slurmd on this host, tests/cluster
// multinode.go) with one agent per node, as on a real cluster: each node's
// agent has its own socket, pins, state and audit file and node_name, and
// each node's GPU 0 is another device minor (n1: 0-3, n2: 4-7).
type mnSuite struct {
	c        *cluster.Cluster
	gpufence string
	open     string // gf-open in the cluster's root
	probe    string // bin/mn-probe: gf-open's report into a file, then a hold
	work     string // where the probes write their reports (<Root>/work/mn)
	ctl      string // scripts, job output, markers (<Root>/work/mn-ctl)
	bpffs    string
	mounted  bool
	agents   map[string]*cluster.Process
	ctx      context.Context
	table    []string // shape × node → opened GPUs, for the log
}

const mnGPUs = 4

// standAlone stops the package's shared single-node cluster when an
// earlier test started it (the cluster lock admits one cluster per host),
// after its whole-suite checks; the next test that needs it starts a new
// one.
func standAlone(t *testing.T) {
	t.Helper()
	if s == nil {
		return
	}
	if err := s.finalChecks(); err != nil {
		t.Errorf("final checks of the shared cluster before it stops: %v", err)
	}
	if err := s.stop(); err != nil {
		t.Errorf("stop the shared cluster: %v", err)
	}
	s, setupErr, once = nil, nil, sync.Once{}
}

func startMultiNode(t *testing.T) *mnSuite {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("end-to-end tests need root: they start munged, slurmctld, two slurmd and two agents")
	}
	if testing.Short() {
		t.Skip("end-to-end tests start a real Slurm cluster; skipped with -short")
	}
	standAlone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	if setup == nil {
		var err error
		if setup, err = cluster.Ensure(ctx, t.Logf); err != nil {
			t.Fatal(err)
		}
	}
	gf, treePlugin, err := binaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	// Heterogeneous jobs start from the backfill scheduler only, every
	// 30 s by default: every second here.
	c, err := cluster.Start(ctx, cluster.Options{Nodes: 2, GPUs: mnGPUs, Logf: t.Logf, Keep: os.Getenv("GPUFENCE_E2E_KEEP") != "",
		ExtraSlurmConf: []string{"SchedulerParameters=bf_interval=1"}})
	if err != nil {
		t.Fatal(err)
	}
	m := &mnSuite{c: c, gpufence: gf, agents: map[string]*cluster.Process{}, ctx: ctx}
	t.Cleanup(func() {
		if err := m.stop(); err != nil {
			t.Errorf("stop the two-node cluster: %v", err)
		}
	})
	t.Logf("Slurm %s (%s, %s), nodes %v, up in %s", c.SlurmVersion(), c.Selection(), c.Kind(), c.Nodes(), time.Since(t0).Round(time.Millisecond))
	plugin, err := pluginFor(ctx, c, treePlugin)
	if err != nil {
		t.Fatal(err)
	}
	if m.open, err = c.BuildTool(ctx, "gf-open"); err != nil {
		t.Fatal(err)
	}
	m.work = filepath.Join(c.Root(), "work", "mn")
	m.ctl = filepath.Join(c.Root(), "work", "mn-ctl")
	for _, d := range []string{m.work, m.ctl} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o777) // the job user writes here
	}
	if err := m.writeProbe(); err != nil {
		t.Fatal(err)
	}
	m.bpffs = filepath.Join(c.Root(), "bpffs")
	if err := os.MkdirAll(m.bpffs, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "bpf", "gpufence-e2e-mn", m.bpffs).CombinedOutput(); err != nil {
		t.Fatalf("mount bpffs: %v %s", err, out)
	}
	m.mounted = true
	// One plugstack.conf for both nodes: the socket= folder is each
	// node's own in its slurmd's mount namespace.
	line := []string{"required", plugin, "socket=" + filepath.Join(c.AgentSocketDir(), "agent.sock"), "timeout=5"}
	if err := c.WritePlugstack([]string{strings.Join(line, " ")}); err != nil {
		t.Fatal(err)
	}
	// slurmd runs job_prolog only for plugins present when it started.
	if err := c.RestartSlurmd(false); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		if err := m.startAgent(n, n); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// startAgent starts node's agent with node_name name (the node's own but
// in the test that proves the check can fail).
func (m *mnSuite) startAgent(node, name string) error {
	root := m.c.Root()
	cfg := filepath.Join(root, "etc", "agent-"+node+".yaml")
	yaml := fmt.Sprintf("node_name: %s\naudit:\n  file: %s\n  journald: \"off\"\n  flush_interval: 500ms\npin_dir: %s\nstate_file: %s\nfailopen_spool: %s\nreconcile_interval: 2s\nnvidia_caps_major: %d\nmetrics:\n  listen: \"\"\n",
		name, filepath.Join(root, "logs", "audit-"+node+".jsonl"), filepath.Join(m.bpffs, node),
		filepath.Join(root, "run", "agent-state-"+node+".json"), filepath.Join(root, "run", "failopen-"+node, "failopen.jsonl"), m.c.CapsMajor())
	if p := m.c.SlurmdPath(); p != "" {
		yaml += fmt.Sprintf("slurmd: %s\n", p)
	}
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		return err
	}
	sock := filepath.Join(m.c.NodeSocketDir(node), "agent.sock")
	p, err := m.c.StartNodeAgent(m.ctx, node, m.gpufence, "agent", "--config", cfg, "--socket", sock, "--slurm-conf", m.c.SlurmConf(), "--log-level", "debug")
	if err != nil {
		return err
	}
	m.agents[node] = p
	return cluster.WaitListener(sock, p.PID, 20*time.Second)
}

func (m *mnSuite) stop() error {
	var errs []error
	for _, p := range m.agents {
		errs = append(errs, p.Stop())
	}
	if m.mounted {
		if out, err := exec.Command("umount", m.bpffs).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("umount %s: %v %s", m.bpffs, err, out))
		}
	}
	return errors.Join(append(errs, m.c.Stop())...)
}

// writeProbe writes bin/mn-probe TAG [HOLD]: gf-open's report on every
// node's GPUs (all minors), nvidiactl and nvidia-uvm into work/mn/TAG.<pid>
// (renamed in place once complete), then, with HOLD, waiting until the
// file HOLD exists, so that the test reads slurmctld's allocation while
// the job runs.
func (m *mnSuite) writeProbe() error {
	m.probe = filepath.Join(m.c.Root(), "bin", "mn-probe")
	script := fmt.Sprintf("#!/bin/sh\nout=%s/$1.$$\n%s -env %s > $out.tmp && mv $out.tmp $out\n[ -z \"$2\" ] || while [ ! -e \"$2\" ]; do sleep 0.1; done\n",
		m.work, m.open, strings.Join(m.paths(), " "))
	return os.WriteFile(m.probe, []byte(script), 0o755)
}

// paths are every node's GPU device nodes, nvidiactl and nvidia-uvm.
func (m *mnSuite) paths() []string {
	return append(m.c.AllDevPaths(), m.c.CtlPath(), filepath.Join(m.c.Root(), "dev", "nvidia-uvm"))
}

// task is one probe's report and where the kernel says it ran: the node
// (its scope), the job and the step, from its cgroup.
type task struct {
	node, job, step string
	rep             cluster.OpenReport
	file            string
}

var taskCgroup = regexp.MustCompile(`/(n\d+)_slurmstepd\.scope/job_(\d+)/step_([^/]+)/`)

// reports reads the complete reports of tag; want is how many there must be.
func (m *mnSuite) reports(t *testing.T, tag string, want int) []task {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(m.work, tag+".*"))
	var out []task
	for _, f := range files {
		if strings.HasSuffix(f, ".tmp") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rep := cluster.ParseOpen(string(b))
		mm := taskCgroup.FindStringSubmatch(rep.Cgroup + "/")
		if mm == nil {
			t.Fatalf("%s: cgroup %q is in no node's job step:\n%s", f, rep.Cgroup, b)
		}
		out = append(out, task{node: mm[1], job: mm[2], step: mm[3], rep: rep, file: f})
	}
	if len(out) != want {
		t.Fatalf("%s: %d reports, want %d: %v", tag, len(out), want, files)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].job+out[i].step+out[i].node < out[j].job+out[j].step+out[j].node
	})
	return out
}

// waitFiles waits until n complete files match glob.
func (m *mnSuite) waitFiles(t *testing.T, glob string, n int, what func() string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		files, _ := filepath.Glob(glob)
		files = slices.DeleteFunc(files, func(f string) bool { return strings.HasSuffix(f, ".tmp") })
		if len(files) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d files %s after 90 s\n%s", len(files), n, glob, what())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// allocation is slurmctld's per-node GPU indices of a job's records (every
// component of a heterogeneous job, every record scontrol prints): job id →
// node → indices in that node's gres.conf order.
type allocation map[string]map[string][]int

// ctldText keeps what scontrol printed for each job, for failure messages.
var ctldText = map[string]string{}

var (
	ctldJobID    = regexp.MustCompile(`(?m)^JobId=(\d+) `)
	ctldNodeLine = regexp.MustCompile(`(?m)^\s+Nodes=(\S+) CPU_IDs=\S+ Mem=\S+(?: GRES=(\S*))?`)
)

// allocationOf asks slurmctld (scontrol -d show job) for each job's GPUs
// on each of its nodes.
func (m *mnSuite) allocationOf(t *testing.T, jobs ...string) allocation {
	t.Helper()
	a := allocation{}
	for _, id := range jobs {
		r := m.c.Run(m.ctx, "", "scontrol", "-d", "show", "job", id)
		mustOK(t, r)
		for _, rec := range strings.Split(r.Stdout, "\n\n") {
			jm := ctldJobID.FindStringSubmatch(rec)
			if jm == nil {
				continue
			}
			per := map[string][]int{}
			for _, nm := range ctldNodeLine.FindAllStringSubmatch(rec, -1) {
				nodes, err := slurm.ExpandHostlist(nm[1])
				if err != nil {
					t.Fatalf("scontrol node list %q: %v", nm[1], err)
				}
				var idx []int
				if _, rest, ok := strings.Cut(nm[2], "(IDX:"); ok {
					list, _, _ := strings.Cut(rest, ")")
					if idx, err = gpulist.ParseIDX(list); err != nil {
						t.Fatalf("scontrol GRES %q: %v", nm[2], err)
					}
				}
				for _, n := range nodes {
					per[n] = append(per[n], idx...)
				}
			}
			if len(per) == 0 {
				t.Fatalf("scontrol shows no node of job %s:\n%s", jm[1], rec)
			}
			a[jm[1]] = per
			ctldText[jm[1]] = rec
		}
	}
	return a
}

func (a allocation) jobs() []string {
	var ids []string
	for id := range a {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// opened lists the node's GPU indices a report opened (ENXIO), and fails
// on any GPU of another node that opened, or any result but ENXIO and EPERM.
func (m *mnSuite) opened(t *testing.T, tk task) []int {
	t.Helper()
	var got []int
	first := 0
	for _, n := range m.c.Nodes() {
		if n == tk.node {
			break
		}
		first += mnGPUs
	}
	for minor, p := range m.c.AllDevPaths() {
		switch res := tk.rep.Open[p]; {
		case res == "EPERM":
		case res == "ENXIO" && minor >= first && minor < first+mnGPUs:
			got = append(got, minor-first)
		case res == "ENXIO":
			t.Errorf("%s (%s job %s step %s) opened nvidia%d, another node's GPU", tk.file, tk.node, tk.job, tk.step, minor)
		default:
			t.Errorf("%s (%s job %s step %s): nvidia%d %q, want ENXIO or EPERM", tk.file, tk.node, tk.job, tk.step, minor, res)
		}
	}
	for _, p := range m.paths()[len(m.c.AllDevPaths()):] {
		if res := tk.rep.Open[p]; res != "ENXIO" {
			t.Errorf("%s on %s: %s %q, want ENXIO (CUDA needs it in every job)", tk.file, tk.node, filepath.Base(p), res)
		}
	}
	return got
}

// expectExact checks that each task opened exactly its job's GPUs on its
// node, as slurmctld allocated them, and records the table rows.
func (m *mnSuite) expectExact(t *testing.T, shape string, a allocation, tasks []task) {
	t.Helper()
	for _, tk := range tasks {
		want, ok := a[tk.job][tk.node]
		if !ok {
			t.Errorf("%s: task of job %s ran on %s, which slurmctld did not allocate (%v)", shape, tk.job, tk.node, a)
			continue
		}
		got := m.opened(t, tk)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %s (job %s step %s) opened GPUs %v, slurmctld allocated %v on %s:\n%s", shape, tk.node, tk.job, tk.step, got, want, tk.node, ctldText[tk.job])
		}
		m.row(shape, tk, got)
	}
}

// expectWithin checks a step that holds n of its job's GPUs on each node:
// slurmctld tells a job's per-node GPUs, not a step's, so the step's are
// checked as n of the job's there.
func (m *mnSuite) expectWithin(t *testing.T, shape string, a allocation, tasks []task, n int) {
	t.Helper()
	for _, tk := range tasks {
		job := a[tk.job][tk.node]
		got := m.opened(t, tk)
		if len(got) != n || slices.ContainsFunc(got, func(g int) bool { return !slices.Contains(job, g) }) {
			t.Errorf("%s: %s (job %s step %s) opened GPUs %v, want %d of the job's %v there", shape, tk.node, tk.job, tk.step, got, n, job)
		}
		m.row(shape, tk, got)
	}
}

func (m *mnSuite) row(shape string, tk task, got []int) {
	minors := make([]string, len(got))
	for i, g := range got {
		p, _ := m.c.NodeDevPath(tk.node, g)
		minors[i] = strings.TrimPrefix(filepath.Base(p), "nvidia")
	}
	m.table = append(m.table, fmt.Sprintf("%-34s %-3s step %-6s GPUs %-9s minors %s", shape, tk.node, tk.step, gpulist.Format(got), strings.Join(minors, ",")))
}

// srunHeld runs srun with the probe as its tasks' command, each task
// holding until the test has read slurmctld's allocation, and returns the
// allocation and the reports.
func (m *mnSuite) srunHeld(t *testing.T, tag string, ntasks int, env []string, args ...string) (allocation, []task) {
	t.Helper()
	hold := filepath.Join(m.ctl, tag+"-release")
	var r cluster.Result
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Each component of a heterogeneous srun (… : …) runs the probe.
		var full []string
		for _, a := range args {
			if a == ":" {
				full = append(full, m.probe, tag, hold)
			}
			full = append(full, a)
		}
		full = append(full, m.probe, tag, hold)
		r = m.c.RunEnv(m.ctx, user, env, "srun", full...)
	}()
	m.waitFiles(t, filepath.Join(m.work, tag+".*[0-9]"), ntasks, func() string {
		os.WriteFile(hold, nil, 0o644)
		<-done
		return r.String()
	})
	tasks := m.reports(t, tag, ntasks)
	var jobs []string
	for _, tk := range tasks {
		if !slices.Contains(jobs, tk.job) {
			jobs = append(jobs, tk.job)
		}
	}
	a := m.allocationOf(t, jobs...)
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	<-done
	mustOK(t, r)
	return a, tasks
}

// sbatchHeld submits script as a batch job (args are sbatch's), waits
// until the script has written work/mn/TAG.done, reads slurmctld's
// allocation, lets the job end and waits for COMPLETED. The script's
// $HOLD is the file it must wait for at its end.
func (m *mnSuite) sbatchHeld(t *testing.T, tag string, env []string, args []string, script string, during func(id string)) (string, allocation) {
	t.Helper()
	hold := filepath.Join(m.ctl, tag+"-release")
	f := filepath.Join(m.ctl, tag+".sh")
	body := fmt.Sprintf("#!/bin/sh\nHOLD=%s\nPROBE=%s\n%s\ntouch %s/%s.done.$SLURM_JOB_ID\nwhile [ ! -e $HOLD ]; do sleep 0.1; done\n", hold, m.probe, script, m.ctl, tag)
	if err := os.WriteFile(f, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(m.ctl, tag+"-%j.out")
	r := m.c.RunEnv(m.ctx, user, env, "sbatch", append(append([]string{"--parsable", "-o", out}, args...), f)...)
	mustOK(t, r)
	id, _, _ := strings.Cut(strings.TrimSpace(r.Stdout), ";")
	log := func() string {
		b, _ := os.ReadFile(strings.ReplaceAll(out, "%j", id))
		q := m.c.Run(m.ctx, "", "squeue", "-a", "-o", "%i %T %r %N")
		return fmt.Sprintf("job %s output:\n%s\n%s", id, b, q.Stdout)
	}
	if during != nil {
		during(id)
	}
	m.waitFiles(t, filepath.Join(m.ctl, tag+".done.*"), 1, log)
	dones, _ := filepath.Glob(filepath.Join(m.ctl, tag+".done.*"))
	var jobs []string
	for _, d := range dones {
		jobs = append(jobs, strings.TrimPrefix(filepath.Ext(d), "."))
	}
	a := m.allocationOf(t, append(jobs, id)...)
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	state, err := m.c.WaitJob(m.ctx, id)
	if err != nil || state != "COMPLETED" {
		t.Fatalf("job %s: %q %v\n%s", id, state, err, log())
	}
	return id, a
}

// byStep keeps the tasks of one step (batch, extern, 0, 1, …).
func byStep(tasks []task, step string) []task {
	return slices.DeleteFunc(slices.Clone(tasks), func(tk task) bool { return tk.step != step })
}

// TestPrivilegedMultiNode: on two slurmd with an agent each, every task of
// every multi-node shape opens exactly the GPUs slurmctld allocated its job
// on its node (device minors of that node: n2's GPU 0 is nvidia4), and
// nothing of the other node.
func TestPrivilegedMultiNode(t *testing.T) {
	t0 := time.Now()
	m := startMultiNode(t)
	t.Cleanup(func() {
		t.Logf("shape × node → opened GPUs (the node's gres.conf indices, and the device minors they are):\n%s", strings.Join(m.table, "\n"))
		t.Logf("multi-node shapes on Slurm %s took %s", m.c.SlurmVersion(), time.Since(t0).Round(time.Second))
	})
	both := func(t *testing.T, tasks []task) {
		t.Helper()
		var nodes []string
		for _, tk := range tasks {
			if !slices.Contains(nodes, tk.node) {
				nodes = append(nodes, tk.node)
			}
		}
		if len(nodes) != 2 {
			t.Errorf("the tasks ran on %v, want both nodes", nodes)
		}
	}

	t.Run("srun -N2 --gres=gpu:1", func(t *testing.T) {
		a, tasks := m.srunHeld(t, "gres1", 2, nil, "-N2", "--gres=gpu:1")
		both(t, tasks)
		m.expectExact(t, "srun -N2 --gres=gpu:1", a, tasks)
	})
	t.Run("srun -N2 --gres=gpu:1 beside a job on n2", func(t *testing.T) {
		// A job holding two GPUs of n2 makes the next job's indices
		// differ per node: a list of one node applied on the other shows
		// by index, not only by minor.
		hold := filepath.Join(m.ctl, "beside-holder-release")
		r := m.c.Run(m.ctx, user, "sbatch", "--parsable", "-N1", "-w", "n2", "--gres=gpu:2", "-o", "/dev/null",
			"--wrap", m.probe+" beside-holder "+hold)
		mustOK(t, r)
		holder := strings.TrimSpace(r.Stdout)
		defer func() {
			os.WriteFile(hold, nil, 0o644)
			m.c.WaitJob(m.ctx, holder)
		}()
		m.waitFiles(t, filepath.Join(m.work, "beside-holder.*[0-9]"), 1, func() string { return "" })
		ha := m.allocationOf(t, holder)
		a, tasks := m.srunHeld(t, "beside", 2, nil, "-N2", "--gres=gpu:1")
		both(t, tasks)
		if a0 := a[tasks[0].job]; slices.Equal(a0["n1"], a0["n2"]) {
			t.Errorf("slurmctld gave the job the same indices on both nodes (%v) though n2's first two were held", a0)
		}
		m.expectExact(t, "srun -N2 gpu:1 beside gpu:2@n2", a, tasks)
		m.expectExact(t, "sbatch gpu:2@n2 (the holder)", ha, m.reports(t, "beside-holder", 1))
	})
	t.Run("srun -N2 --gpus-per-node=2", func(t *testing.T) {
		a, tasks := m.srunHeld(t, "gpn2", 2, nil, "-N2", "--gpus-per-node=2")
		both(t, tasks)
		m.expectExact(t, "srun -N2 --gpus-per-node=2", a, tasks)
	})
	t.Run("srun -N2 -n3 --gpus=3", func(t *testing.T) {
		a, tasks := m.srunHeld(t, "uneven", 3, nil, "-N2", "-n3", "--gpus=3")
		both(t, tasks)
		m.expectExact(t, "srun -N2 -n3 --gpus=3", a, tasks)
		var counts []int
		for _, id := range a.jobs() {
			for _, g := range a[id] {
				counts = append(counts, len(g))
			}
		}
		slices.Sort(counts)
		if !slices.Equal(counts, []int{1, 2}) {
			t.Errorf("slurmctld split --gpus=3 as %v over the nodes, want 1 and 2 (the uneven shape)", a)
		}
	})
	t.Run("srun -N2 --exclusive --gres=gpu:1", func(t *testing.T) {
		// The job gets every GPU of both nodes, its step the one it asked for.
		a, tasks := m.srunHeld(t, "exclusive", 2, nil, "-N2", "--exclusive", "--gres=gpu:1")
		both(t, tasks)
		for _, id := range a.jobs() {
			for n, g := range a[id] {
				if len(g) != mnGPUs {
					t.Errorf("--exclusive: slurmctld gave job %s GPUs %v on %s, want all %d", id, g, n, mnGPUs)
				}
			}
		}
		m.expectWithin(t, "srun -N2 --exclusive --gres=gpu:1", a, tasks, 1)
	})
	t.Run("srun heterogeneous", func(t *testing.T) {
		a, tasks := m.srunHeld(t, "hetsrun", 2, nil, "-N1", "-w", "n1", "--gres=gpu:1", ":", "-N1", "-w", "n2", "--gres=gpu:2")
		both(t, tasks)
		if len(a) != 2 {
			t.Errorf("heterogeneous srun: slurmctld shows %d components, want 2: %v", len(a), a)
		}
		m.expectExact(t, "srun gpu:1@n1 : gpu:2@n2", a, tasks)
	})
	t.Run("forged GPU variables", func(t *testing.T) {
		forged := []string{"SLURM_JOB_GPUS=0,1,2,3", "SLURM_STEP_GPUS=0,1,2,3", "CUDA_VISIBLE_DEVICES=0,1,2,3", "GPU_DEVICE_ORDINAL=0,1,2,3"}
		a, tasks := m.srunHeld(t, "forged", 2, forged, "-N2", "--gres=gpu:1")
		both(t, tasks)
		m.expectExact(t, "srun -N2 gpu:1, forged variables", a, tasks)
		// The same from inside a batch job, set before each step.
		script := "export " + strings.Join(forged, " ") + "\nsrun -N2 -n2 --gres=gpu:1 $PROBE forgedb\n"
		_, ab := m.sbatchHeld(t, "forgedb", nil, []string{"-N2", "--gpus-per-node=2"}, script, nil)
		steps := m.reports(t, "forgedb", 2)
		both(t, steps)
		m.expectWithin(t, "sbatch -N2 step gpu:1, forged", ab, steps, 1)
	})
	t.Run("sbatch -N2 steps on one node, both and --overlap", func(t *testing.T) {
		script := strings.Join([]string{
			"$PROBE steps-batch",
			"srun -N1 -n1 -w n2 --gres=gpu:1 $PROBE steps-one",
			"srun -N2 -n2 --gpus-per-node=2 $PROBE steps-both",
			// A step holding every GPU of the job, and one overlapping it.
			"srun -N2 -n2 --gpus-per-node=2 sleep 600 &",
			"holder=$!",
			"srun -N2 -n2 --overlap --gpus-per-node=2 $PROBE steps-overlap",
			"kill $holder; wait",
		}, "\n")
		_, a := m.sbatchHeld(t, "steps", nil, []string{"-N2", "--gpus-per-node=2"}, script, nil)
		batch := m.reports(t, "steps-batch", 1)
		if batch[0].step != "batch" {
			t.Errorf("the batch probe ran in step %s", batch[0].step)
		}
		m.expectExact(t, "sbatch -N2 gpn2: batch step", a, batch)
		one := m.reports(t, "steps-one", 1)
		if one[0].node != "n2" {
			t.Errorf("srun -w n2 ran on %s", one[0].node)
		}
		m.expectWithin(t, "sbatch -N2 gpn2: step gpu:1 on n2", a, one, 1)
		bothSteps := m.reports(t, "steps-both", 2)
		both(t, bothSteps)
		m.expectExact(t, "sbatch -N2 gpn2: step on both", a, bothSteps)
		overlap := m.reports(t, "steps-overlap", 2)
		both(t, overlap)
		m.expectExact(t, "sbatch -N2 gpn2: --overlap step", a, overlap)
	})
	t.Run("sbatch heterogeneous", func(t *testing.T) {
		script := "$PROBE hetb-batch\nsrun --het-group=0,1 $PROBE hetb-step\n"
		_, a := m.sbatchHeld(t, "hetb", nil, []string{"-N1", "-w", "n1", "--gres=gpu:2", ":", "-N1", "-w", "n2", "--gres=gpu:1"}, script, nil)
		if len(a) != 2 {
			t.Errorf("heterogeneous sbatch: slurmctld shows %d components, want 2: %v", len(a), a)
		}
		m.expectExact(t, "sbatch gpu:2@n1 : gpu:1@n2, batch", a, m.reports(t, "hetb-batch", 1))
		steps := m.reports(t, "hetb-step", 2)
		both(t, steps)
		m.expectExact(t, "sbatch gpu:2@n1 : gpu:1@n2, step", a, steps)
	})
	t.Run("job array", func(t *testing.T) {
		script := "srun -N2 -n2 --gpus-per-node=1 $PROBE array-$SLURM_ARRAY_TASK_ID\n"
		hold := filepath.Join(m.ctl, "array-release")
		// Each array task marks itself done; the test reads slurmctld's
		// view once both run, so they hold different GPUs at once.
		_, a := m.sbatchHeld(t, "array", nil, []string{"-N2", "--gpus-per-node=1", "--array=0-1"}, script, func(string) {
			m.waitFiles(t, filepath.Join(m.ctl, "array.done.*"), 2, func() string { os.WriteFile(hold, nil, 0o644); return "" })
		})
		if len(a) != 2 {
			t.Errorf("slurmctld shows %d records for the array, want both tasks: %v", len(a), a)
		}
		for _, i := range []string{"0", "1"} {
			tasks := m.reports(t, "array-"+i, 2)
			both(t, tasks)
			m.expectExact(t, "sbatch -N2 --array=0-1 gpn1, task "+i, a, tasks)
		}
	})
	t.Run("extern step cancelled", func(t *testing.T) {
		gate := filepath.Join(m.ctl, "extern-go")
		script := fmt.Sprintf("touch %s/extern-ready\nwhile [ ! -e %s ]; do sleep 0.1; done\nsrun -N2 -n2 --gpus-per-node=1 $PROBE extern-step\n$PROBE extern-batch\n", m.ctl, gate)
		_, a := m.sbatchHeld(t, "extern", nil, []string{"-N2", "--gpus-per-node=1"}, script, func(id string) {
			m.waitFiles(t, filepath.Join(m.ctl, "extern-ready"), 1, func() string { return "" })
			// 22.05's scancel knows the extern step by its number only
			// (SLURM_EXTERN_CONT), later releases by name too.
			r := m.c.Run(m.ctx, user, "scancel", id+".extern")
			if r.Code != 0 && strings.Contains(r.Stderr, "Invalid job id") {
				r = m.c.Run(m.ctx, user, "scancel", id+".4294967292")
			}
			mustOK(t, r)
			// Until both nodes' extern step cgroups are gone.
			deadline := time.Now().Add(30 * time.Second)
			for {
				left := 0
				for _, n := range m.c.Nodes() {
					scope, _ := m.c.NodeScopeDir(n)
					if _, err := os.Stat(filepath.Join(scope, "job_"+id, "step_extern")); err == nil {
						left++
					}
				}
				if left == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("job %s's extern step is still on %d nodes 30 s after scancel %s.extern", id, left, id)
				}
				time.Sleep(100 * time.Millisecond)
			}
			os.WriteFile(gate, nil, 0o644)
		})
		steps := m.reports(t, "extern-step", 2)
		both(t, steps)
		m.expectExact(t, "sbatch -N2 gpn1, extern cancelled: step", a, steps)
		m.expectExact(t, "sbatch -N2 gpn1, extern cancelled: batch", a, m.reports(t, "extern-batch", 1))
	})
	t.Run("one slurmd killed", func(t *testing.T) { m.slurmdKilled(t) })
	t.Run("no entries left", func(t *testing.T) { m.noEntriesLeft(t) })
	t.Run("audit records validate", func(t *testing.T) {
		var files []string
		for _, n := range m.c.Nodes() {
			files = append(files, filepath.Join(m.c.Root(), "logs", "audit-"+n+".jsonl"))
		}
		// Each agent flushes every 500 ms; it has records of this test's
		// steps by now, or soon.
		deadline := time.Now().Add(10 * time.Second)
		for _, f := range files {
			for fi, err := os.Stat(f); err != nil || fi.Size() == 0; fi, err = os.Stat(f) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: no audit record (%v)", f, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		n, err := (&suite{auditFiles: files}).checkAuditSchema()
		if err != nil {
			t.Error(err)
		}
		if n == 0 {
			t.Errorf("no audit record in %v", files)
		}
		t.Logf("%d audit records of the two agents validate", n)
	})
}

// noEntriesLeft: once every job ended, each node's filter holds only its
// two exempt entries (system and slurmd): no node's agent kept a policy
// of a job step, its own or another node's.
func (m *mnSuite) noEntriesLeft(t *testing.T) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		q := m.c.Run(m.ctx, "", "squeue", "-h")
		if strings.TrimSpace(q.Stdout) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs left after 60 s:\n%s", q.Stdout)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, n := range m.c.Nodes() {
		scope, err := m.c.NodeScopeDir(n)
		if err != nil {
			t.Fatal(err)
		}
		var got int
		for {
			if got, err = policyEntries(scope); err == nil && got == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: %d policy entries (%v) after every job ended, want the 2 exempt ones", n, got, err)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// slurmdKilled: a job's tasks on both nodes probe every GPU in rounds while
// n2's slurmd is killed. n2's agent keeps enforcing (every round of its
// task, before and after the kill, opens exactly n2's GPUs of the job), a
// new step on n1 gets exactly n1's, and once n2's slurmd is back a step on
// both nodes is exact.
func (m *mnSuite) slurmdKilled(t *testing.T) {
	stop := filepath.Join(m.ctl, "kill-stop")
	loop := filepath.Join(m.c.Root(), "bin", "mn-loop")
	script := fmt.Sprintf("#!/bin/sh\nexec %s -env -until %s -sleep 20ms %s > %s/kill-loop.$$\n", m.open, stop, strings.Join(m.paths(), " "), m.work)
	if err := os.WriteFile(loop, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	const paths = 2*mnGPUs + 2
	rounds := func(t *testing.T) map[string]int {
		t.Helper()
		files, _ := filepath.Glob(filepath.Join(m.work, "kill-loop.*"))
		n := map[string]int{}
		for _, f := range files {
			b, _ := os.ReadFile(f)
			mm := taskCgroup.FindStringSubmatch(cluster.ParseOpen(string(b)).Cgroup + "/")
			if mm == nil {
				continue
			}
			lines := 0
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, "/") {
					lines++
				}
			}
			n[mm[1]] = lines / paths
		}
		return n
	}
	waitRounds := func(t *testing.T, node string, atLeast int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for rounds(t)[node] < atLeast {
			if time.Now().After(deadline) {
				t.Fatalf("the probe on %s did %d rounds in 60 s, want %d", node, rounds(t)[node], atLeast)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var killedAt int
	scriptBody := fmt.Sprintf("srun -N2 -n2 --gpus-per-node=2 %s &\nwhile [ ! -e %s ]; do sleep 0.1; done\nwait\n", loop, stop)
	id, a := m.sbatchHeld(t, "kill", nil, []string{"-N2", "--gpus-per-node=2"}, scriptBody, func(id string) {
		waitRounds(t, "n1", 5)
		waitRounds(t, "n2", 5)
		killedAt = rounds(t)["n2"]
		if err := m.c.KillSlurmd("n2"); err != nil {
			t.Fatal(err)
		}
		waitRounds(t, "n2", killedAt+50)
		// n1's slurmd still runs: a new step there gets exactly n1's.
		r := m.c.Run(m.ctx, user, "srun", "--jobid="+id, "--overlap", "-N1", "-n1", "-w", "n1", "--gpus-per-node=2", m.probe, "kill-n1")
		mustOK(t, r)
		if err := m.c.StartSlurmd(m.ctx, "n2"); err != nil {
			t.Fatal(err)
		}
		r = m.c.Run(m.ctx, user, "srun", "--jobid="+id, "--overlap", "-N2", "-n2", "--gpus-per-node=2", m.probe, "kill-after")
		mustOK(t, r)
		os.WriteFile(stop, nil, 0o644)
	})
	n := rounds(t)
	t.Logf("job %s: %d rounds on n1; %d rounds on n2, %d of them after its slurmd was killed", id, n["n1"], n["n2"], n["n2"]-killedAt)
	files, _ := filepath.Glob(filepath.Join(m.work, "kill-loop.*"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		rep := cluster.ParseOpen(string(b))
		mm := taskCgroup.FindStringSubmatch(rep.Cgroup + "/")
		if mm == nil {
			t.Fatalf("%s: no node in cgroup %q", f, rep.Cgroup)
		}
		want := map[string]string{}
		first := 0
		if mm[1] == "n2" {
			first = mnGPUs
		}
		for minor, p := range m.c.AllDevPaths() {
			want[p] = "EPERM"
			if minor >= first && minor < first+mnGPUs && slices.Contains(a[mm[2]][mm[1]], minor-first) {
				want[p] = "ENXIO"
			}
		}
		bad := 0
		for i, l := range strings.Split(string(b), "\n") {
			p, res, ok := strings.Cut(l, " ")
			if !ok || !strings.HasPrefix(l, "/") {
				continue
			}
			if w, gpu := want[p]; gpu && res != w {
				bad++
				if bad < 5 {
					t.Errorf("%s on %s, line %d: %s %s, want %s (slurmctld: %v)", filepath.Base(f), mm[1], i, p, res, w, a[mm[2]][mm[1]])
				}
			}
		}
		if bad > 0 {
			t.Errorf("%s on %s: %d wrong opens", filepath.Base(f), mm[1], bad)
		}
		m.expectExact(t, "sbatch -N2 gpn2, n2 slurmd killed: loop", a, []task{{node: mm[1], job: mm[2], step: mm[3], rep: rep, file: f}})
	}
	n1 := m.reports(t, "kill-n1", 1)
	if n1[0].node != "n1" {
		t.Errorf("srun -w n1 ran on %s", n1[0].node)
	}
	m.expectExact(t, "n2 slurmd dead: new step on n1", a, n1)
	after := m.reports(t, "kill-after", 2)
	m.expectExact(t, "n2 slurmd back: step on both", a, after)
}
