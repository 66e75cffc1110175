// SPDX-License-Identifier: Apache-2.0

// Package fakenode is a node in memory for the request stages' tests,
// which run as an ordinary user: the cgroup tree and /proc (Node), the
// kernel's device filter map (Filter, held to the real one by
// TestContract), the earlier agent's pins (Pins) and the pinned store
// (Store). Each stands behind an interface its consumer owns
// (handler.Cgroups, enforcer.Cgroups, enforcer.Filter, registry.Store,
// reconcile.Cgroups); none of it is used by the agent itself.
package fakenode

import (
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/gpufence/gpufence/agent/jobcgroup"
)

// Node is a cgroup tree below Mount and the processes in it. A directory
// made again at the same path gets a new id, as in cgroupfs (its inode).
type Node struct {
	Mount string

	mu    sync.Mutex
	dirs  map[string]dir
	procs map[int]string // pid -> absolute cgroup directory
	next  uint64

	scope     string
	findErr   error
	slurmd    string
	slurmdErr error
	finds     int
}

type dir struct {
	id  uint64
	uid uint32
}

// New returns a node whose cgroup mount is mount, holding only it.
func New(mount string) *Node {
	n := &Node{Mount: mount, dirs: map[string]dir{}, procs: map[int]string{}, next: 1000}
	n.dirs[mount] = dir{id: 1}
	return n
}

// Mkdir makes dir and its missing parents, root's, and returns dir's id;
// a directory that exists keeps its id.
func (n *Node) Mkdir(p string) uint64 { return n.MkdirOwned(p, 0) }

// MkdirOwned is Mkdir with the new directories owned by uid.
func (n *Node) MkdirOwned(p string, uid uint32) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mkdirLocked(filepath.Clean(p), uid)
}

func (n *Node) mkdirLocked(p string, uid uint32) uint64 {
	if d, ok := n.dirs[p]; ok {
		return d.id
	}
	if parent := filepath.Dir(p); parent != p {
		n.mkdirLocked(parent, uid)
	}
	n.next++
	n.dirs[p] = dir{id: n.next, uid: uid}
	return n.next
}

// Rmdir removes dir and everything below it; processes there are gone.
func (n *Node) Rmdir(p string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p = filepath.Clean(p)
	for d := range n.dirs {
		if jobcgroup.Within(d, p) {
			delete(n.dirs, d)
		}
	}
	for pid, cg := range n.procs {
		if jobcgroup.Within(cg, p) {
			delete(n.procs, pid)
		}
	}
}

// Recreate removes dir and makes it again: the same path, a new id.
func (n *Node) Recreate(p string) uint64 {
	n.Rmdir(p)
	return n.Mkdir(p)
}

// Run puts process pid in cgroup directory dir (made if missing).
func (n *Node) Run(pid int, d string) {
	n.Mkdir(d)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.procs[pid] = filepath.Clean(d)
}

// Exit ends process pid.
func (n *Node) Exit(pid int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.procs, pid)
}

// SetScope makes Find report scope as Slurm's ("" = none yet) and err as
// why none can be told.
func (n *Node) SetScope(scope string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.scope, n.findErr = scope, err
}

// SetSlurmd makes Slurmd report d as slurmd's cgroup outside the scope,
// and err.
func (n *Node) SetSlurmd(d string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.slurmd, n.slurmdErr = d, err
}

// Finds is how often Find was called.
func (n *Node) Finds() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.finds
}

// PathOf returns pid's cgroup relative to the mount, as /proc/<pid>/cgroup.
func (n *Node) PathOf(pid int) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	d, ok := n.procs[pid]
	if !ok {
		return "", fmt.Errorf("read cgroup of pid %d: %w", pid, fs.ErrNotExist)
	}
	rel, _ := filepath.Rel(n.Mount, d)
	return "/" + strings.TrimPrefix(rel, "."), nil
}

// ID returns dir's cgroup id.
func (n *Node) ID(p string) (uint64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	d, ok := n.dirs[filepath.Clean(p)]
	if !ok {
		return 0, fmt.Errorf("stat cgroup %s: %w", p, fs.ErrNotExist)
	}
	return d.id, nil
}

// Owner returns the uid owning dir.
func (n *Node) Owner(p string) (uint32, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	d, ok := n.dirs[filepath.Clean(p)]
	if !ok {
		return 0, fmt.Errorf("stat cgroup %s: %w", p, fs.ErrNotExist)
	}
	return d.uid, nil
}

// Exists reports whether a cgroup with id exists.
func (n *Node) Exists(id uint64) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, d := range n.dirs {
		if d.id == id {
			return true, nil
		}
	}
	return false, nil
}

// Dirs returns the directories matching pattern, sorted.
func (n *Node) Dirs(pattern string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for d := range n.dirs {
		if ok, _ := path.Match(pattern, d); ok {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// Find reports the scope SetScope set, when it exists.
func (n *Node) Find(w jobcgroup.Where) jobcgroup.Found {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.finds++
	f := jobcgroup.Found{Expected: []string{n.scope}, Err: n.findErr}
	if _, ok := n.dirs[n.scope]; ok && n.findErr == nil && n.scope != "" {
		f.Scope = n.scope
	}
	return f
}

// Slurmd reports what SetSlurmd set, when f has a scope.
func (n *Node) Slurmd(f jobcgroup.Found, mount, pidFile string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f.Scope == "" {
		return "", nil
	}
	return n.slurmd, n.slurmdErr
}
