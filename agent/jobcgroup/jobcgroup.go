// SPDX-License-Identifier: Apache-2.0

// Package jobcgroup finds where a Slurm job step lives in the cgroup v2 tree,
// always from a process's own /proc/<pid>/cgroup, never by building a path from
// a job id (Slurm's naming changes between releases, e.g. SLUID job dirs in
// 26.05).
package jobcgroup

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/cgroups/v3"
	"golang.org/x/sys/unix"
)

// ErrNoCgroup2 is returned on hosts without a cgroup v2 hierarchy.
var ErrNoCgroup2 = errors.New("no cgroup v2 hierarchy mounted (gpufence needs Slurm's cgroup/v2 plugin)")

// Mountpoint returns where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup
// on unified hosts, /sys/fs/cgroup/unified on hybrid ones.
func Mountpoint() (string, error) {
	switch cgroups.Mode() {
	case cgroups.Unified:
		return "/sys/fs/cgroup", nil
	case cgroups.Hybrid:
		return "/sys/fs/cgroup/unified", nil
	}
	return "", ErrNoCgroup2
}

// Location is a step's place in Slurm's tree:
// <Scope>/<job dir>/<step dir>/..., each an absolute directory.
type Location struct {
	Scope string
	Job   string
	Step  string
}

// IsScopeName reports whether a cgroup directory name is Slurm's scope for
// slurmstepds: "slurmstepd.scope", or "<node>_slurmstepd.scope" when Slurm is
// built with multiple-slurmd support (Debian's packages are).
func IsScopeName(name string) bool {
	return name == "slurmstepd.scope" || strings.HasSuffix(name, "_slurmstepd.scope")
}

// Parse splits the cgroup path of a process (as in /proc/<pid>/cgroup,
// relative to the mount) into scope, job and step directories. scope, when not
// empty, is the configured scope directory the path must be under.
func Parse(mount, cgPath, scope string) (Location, error) {
	clean := path.Clean("/" + cgPath)
	parts := strings.Split(strings.TrimPrefix(clean, "/"), "/")
	idx := -1
	if scope != "" {
		rel, err := filepath.Rel(mount, scope)
		if err != nil || strings.HasPrefix(rel, "..") {
			return Location{}, fmt.Errorf("scope %s is not inside the cgroup v2 mount %s", scope, mount)
		}
		sp := strings.Split(rel, "/")
		if len(parts) > len(sp) && slices.Equal(parts[:len(sp)], sp) {
			idx = len(sp) - 1
		}
	} else {
		for i, p := range parts {
			if IsScopeName(p) {
				idx = i
				break
			}
		}
	}
	if idx < 0 {
		return Location{}, fmt.Errorf("cgroup %s is not inside Slurm's slurmstepd scope", clean)
	}
	if len(parts) < idx+3 {
		return Location{}, fmt.Errorf("cgroup %s is not inside a job step of Slurm's slurmstepd scope", clean)
	}
	scopeDir := filepath.Join(append([]string{mount}, parts[:idx+1]...)...)
	return Location{
		Scope: scopeDir,
		Job:   filepath.Join(scopeDir, parts[idx+1]),
		Step:  filepath.Join(scopeDir, parts[idx+1], parts[idx+2]),
	}, nil
}

// PathOf returns the cgroup v2 path of pid, relative to the mount.
func PathOf(pid int) (string, error) {
	_, unified, err := cgroups.ParseCgroupFileUnified(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", fmt.Errorf("read cgroup of pid %d: %w", pid, err)
	}
	if unified == "" {
		return "", fmt.Errorf("pid %d has no cgroup v2 entry", pid)
	}
	return unified, nil
}

// ID returns the cgroup id of a cgroup v2 directory, which is its inode
// number; the kernel's bpf_get_current_ancestor_cgroup_id returns the same.
func ID(dir string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("stat cgroup %s: %w", dir, err)
	}
	return st.Ino, nil
}

// TaskOf returns the task cgroup a process whose cgroup is cgPath (as
// /proc/<pid>/cgroup names it, relative to mount) runs in, when that is a
// task of step (an absolute step directory): exactly
// <step>/user/task_<N>, where Slurm's task/cgroup puts each task of a step
// (cgroup/v2, 22.05 and later), at scope level + 4. Anything else (the
// step itself, slurmstepd's <step>/slurm, task_special, another step's
// task, a cgroup below a task) is an error: only such a cgroup gets a
// task's own kernel entry.
func TaskOf(mount, cgPath, step string) (string, error) {
	got := filepath.Join(mount, path.Clean("/"+cgPath))
	rel, err := filepath.Rel(filepath.Clean(step), got)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("cgroup %s is not inside the step's cgroup %s", got, step)
	}
	parts := strings.Split(rel, "/")
	if len(parts) == 2 && parts[0] == "user" && parts[1] == "task_special" {
		return "", ErrNoTaskCgroup
	}
	if len(parts) != 2 || parts[0] != "user" || !isTaskName(parts[1]) {
		return "", fmt.Errorf("cgroup %s is not a task of the step's cgroup %s (want %s/user/task_<N>)", got, step, step)
	}
	return got, nil
}

// ErrNoTaskCgroup is TaskOf's answer for a process in its step's
// user/task_special: Slurm's cgroup/v2 puts every task there when no
// plugin asks for per-task cgroups (no ConstrainRAMSpace, ConstrainDevices
// or, from 25.05, ConstrainCores; no jobacct_gather/cgroup), so the tasks
// of the step share one cgroup and no entry can tell them apart.
var ErrNoTaskCgroup = errors.New("Slurm made no cgroup of its own for each task of this step (its tasks share user/task_special: cgroup.conf constrains nothing per task); per-task binding needs ConstrainRAMSpace=yes, or ConstrainCores=yes from Slurm 25.05 on")

// isTaskName reports whether name is task_<N>, N a decimal task id as
// Slurm prints it ("%u": no sign, no leading zero).
func isTaskName(name string) bool {
	n, ok := strings.CutPrefix(name, "task_")
	if !ok || n == "" || len(n) > 10 || (n[0] == '0' && len(n) > 1) {
		return false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
