// SPDX-License-Identifier: Apache-2.0

package jobcgroup

import (
	"strings"
	"testing"
)

func TestTaskOf(t *testing.T) {
	const mount = "/sys/fs/cgroup"
	const step = mount + "/system.slice/n1_slurmstepd.scope/job_7/step_0"
	const rel = "/system.slice/n1_slurmstepd.scope/job_7/step_0"
	tests := []struct {
		cg, want, wantErr string
	}{
		{cg: rel + "/user/task_0", want: step + "/user/task_0"},
		{cg: rel + "/user/task_12", want: step + "/user/task_12"},
		{cg: rel + "/user/task_4294967295", want: step + "/user/task_4294967295"},
		{cg: rel, wantErr: "not inside"},
		{cg: rel + "/slurm", wantErr: "not a task"},
		{cg: rel + "/user", wantErr: "not a task"},
		{cg: rel + "/user/task_special", wantErr: "no cgroup of its own for each task"},
		{cg: rel + "/user/task_", wantErr: "not a task"},
		{cg: rel + "/user/task_01", wantErr: "not a task"},
		{cg: rel + "/user/task_-1", wantErr: "not a task"},
		{cg: rel + "/user/task_12345678901", wantErr: "not a task"},
		{cg: rel + "/user/task_0/sub", wantErr: "not a task"},
		{cg: rel + "/other/task_0", wantErr: "not a task"},
		{cg: "/system.slice/n1_slurmstepd.scope/job_7/step_1/user/task_0", wantErr: "not inside"},
		{cg: "/system.slice/n1_slurmstepd.scope/job_7/step_00/user/task_0", wantErr: "not inside"},
		{cg: rel + "/user/../../step_1/user/task_0", wantErr: "not inside"},
		{cg: rel + "/user/./task_3", want: step + "/user/task_3"},
		{cg: "/user.slice/job_7/step_0/user/task_0", wantErr: "not inside"},
	}
	for _, tt := range tests {
		got, err := TaskOf(mount, tt.cg, step)
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("TaskOf(%q) = %q, %v; want an error with %q", tt.cg, got, err, tt.wantErr)
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("TaskOf(%q) = %q, %v; want %q", tt.cg, got, err, tt.want)
		}
	}
}
