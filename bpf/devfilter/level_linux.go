// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/mountinfo"
)

// cgroupLevel returns the level of dir in the cgroup2 hierarchy (the root
// cgroup is level 0), as bpf_get_current_ancestor_cgroup_id counts it. dir
// must be clean and absolute; the mount with the longest matching mount
// point is used.
func cgroupLevel(mounts []mountinfo.Mount, dir string) (int, error) {
	dir = filepath.Clean(dir)
	best := -1
	for i, m := range mounts {
		if !within(m.MountPoint, dir) {
			continue
		}
		if best < 0 || len(m.MountPoint) > len(mounts[best].MountPoint) {
			best = i
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("%s is not inside a cgroup2 mount", dir)
	}
	m := mounts[best]
	rel, err := filepath.Rel(m.MountPoint, dir)
	if err != nil {
		return 0, fmt.Errorf("%s relative to %s: %w", dir, m.MountPoint, err)
	}
	return depth(m.Root) + depth(rel), nil
}

func within(parent, p string) bool {
	parent = filepath.Clean(parent)
	return p == parent || parent == "/" || strings.HasPrefix(p, parent+"/")
}

// depth counts the components of a relative or absolute clean path.
func depth(p string) int {
	n := 0
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			n++
		}
	}
	return n
}

// scopeLevel finds the level of the scope cgroup dir on this host.
func scopeLevel(dir string) (int, error) {
	if err := cgroup.CheckDir(dir, 0); err != nil {
		return 0, err
	}
	mounts, err := mountinfo.Read("/proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	return cgroupLevel(mountinfo.Cgroup2(mounts), dir)
}
