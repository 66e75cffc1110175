// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

func taskBind(d *Daemon, pid int, m *pb.TaskBind) *pb.Response {
	return d.h.Handle(nil, peer.Peer{PID: pid}, &pb.Request{Version: pb.ProtocolVersion_PROTOCOL_VERSION_1, Msg: &pb.Request_TaskBind{TaskBind: m}})
}

// TestPrivilegedDaemonTaskBinding: with task_binding: slurm, a task's
// TaskBind narrows its own task cgroup, in the kernel, to the GPUs of its
// step that its binding names, and nothing else: its sibling task and
// slurmstepd keep the step's list, a binding naming GPUs beyond the step
// (the job's other GPU, a GPU of no one) opens none of them, the request
// is refused from anything but a task cgroup of that very step, and the
// task's entry goes with the step.
func TestPrivilegedDaemonTaskBinding(t *testing.T) {
	tr := newTree(t)
	if m, _ := devfilter.Probe(); m != devfilter.ModeScope {
		t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", m)
	}
	d, _ := tr.daemonWith(devfilter.ModeScope, func(c *config.Config) { c.TaskBinding = config.TaskBindingSlurm })

	// Job 1 holds GPUs 0,1,2; its step 0 holds 0,1 with two tasks. Job 2
	// holds GPU 3.
	stepd := tr.sleeper(tr.mkdir("job_1/step_0/slurm"))
	task0Dir, task1Dir := tr.mkdir("job_1/step_0/user/task_0"), tr.mkdir("job_1/step_0/user/task_1")
	task0, task1 := tr.sleeper(task0Dir), tr.sleeper(task1Dir)
	batchd := tr.sleeper(tr.mkdir("job_1/step_batch/slurm"))
	stepd2 := tr.sleeper(tr.mkdir("job_2/step_0/slurm"))
	other := tr.sleeper(tr.mkdir("job_2/step_0/user/task_0"))
	call(d, 0, &pb.JobProlog{JobId: 1, Uid: 1000, JobGpus: ptr("0,1,2")})
	call(d, 0, &pb.JobProlog{JobId: 2, Uid: 1001, JobGpus: ptr("3")})
	r := call(d, stepd, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("0,1")})
	if r.Error != "" || !r.TaskBind {
		t.Fatalf("step 1.0: %+v; want task_bind", r)
	}
	if r := call(d, batchd, &pb.StepStart{JobId: 1, StepId: policy.BatchStep, Uid: 1000}); r.Error != "" || r.TaskBind {
		t.Errorf("batch step: %+v; want no task_bind (Slurm never binds its tasks)", r)
	}
	if r := call(d, stepd2, &pb.StepStart{JobId: 2, StepId: 0, Uid: 1001, StepGpus: ptr("3")}); r.Error != "" || !r.TaskBind {
		t.Fatalf("step 2.0: %+v", r)
	}
	tr.expect(task0Dir, 0, 1)

	// Task 0 bound to GPU 1 (map_gpu, single:1, --gpus-per-task).
	if r := taskBind(d, task0, &pb.TaskBind{JobId: 1, StepId: 0, TaskId: 0, VisibleDevices: ptr("1")}); r.Error != "" || !slices.Equal(r.Gpus, []uint32{1}) {
		t.Fatalf("task 0: %+v; want GPUs [1]", r)
	}
	tr.expect(task0Dir, 1)
	tr.expect(task1Dir, 0, 1)
	tr.expect(tr.mkdir("job_1/step_0/slurm"), 0, 1)

	// A binding that names every GPU (forged CUDA_VISIBLE_DEVICES) gets
	// the step's and no more: not the job's GPU 2, not job 2's GPU 3.
	if r := taskBind(d, task1, &pb.TaskBind{JobId: 1, StepId: 0, TaskId: 1, VisibleDevices: ptr("0,1,2,3")}); r.Error != "" || !slices.Equal(r.Gpus, []uint32{0, 1}) {
		t.Fatalf("task 1 with a forged list: %+v; want GPUs [0 1]", r)
	}
	tr.expect(task1Dir, 0, 1)
	// Naming only GPUs beyond the step opens none.
	if r := taskBind(d, task1, &pb.TaskBind{JobId: 1, StepId: 0, TaskId: 1, VisibleDevices: ptr("2,3")}); r.Error != "" || len(r.Gpus) != 0 {
		t.Fatalf("task 1 bound beyond its step: %+v; want no GPU", r)
	}
	tr.expect(task1Dir)
	tr.expect(task0Dir, 1)

	for _, tt := range []struct {
		name string
		pid  int
		m    *pb.TaskBind
		want string
	}{
		{"from slurmstepd's cgroup", stepd, &pb.TaskBind{JobId: 1, StepId: 0, VisibleDevices: ptr("0")}, "not a task"},
		{"from another job's task", other, &pb.TaskBind{JobId: 1, StepId: 0, VisibleDevices: ptr("0")}, "not inside the step's cgroup"},
		{"for a step not registered", task0, &pb.TaskBind{JobId: 1, StepId: 7, VisibleDevices: ptr("0")}, "not registered"},
		{"for the batch step", batchd, &pb.TaskBind{JobId: 1, StepId: policy.BatchStep, VisibleDevices: ptr("0")}, "not bound one by one"},
		{"from a pid that is gone", 1 << 30, &pb.TaskBind{JobId: 1, StepId: 0, VisibleDevices: ptr("0")}, "cannot place the task"},
	} {
		if r := taskBind(d, tt.pid, tt.m); !strings.Contains(r.Error, tt.want) {
			t.Errorf("%s: %q; want an error with %q", tt.name, r.Error, tt.want)
		}
	}
	tr.expect(tr.mkdir("job_2/step_0/user/task_0"), 3)

	// Where Slurm makes no cgroup per task (every task in
	// user/task_special), there is nothing to narrow by: the task keeps
	// its step's GPUs, and the step's other tasks are untouched.
	stepd1 := tr.sleeper(tr.mkdir("job_1/step_1/slurm"))
	specialDir := tr.mkdir("job_1/step_1/user/task_special")
	special := tr.sleeper(specialDir)
	if r := call(d, stepd1, &pb.StepStart{JobId: 1, StepId: 1, Uid: 1000, StepGpus: ptr("1,2")}); r.Error != "" || !r.TaskBind {
		t.Fatalf("step 1.1: %+v", r)
	}
	if r := taskBind(d, special, &pb.TaskBind{JobId: 1, StepId: 1, VisibleDevices: ptr("2")}); r.Error != "" || !slices.Equal(r.Gpus, []uint32{1, 2}) {
		t.Errorf("task in task_special: %+v; want its step's GPUs [1 2]", r)
	}
	tr.expect(specialDir, 1, 2)

	// The task's entry goes with its step.
	id0, err := jobcgroup.ID(task0Dir)
	if err != nil {
		t.Fatal(err)
	}
	entries := func() map[uint64]devfilter.Policy {
		m, err := d.filter().Policies()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if e, ok := entries()[id0]; !ok || !slices.Equal(e.GPUMinors, []uint32{1}) {
		t.Fatalf("task 0's kernel entry: %v, %v; want GPU minor 1", e, ok)
	}
	call(d, 0, &pb.StepEnd{JobId: 1, StepId: 0})
	if e, ok := entries()[id0]; ok {
		t.Errorf("task 0's entry outlived its step: %v", e)
	}
	tr.expect(task0Dir)
}

// With task_binding: step (the default) nothing is bound per task: the
// answer does not ask, and a TaskBind is refused.
func TestPrivilegedDaemonTaskBindingStep(t *testing.T) {
	tr := newTree(t)
	d, _ := tr.daemon(devfilter.ModeAuto)
	stepd := tr.sleeper(tr.mkdir("job_1/step_0/slurm"))
	task := tr.sleeper(tr.mkdir("job_1/step_0/user/task_0"))
	call(d, 0, &pb.JobProlog{JobId: 1, Uid: 1000, JobGpus: ptr("0,1")})
	if r := call(d, stepd, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("0,1")}); r.Error != "" || r.TaskBind {
		t.Fatalf("step: %+v; want no task_bind", r)
	}
	if r := taskBind(d, task, &pb.TaskBind{JobId: 1, StepId: 0, VisibleDevices: ptr("0")}); !strings.Contains(r.Error, "task_binding: step") {
		t.Errorf("TaskBind under task_binding: step: %q", r.Error)
	}
	tr.expect(tr.mkdir("job_1/step_0/user/task_0"), 0, 1)
}

// In per-cgroup mode the program sits on step cgroups only: the agent says
// at start that tasks keep their step's GPUs, and never asks for them.
func TestPrivilegedDaemonTaskBindingPerCgroup(t *testing.T) {
	tr := newTree(t)
	d, logs := tr.daemonWith(devfilter.ModePerCgroup, func(c *config.Config) { c.TaskBinding = config.TaskBindingSlurm })
	stepd := tr.sleeper(tr.mkdir("job_1/step_0/slurm"))
	call(d, 0, &pb.JobProlog{JobId: 1, Uid: 1000, JobGpus: ptr("0,1")})
	if r := call(d, stepd, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("0,1")}); r.Error != "" || r.TaskBind {
		t.Fatalf("step in per-cgroup mode: %+v; want no task_bind", r)
	}
	if !strings.Contains(logs.String(), "task_binding: slurm narrows tasks in scope mode only") {
		t.Errorf("the agent did not say that per-cgroup mode keeps tasks at their step's GPUs:\n%s", logs.String())
	}
}

// TestPrivilegedTaskBindCost: what the agent spends on one task's
// TaskBind (its cgroup read from /proc, the policy, one map update, the
// record), without the socket, as a median over 200 calls; it fails only
// when a call fails or takes over a second, and logs the figure.
func TestPrivilegedTaskBindCost(t *testing.T) {
	tr := newTree(t)
	if m, _ := devfilter.Probe(); m != devfilter.ModeScope {
		t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", m)
	}
	d, _ := tr.daemonWith(devfilter.ModeScope, func(c *config.Config) { c.TaskBinding = config.TaskBindingSlurm })
	stepd := tr.sleeper(tr.mkdir("job_1/step_0/slurm"))
	task := tr.sleeper(tr.mkdir("job_1/step_0/user/task_0"))
	call(d, 0, &pb.JobProlog{JobId: 1, Uid: 1000, JobGpus: ptr("0,1")})
	if r := call(d, stepd, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("0,1")}); r.Error != "" {
		t.Fatal(r.Error)
	}
	var took []time.Duration
	for i := range 200 {
		t0 := time.Now()
		r := taskBind(d, task, &pb.TaskBind{JobId: 1, StepId: 0, VisibleDevices: ptr(fmt.Sprint(i % 2))})
		took = append(took, time.Since(t0))
		if r.Error != "" || len(r.Gpus) != 1 {
			t.Fatalf("call %d: %+v", i, r)
		}
	}
	slices.Sort(took)
	t.Logf("TaskBind handled in %v median, %v p90, %v max (200 calls, each a map update)", took[100], took[180], took[199])
	if took[199] > time.Second {
		t.Errorf("a TaskBind took %v", took[199])
	}
}
