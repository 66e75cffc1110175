// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/tests/cluster"
)

// bindShape is one srun shape of the per-task binding suite: its
// arguments, the environment srun starts with (forged variables), and the
// GPUs the step is allocated on the idle four-GPU node (Slurm gives the
// lowest free ones), which no task may ever exceed.
type bindShape struct {
	name  string
	args  []string
	env   []string
	alloc []int
	// whole: no per-task binding, so under ConstrainDevices=yes every
	// task opens the whole allocation (checked, as the oracle's sanity).
	whole bool
}

func bindShapes() []bindShape {
	return []bindShape{
		{name: "-n2 --gpus-per-task=1", args: []string{"-n2", "--gpus-per-task=1"}, alloc: []int{0, 1}},
		{name: "--gpus=2 --gpu-bind=single:1", args: []string{"-n2", "--gpus=2", "--gpu-bind=single:1"}, alloc: []int{0, 1}},
		{name: "--gpus=2 --gpu-bind=map_gpu:1,0", args: []string{"-n2", "--gpus=2", "--gpu-bind=map_gpu:1,0"}, alloc: []int{0, 1}},
		{name: "--gpus=2 --gpu-bind=per_task:1", args: []string{"-n2", "--gpus=2", "--gpu-bind=per_task:1"}, alloc: []int{0, 1}},
		{name: "--gpus=2 --gpu-bind=none", args: []string{"-n2", "--gpus=2", "--gpu-bind=none"}, alloc: []int{0, 1}, whole: true},
		{name: "--gpus=2 -n2", args: []string{"-n2", "--gpus=2"}, alloc: []int{0, 1}, whole: true},
		// Forged: the task-level variables Slurm overwrites, set wide, on
		// a bound and on an unbound step.
		{name: "forged, single:1", args: []string{"-n2", "--gpus=2", "--gpu-bind=single:1"}, alloc: []int{0, 1},
			env: []string{"CUDA_VISIBLE_DEVICES=0,1,2,3", "GPU_DEVICE_ORDINAL=0,1,2,3", "SLURMD_TRES_BIND=gres/gpu:none", "SLURM_STEP_GPUS=0,1,2,3"}},
		{name: "forged, --gpus=2 unbound", args: []string{"-n2", "--gpus=2"}, alloc: []int{0, 1}, whole: true,
			env: []string{"CUDA_VISIBLE_DEVICES=0,1,2,3", "GPU_DEVICE_ORDINAL=0,1,2,3", "SLURMD_TRES_BIND=gres/gpu:map_gpu:2,3", "SLURM_STEP_GPUS=0,1,2,3"}},
		// Forged: binding options srun reads from its environment
		// (SLURM_GPU_BIND, SLURM_GPUS_PER_TASK), naming GPUs beyond the
		// step: whatever Slurm binds, nothing outside the allocation.
		{name: "forged, --gpus=1 map_gpu:0,1,2,3", args: []string{"-n2", "--gpus=1"}, alloc: []int{0},
			env: []string{"SLURM_GPU_BIND=map_gpu:0,1,2,3", "CUDA_VISIBLE_DEVICES=0,1,2,3", "SLURMD_TRES_BIND=gres/gpu:map_gpu:0,1,2,3"}},
		{name: "forged, --gpus=2 gpus-per-task", args: []string{"-n2", "--gpus=2"}, alloc: []int{0, 1},
			env: []string{"SLURM_GPUS_PER_TASK=1", "SLURM_GPU_BIND=map_gpu:3,2", "CUDA_VISIBLE_DEVICES=2,3", "SLURMD_TRES_BIND=gres/gpu:none"}},
	}
}

// bindRun is what each task of one srun opened, by task rank; failed
// holds srun's result when it did not exit 0.
type bindRun struct {
	tasks  [][]int
	cvd    []string // each task's CUDA_VISIBLE_DEVICES as it ran
	cgroup []string // each task's cgroup
	failed string
}

// runBound runs one shape as the job user, each task's gf-open output in
// its own file (srun -o …%t), and reads what each task opened.
func (st *suite) runBound(t *testing.T, sh bindShape) bindRun {
	t.Helper()
	dir := filepath.Join(st.c.Root(), "work", fmt.Sprintf("bind-%d", time.Now().UnixNano()))
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	args := append(slices.Clone(sh.args), "-o", filepath.Join(dir, "task.%t"), st.open, "-env")
	args = append(args, st.paths()...)
	r := st.c.RunEnv(st.ctx, user, sh.env, "srun", args...)
	if r.Code != 0 {
		return bindRun{failed: r.String()}
	}
	var run bindRun
	for i := 0; ; i++ {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("task.%d", i)))
		if os.IsNotExist(err) && i > 0 {
			break
		}
		if err != nil {
			t.Fatalf("%s: task %d: %v", sh.name, i, err)
		}
		rep := cluster.ParseOpen(string(b))
		if len(rep.Open) == 0 {
			t.Fatalf("%s: task %d printed no probe:\n%s", sh.name, i, b)
		}
		for _, p := range st.paths()[4:] {
			if rep.Open[p] != "ENXIO" {
				t.Errorf("%s: task %d: %s %q, want ENXIO (CUDA needs it in every task)", sh.name, i, filepath.Base(p), rep.Open[p])
			}
		}
		run.tasks = append(run.tasks, st.opened(rep))
		cvd := rep.Env["CUDA_VISIBLE_DEVICES"]
		if rep.Unset["CUDA_VISIBLE_DEVICES"] {
			cvd = "(unset)"
		}
		run.cvd = append(run.cvd, cvd)
		run.cgroup = append(run.cgroup, rep.Cgroup)
	}
	return run
}

// String renders a run as "[1] [0]", one list per task.
func (r bindRun) String() string {
	if r.failed != "" {
		return "srun failed"
	}
	var parts []string
	for _, g := range r.tasks {
		parts = append(parts, fmt.Sprint(g))
	}
	return strings.Join(parts, " ")
}

// medianMs is the median of ds in milliseconds.
func medianMs(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[len(s)/2].Microseconds()) / 1000
}

// timeSruns runs srun -n2 with a binding n times and returns each wall time.
func (st *suite) timeSruns(t *testing.T, n int) []time.Duration {
	t.Helper()
	var out []time.Duration
	for range n {
		t0 := time.Now()
		r := st.c.Run(st.ctx, user, "srun", "-n2", "--gpus=2", "--gpu-bind=single:1", "true")
		d := time.Since(t0)
		mustOK(t, r)
		out = append(out, d)
	}
	return out
}

// TestPrivilegedTaskBinding: each shape of srun -n2 with and without a
// per-task GPU binding (--gpus-per-task, --gpu-bind single/map_gpu/
// per_task/none) and with forged binding variables runs three times on the
// same cluster: under ConstrainDevices=yes with no gpufence (the oracle:
// Slurm's own per-task device cgroups), under gpufence with task_binding:
// slurm (each task must open exactly what the oracle let it open, where
// Slurm gave it a cgroup of its own; in user/task_special, which Slurm
// uses when cgroup.conf constrains nothing per task, its step's GPUs), and
// under task_binding: step, the default (each task opens its step's whole
// allocation, as without ConstrainDevices). No task ever opens a GPU
// outside its step's allocation. It prints the table shape × mode and the
// launch time of srun -n2 under each mode.
func TestPrivilegedTaskBinding(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	shapes := bindShapes()
	pins := filepath.Join(st.bpffs, "gpufence")
	stateFile := filepath.Join(st.c.Root(), "run", "agent-state.json")
	restore := func() {
		st.waitIdle(t)
		if st.agent.Alive() {
			if err := st.agent.Stop(); err != nil {
				t.Error(err)
			}
		}
		if err := st.c.WritePlugstack([]string{st.plugstackLine()}); err != nil {
			t.Fatal(err)
		}
		if err := st.c.RestartSlurmd(false); err != nil {
			t.Fatal(err)
		}
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
	}
	defer restore()

	// The oracle: no gpufence on the node (agent stopped, its pins gone,
	// so its filter is detached, no plugin), Slurm's ConstrainDevices=yes.
	if err := st.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(pins); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(stateFile); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := st.c.WritePlugstack(nil); err != nil {
		t.Fatal(err)
	}
	if err := st.c.RestartSlurmd(true); err != nil {
		t.Fatal(err)
	}
	oracle := map[string]bindRun{}
	for _, sh := range shapes {
		oracle[sh.name] = st.runBound(t, sh)
	}
	st.waitIdle(t)

	// gpufence alone, ConstrainDevices=no, as ParallelCluster runs.
	if err := st.c.WritePlugstack([]string{st.plugstackLine()}); err != nil {
		t.Fatal(err)
	}
	if err := st.c.RestartSlurmd(false); err != nil {
		t.Fatal(err)
	}
	modes := []string{"slurm", "step"}
	got := map[string]map[string]bindRun{}
	timings := map[string][]time.Duration{}
	for _, mode := range append(modes, "slurm") {
		st.waitIdle(t)
		if st.agent.Alive() {
			if err := st.agent.Stop(); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.startAgent(agentOpts{yaml: "task_binding: " + mode + "\n"}); err != nil {
			t.Fatal(err)
		}
		// Warm the agent's caches (user name, Slurm settings) first.
		st.timeSruns(t, 1)
		timings[mode] = append(timings[mode], st.timeSruns(t, 8)...)
		if got[mode] != nil {
			continue // the second slurm round only times
		}
		got[mode] = map[string]bindRun{}
		for _, sh := range shapes {
			got[mode][sh.name] = st.runBound(t, sh)
		}
	}

	special, matched := 0, 0
	var b strings.Builder
	fmt.Fprintf(&b, "Slurm %s, per task (rank 0, rank 1) the GPUs that opened; CUDA_VISIBLE_DEVICES under each\n", st.c.SlurmVersion())
	fmt.Fprintf(&b, "%-36s %-7s %-22s %-22s %-22s\n", "shape", "alloc", "ConstrainDevices=yes", "task_binding: slurm", "task_binding: step")
	for _, sh := range shapes {
		o, sl, sp := oracle[sh.name], got["slurm"][sh.name], got["step"][sh.name]
		fmt.Fprintf(&b, "%-36s %-7s %-22s %-22s %-22s\n", sh.name, fmt.Sprint(sh.alloc), o, sl, sp)
		fmt.Fprintf(&b, "%-36s %-7s %-22s %-22s %-22s\n", "", "", strings.Join(o.cvd, " "), strings.Join(sl.cvd, " "), strings.Join(sp.cvd, " "))
		if o.failed != "" || sl.failed != "" || sp.failed != "" {
			t.Errorf("%s: srun failed: ConstrainDevices %q; slurm %q; step %q", sh.name, o.failed, sl.failed, sp.failed)
			continue
		}
		if len(o.tasks) != 2 || len(sl.tasks) != 2 || len(sp.tasks) != 2 {
			t.Errorf("%s: tasks: %d, %d, %d; want 2 each", sh.name, len(o.tasks), len(sl.tasks), len(sp.tasks))
			continue
		}
		for i := range 2 {
			for name, g := range map[string][]int{"ConstrainDevices": o.tasks[i], "slurm": sl.tasks[i], "step": sp.tasks[i]} {
				for _, x := range g {
					if !slices.Contains(sh.alloc, x) {
						t.Errorf("%s: %s: task %d opened GPU %d, outside the step's allocation %v", sh.name, name, i, x, sh.alloc)
					}
				}
			}
			if sh.whole && !slices.Equal(o.tasks[i], sh.alloc) {
				t.Errorf("%s: ConstrainDevices: task %d opened %v, want its step's %v (no binding)", sh.name, i, o.tasks[i], sh.alloc)
			}
			switch {
			case strings.HasSuffix(sl.cgroup[i], "/user/task_special"):
				// Slurm made no cgroup per task (cgroup.conf constrains
				// nothing per task, as on this hybrid host, whose cgroup2
				// has no cpuset or memory controller for ConstrainCores):
				// nothing to narrow by, the task keeps its step's GPUs.
				special++
				if !slices.Equal(sl.tasks[i], sh.alloc) {
					t.Errorf("%s: task_binding: slurm, task %d in task_special: opened %v, want its step's %v", sh.name, i, sl.tasks[i], sh.alloc)
				}
			case !slices.Equal(sl.tasks[i], o.tasks[i]):
				t.Errorf("%s: task_binding: slurm: task %d (%s) opened %v, ConstrainDevices=yes %v", sh.name, i, sl.cgroup[i], sl.tasks[i], o.tasks[i])
			default:
				matched++
			}
			if !slices.Equal(sp.tasks[i], sh.alloc) {
				t.Errorf("%s: task_binding: step: task %d opened %v, want its step's %v", sh.name, i, sp.tasks[i], sh.alloc)
			}
		}
	}
	if r := got["slurm"][shapes[0].name]; len(r.cgroup) > 0 {
		fmt.Fprintf(&b, "task cgroups (%s, task_binding: slurm): %s\n", shapes[0].name, strings.Join(r.cgroup, " "))
	}
	fmt.Fprintf(&b, "task_binding: slurm: %d tasks in a task cgroup of their own matched ConstrainDevices=yes; %d tasks in user/task_special kept their step's GPUs\n", matched, special)
	step, slurm := medianMs(timings["step"]), medianMs(timings["slurm"])
	fmt.Fprintf(&b, "srun -n2 --gpus=2 --gpu-bind=single:1 true, median of %d (slurm rounds before and after step): step %.1f ms, slurm %.1f ms: %+.1f ms per task\n",
		len(timings["step"]), step, slurm, (slurm-step)/2)
	t.Logf("\n%s", b.String())
}
