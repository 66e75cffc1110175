// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gpufence/gpufence/agent/mountinfo"
)

// staleGlob matches the roots Start makes itself (makeRoot with no root).
const staleGlob = "/var/tmp/gpufence-cluster-*"

// reapStale stops what a test cluster killed before its Stop left behind
// (a test binary killed by a timeout or by hand): its cgroups, its files
// and the mounts a suite made under its root, such as the e2e suite's
// bpffs. The pins in such a bpffs hold a device filter on the scope every
// test cluster of this host shares, so a later cluster's jobs would be
// judged by a dead agent's policy. Only roots Start made (staleGlob, with
// the state.json Start writes) whose daemons are all gone are touched; it
// runs under the cluster lock, so no other harness is starting one. A root
// whose daemons still run is an error: Start must not run beside it.
func reapStale(logf func(string, ...any), except string) error {
	roots, err := filepath.Glob(staleGlob)
	if err != nil {
		return err
	}
	var errs []error
	for _, root := range roots {
		if root == except {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, "state.json")); err != nil {
			continue
		}
		old, err := Load(root, logf)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !old.st.CreatedRoot || filepath.Clean(old.st.Root) != root {
			continue
		}
		alive := false
		for _, p := range old.Daemons() {
			if p.Alive() {
				alive = true
			}
		}
		if alive {
			// A cluster up on its own (gfcluster up), or one a killed
			// test left running: not stale, and not to run beside. Two
			// clusters share the node's name and so its scope, where each
			// would take the other's jobs and cgroups for its own.
			errs = append(errs, fmt.Errorf("a test cluster still runs in %s (gfcluster up, or a test killed before its Stop): stop it first with `go run ./tests/cmd/gfcluster down -root %s`", root, root))
			continue
		}
		logf("reaping the stale test cluster at %s (its daemons are gone)", root)
		if err := unmountUnder(root); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := old.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stale cluster %s: %w", root, err))
		}
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) error {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	points := mountsUnder(string(mi), dir)
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if out, err := exec.Command("umount", p).CombinedOutput(); err != nil {
			return fmt.Errorf("umount %s: %v %s", p, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// mountsUnder lists the mount points of a mountinfo text strictly below dir.
func mountsUnder(text, dir string) []string {
	mounts, err := mountinfo.Parse(strings.NewReader(text))
	if err != nil {
		return nil
	}
	prefix := filepath.Clean(dir) + "/"
	var points []string
	for _, m := range mounts {
		if strings.HasPrefix(m.MountPoint, prefix) {
			points = append(points, m.MountPoint)
		}
	}
	return points
}
