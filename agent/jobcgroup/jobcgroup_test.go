// SPDX-License-Identifier: Apache-2.0

package jobcgroup

import (
	"os"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	const m = "/sys/fs/cgroup"
	scope := m + "/system.slice/vm_slurmstepd.scope"
	tests := []struct {
		path, scope string
		want        Location
		wantErr     string
	}{
		{path: "/system.slice/vm_slurmstepd.scope/job_5/step_0/user/task_special",
			want: Location{Scope: scope, Job: scope + "/job_5", Step: scope + "/job_5/step_0"}},
		{path: "/system.slice/vm_slurmstepd.scope/job_5/step_batch/slurm",
			want: Location{Scope: scope, Job: scope + "/job_5", Step: scope + "/job_5/step_batch"}},
		{path: "/system.slice/slurmstepd.scope/job_9/step_extern/user/task_0",
			want: Location{Scope: m + "/system.slice/slurmstepd.scope", Job: m + "/system.slice/slurmstepd.scope/job_9", Step: m + "/system.slice/slurmstepd.scope/job_9/step_extern"}},
		{path: "/system.slice/vm_slurmstepd.scope/job_5/step_0/user/task_0", scope: scope,
			want: Location{Scope: scope, Job: scope + "/job_5", Step: scope + "/job_5/step_0"}},
		{path: "/custom/slurm/job_5/step_0/user/task_0", scope: m + "/custom/slurm",
			want: Location{Scope: m + "/custom/slurm", Job: m + "/custom/slurm/job_5", Step: m + "/custom/slurm/job_5/step_0"}},
		{path: "/system.slice/vm_slurmstepd.scope/slurmd", wantErr: "not inside a job step"},
		{path: "/system.slice/vm_slurmstepd.scope/job_5", wantErr: "not inside a job step"},
		{path: "/user.slice/user-1000.slice/session-1.scope", wantErr: "not inside Slurm's slurmstepd scope"},
		{path: "/", wantErr: "not inside Slurm's slurmstepd scope"},
		{path: "/other/job_5/step_0", scope: scope, wantErr: "not inside Slurm's slurmstepd scope"},
		{path: "/system.slice/vm_slurmstepd.scope/job_5/step_0", scope: "/elsewhere", wantErr: "not inside the cgroup v2 mount"},
	}
	for _, tt := range tests {
		got, err := Parse(m, tt.path, tt.scope)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse(%q, %q) err = %v, want %q", tt.path, tt.scope, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Parse(%q, %q) = %+v, %v; want %+v", tt.path, tt.scope, got, err, tt.want)
		}
	}
}

func TestPathOfSelf(t *testing.T) {
	if _, err := Mountpoint(); err != nil {
		t.Skipf("no cgroup v2 here: %v", err)
	}
	p, err := PathOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p, "/") {
		t.Errorf("PathOf(self) = %q, want an absolute cgroup path", p)
	}
	if _, err := PathOf(-5); err == nil {
		t.Error("PathOf(-5) gave no error")
	}
}
