// SPDX-License-Identifier: Apache-2.0

package jobcgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Node is this node's /proc and cgroupfs, as the request stages read them
// (agent/handler, agent/enforcer, agent/reconcile each name the part they
// use as an interface of their own, which a test fills with an in-memory
// node).
type Node struct{}

// PathOf is PathOf: pid's cgroup, relative to the mount.
func (Node) PathOf(pid int) (string, error) { return PathOf(pid) }

// ID is ID: the cgroup id of dir.
func (Node) ID(dir string) (uint64, error) { return ID(dir) }

// Owner returns the uid that owns cgroup directory dir.
func (Node) Owner(dir string) (uint32, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("stat cgroup %s: %w", dir, err)
	}
	return st.Uid, nil
}

// Find is Find: Slurm's scope on this node as it is now.
func (Node) Find(w Where) Found { return Find(w) }

// Slurmd is f.Slurmd: slurmd's cgroup outside the scope.
func (Node) Slurmd(f Found, mount, pidFile string) (string, error) { return f.Slurmd(mount, pidFile) }

// Dirs returns the directories that match pattern (filepath.Glob).
func (Node) Dirs(pattern string) []string {
	matches, _ := filepath.Glob(pattern)
	out := matches[:0]
	for _, m := range matches {
		if fi, err := os.Stat(m); err == nil && fi.IsDir() {
			out = append(out, m)
		}
	}
	return out
}
