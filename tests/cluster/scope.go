// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// RecreateScope plays what stopping Slurm's scope does on a systemd node
// (`systemctl stop slurmd <node>_slurmstepd.scope`, or a maintenance
// script's `systemctl stop 'slurm*'`): slurmd is stopped, the empty scope
// cgroup is removed, and slurmd started again makes a new cgroup at the same
// path. No job may run. Only a scope this cluster created is removed; it
// returns the scope's cgroup id before and after.
func (c *Cluster) RecreateScope(ctx context.Context) (before, after uint64, err error) {
	return c.RecreateScopeThen(ctx, nil)
}

// RecreateScopeThen is RecreateScope calling whileGone, when not nil,
// after the scope is removed and before slurmd starts again: a test holds
// the node there until what it watches for happened.
func (c *Cluster) RecreateScopeThen(ctx context.Context, whileGone func() error) (before, after uint64, err error) {
	scope := c.ScopeDir()
	if c.st.Scope == "" || c.st.ScopeExisted[scope] || len(c.st.ScopesBefore[scope]) > 0 {
		return 0, 0, errors.New("the slurmstepd scope existed before this cluster started: not removing it")
	}
	if before, err = cgroupID(scope); err != nil {
		return 0, 0, err
	}
	if err := c.st.Slurmd.Stop(); err != nil {
		return 0, 0, fmt.Errorf("stop slurmd: %w", err)
	}
	own, err := c.ownCgroups()
	if err != nil {
		return 0, 0, err
	}
	for _, d := range append(own, scope) {
		if populated(d) {
			return 0, 0, fmt.Errorf("cgroup %s still holds processes %v: is a job running?", d, cgroupPIDs(d))
		}
		if err := rmdirRetry(d); err != nil {
			return 0, 0, fmt.Errorf("remove cgroup %s: %w", d, err)
		}
	}
	if whileGone != nil {
		if err := whileGone(); err != nil {
			return 0, 0, errors.Join(err, c.startSlurmd(ctx))
		}
	}
	if err := c.startSlurmd(ctx); err != nil {
		return 0, 0, fmt.Errorf("start slurmd after removing its scope: %w", err)
	}
	if after, err = cgroupID(scope); err != nil {
		return 0, 0, fmt.Errorf("slurmd did not make its scope again: %w", err)
	}
	return before, after, c.saveState()
}

func cgroupID(dir string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", dir, err)
	}
	if _, err := os.Stat(dir + "/cgroup.procs"); err != nil {
		return 0, fmt.Errorf("%s is not a cgroup: %w", dir, err)
	}
	return st.Ino, nil
}
