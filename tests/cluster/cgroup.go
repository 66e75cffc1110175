// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// prepareCgroups finds cgroup2, creates <cgroup2>/<slice> when absent
// (IgnoreSystemd=yes needs it) and notes which cgroups already exist under
// each scope Slurm may make (with or without the node name), so that Stop
// removes only the ones made during this run.
func (c *Cluster) prepareCgroups() error {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	mount, err := cgroup2Mount(string(mi))
	if err != nil {
		return err
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	c.st.Hybrid = isHybrid(string(self))
	slice := filepath.Join(mount, c.slice())
	c.st.ScopeCandidates = []string{
		filepath.Join(slice, c.st.Host+"_slurmstepd.scope"),
		filepath.Join(slice, "slurmstepd.scope"),
	}
	if c.multiNode() {
		// Only the nodes' own: the host's scopes are a single-node
		// cluster's, which may start while this one is up (gfcluster
		// up holds no lock once it returned), and Stop removes what
		// appeared under a candidate since Start.
		c.st.ScopeCandidates = nil
		for _, n := range c.st.Nodes {
			c.st.ScopeCandidates = append(c.st.ScopeCandidates, filepath.Join(slice, n.Name+"_slurmstepd.scope"))
		}
	}
	c.st.ScopesBefore = map[string][]string{}
	c.st.ScopeExisted = map[string]bool{}
	// Checked before CgroupMount is recorded: Stop cleans cgroups only once
	// it is set, so a refused start never touches another cluster's.
	for _, scope := range c.st.ScopeCandidates {
		if _, err := os.Stat(scope); err != nil {
			continue
		}
		if populated(scope) {
			return fmt.Errorf("%s holds processes: another Slurm runs on this node; stop it first", scope)
		}
		before, err := listCgroups(scope)
		if err != nil {
			return err
		}
		c.st.ScopeExisted[scope] = true
		c.st.ScopesBefore[scope] = before
	}
	if _, err := os.Stat(slice); os.IsNotExist(err) {
		if err := os.Mkdir(slice, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", slice, err)
		}
		c.st.CreatedSystemSlice = true
	}
	c.st.CgroupMount = mount
	return nil
}

// listCgroups returns the cgroups below dir (not dir itself), relative to it.
func listCgroups(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking
			}
			return err
		}
		if d.IsDir() && p != dir {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return out, err
}

func populated(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	return err == nil && strings.Contains(string(b), "populated 1")
}

func cgroupPIDs(dir string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// ownCgroups are the cgroups under the scope that Slurm made during this
// run, deepest first (under every candidate scope while slurmd has not yet
// shown which one it uses).
func (c *Cluster) ownCgroups() ([]string, error) {
	scopes := c.st.ScopeCandidates
	if c.st.Scope != "" {
		scopes = []string{c.st.Scope}
	}
	var own []string
	for _, scope := range scopes {
		all, err := listCgroups(scope)
		if err != nil {
			return nil, err
		}
		before := map[string]bool{}
		for _, p := range c.st.ScopesBefore[scope] {
			before[p] = true
		}
		for _, rel := range all {
			if !before[rel] {
				own = append(own, filepath.Join(scope, rel))
			}
		}
	}
	sortDeepestFirst(own)
	return own, nil
}

// cleanCgroups kills what is left in cgroups our slurmd made (leftover
// slurmstepds and tasks, by PID) and removes those cgroups, then the scope
// and the slice if the harness run made them. A cgroup that still holds
// processes is never removed.
func (c *Cluster) cleanCgroups() error {
	own, err := c.ownCgroups()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := 0
		for _, d := range own {
			for _, pid := range cgroupPIDs(d) {
				left++
				c.logf("killing leftover pid %d in %s", pid, d)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	rm := func(d string) {
		if populated(d) {
			errs = append(errs, fmt.Errorf("cgroup %s still holds processes %v: left in place", d, cgroupPIDs(d)))
			return
		}
		if err := rmdirRetry(d); err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	for _, d := range own {
		rm(d)
	}
	for _, scope := range c.st.ScopeCandidates {
		if c.st.ScopeExisted[scope] {
			continue
		}
		if _, err := os.Stat(scope); err == nil {
			rm(scope)
		}
	}
	if c.st.CreatedSystemSlice {
		slice := filepath.Join(c.st.CgroupMount, c.slice())
		if _, err := os.Stat(slice); err == nil {
			rm(slice)
		}
	}
	return joinErrs(errs)
}

// rmdirRetry removes a cgroup, retrying EBUSY for a moment: a killed task's
// cgroup stays busy until the kernel has finished tearing it down.
func rmdirRetry(d string) error {
	var err error
	for range 50 {
		err = syscall.Rmdir(d)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
