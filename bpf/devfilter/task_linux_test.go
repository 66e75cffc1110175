// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"os"
	"testing"

	"github.com/gpufence/gpufence/agent/cgroup"
)

// A task cgroup's own entry (task_binding: slurm) decides for that task
// alone: its siblings, slurmstepd's cgroup and the step's other tasks keep
// the step's entry, a cgroup below the task inherits the task's, and with
// the task's entry gone the task falls back to its step's.
func TestPrivilegedScopeTaskEntry(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModeScope)
	for _, d := range []string{"job_1/step_0/user/task_1", "job_1/step_0/user/task_1/below", "job_2/step_0/user/task_1"} {
		if err := os.MkdirAll(fx.path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f := newFilter(t, Options{Mode: ModeScope, ScopeDir: fx.scope})
	step, task1, otherTask := fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "job_1/step_0/user/task_1"), fx.cgroup(t, "job_2/step_0/user/task_1")
	for cg, p := range map[cgroup.Cgroup]Policy{
		step:      {GPUMinors: []uint32{0, 1}},
		task1:     {GPUMinors: []uint32{1}},
		otherTask: {GPUMinors: []uint32{3}}, // a task entry whose step has none
	} {
		if err := f.Set(cg, p); err != nil {
			t.Fatal(err)
		}
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_0", 0, 1)
	fx.expectGPUs(t, "job_1/step_0/user/task_1", 1)
	fx.expectGPUs(t, "job_1/step_0/user/task_1/below", 1)
	fx.expectGPUs(t, "job_1/step_0/slurm", 0, 1)
	fx.expectGPUs(t, "job_2/step_0/user/task_1", 3)
	fx.expectGPUs(t, "job_2/step_0/user/task_0")
	if err := f.Remove(task1); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_1", 0, 1)
	if err := f.Set(task1, Policy{}); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_1")
	fx.expectGPUs(t, "job_1/step_0/user/task_0", 0, 1)
}
