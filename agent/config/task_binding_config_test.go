// SPDX-License-Identifier: Apache-2.0

package config

import "testing"

func TestTaskBinding(t *testing.T) {
	tests := []struct {
		body    string
		want    string
		wantErr []string
	}{
		{body: "", want: TaskBindingStep},
		{body: "task_binding: step\n", want: TaskBindingStep},
		{body: "task_binding: slurm\n", want: TaskBindingSlurm},
		{body: "task_binding: task\n", wantErr: []string{"task_binding", `"task"`, "step, slurm", "agent.yaml"}},
		{body: "task_binding: Slurm\n", wantErr: []string{"task_binding", `"Slurm"`}},
		{body: "task_binding: \"\"\n", wantErr: []string{"task_binding", `""`}},
	}
	for _, tt := range tests {
		if c, ok := loadYAML(t, tt.body, tt.wantErr); ok && c.TaskBinding != tt.want {
			t.Errorf("%q: TaskBinding = %q; want %q", tt.body, c.TaskBinding, tt.want)
		}
	}
}
