// SPDX-License-Identifier: Apache-2.0

// Package verifycgroup names the cgroups `gpufence verify` makes below
// Slurm's scope, <scope>/gpufence-verify-<pid>/{given,bare}: the CLI that
// creates them and the agent that gives one of them a GPU share these names
// and nothing else.
package verifycgroup

import (
	"path/filepath"
	"strconv"
	"strings"
)

// Prefix starts the name of a verify cgroup's directory below the scope.
// No Slurm job cgroup has that name (job_<id>, or a SLUID without '-'),
// nor does Slurm's own (system, slurmd).
const Prefix = "gpufence-verify-"

// Given is the leaf given one GPU; Bare the one never registered (scope
// mode denies it every GPU, as a job nobody registered).
const (
	Given = "given"
	Bare  = "bare"
)

// Dir is the verify cgroup of the verify process pid below scope.
func Dir(scope string, pid int) string {
	return filepath.Join(scope, Prefix+strconv.Itoa(pid))
}

// IsDir reports whether name is a verify cgroup's directory name,
// gpufence-verify-<decimal pid>.
func IsDir(name string) bool {
	_, ok := PID(name)
	return ok
}

// PID is the pid a verify cgroup's directory name carries; ok is false
// when name is not one.
func PID(name string) (pid int, ok bool) {
	n, ok := strings.CutPrefix(name, Prefix)
	if !ok || n == "" || n[0] == '0' {
		return 0, false
	}
	v, err := strconv.ParseUint(n, 10, 31)
	if err != nil {
		return 0, false
	}
	return int(v), true
}
