// SPDX-License-Identifier: Apache-2.0

package verifycgroup

import "testing"

func TestNames(t *testing.T) {
	if got, want := Dir("/sys/fs/cgroup/system.slice/slurmstepd.scope", 42), "/sys/fs/cgroup/system.slice/slurmstepd.scope/gpufence-verify-42"; got != want {
		t.Errorf("Dir = %q, want %q", got, want)
	}
	tests := []struct {
		name string
		pid  int
		ok   bool
	}{
		{"gpufence-verify-42", 42, true},
		{"gpufence-verify-1", 1, true},
		{"gpufence-verify-2147483647", 2147483647, true},
		{"gpufence-verify-2147483648", 0, false}, // beyond a pid
		{"gpufence-verify-042", 0, false},        // not the decimal form
		{"gpufence-verify-", 0, false},
		{"gpufence-verify--1", 0, false},
		{"gpufence-verify-4x", 0, false},
		{"job_42", 0, false},
		{"gpufence-verify-42/given", 0, false},
	}
	for _, tt := range tests {
		pid, ok := PID(tt.name)
		if pid != tt.pid || ok != tt.ok || IsDir(tt.name) != tt.ok {
			t.Errorf("PID(%q) = %d, %v; IsDir = %v; want %d, %v", tt.name, pid, ok, IsDir(tt.name), tt.pid, tt.ok)
		}
	}
}
