// SPDX-License-Identifier: Apache-2.0

package handler

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/imexchan"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Cgroups is what the handler reads of the node: a process's cgroup
// (/proc/<pid>/cgroup, relative to the mount) and a cgroup directory's id
// and owner (cgroupfs). jobcgroup.Node is the node's; nil means it.
type Cgroups interface {
	PathOf(pid int) (string, error)
	ID(dir string) (uint64, error)
	Owner(dir string) (uint32, error)
}

// Watcher is told each registered step's cgroup, to report its removal
// (the step's end); *cgwatch.Watcher implements it.
type Watcher interface {
	Add(dir string, id uint64) error
}

// IMEXReader reads the IMEX channels a process's mount namespace holds;
// imexchan.Reader implements it.
type IMEXReader interface {
	Read(pid int, major uint32) ([]uint32, error)
}

// Mode is what the filter enforces, as records name it: enforce or
// audit-only (config enforcement, switched at run time). The zero value
// enforces; nil reads as enforce too.
type Mode struct{ auditOnly atomic.Bool }

// NewMode returns a mode, audit-only when auditOnly.
func NewMode(auditOnly bool) *Mode {
	m := &Mode{}
	m.auditOnly.Store(auditOnly)
	return m
}

// Set switches the mode.
func (m *Mode) Set(auditOnly bool) { m.auditOnly.Store(auditOnly) }

// AuditOnly reports whether the filter only audits.
func (m *Mode) AuditOnly() bool { return m != nil && m.auditOnly.Load() }

// String is the mode as audit records name it.
func (m *Mode) String() string {
	if m.AuditOnly() {
		return audit.ModeAuditOnly
	}
	return audit.ModeEnforce
}

// SettingsFile is Slurm's settings as slurm.conf (and cgroup.conf beside
// it) say now: re-read only when either changed, so a slurmd restarted
// with another ConstrainDevices is followed without an agent restart and
// without reading files on every step. It implements Settings.
type SettingsFile struct {
	Path string // slurm.conf

	mu    sync.Mutex
	stamp [2]time.Time
	val   slurm.Settings
	ok    bool
}

// Get returns the settings, re-read when the files changed.
func (c *SettingsFile) Get() (slurm.Settings, error) {
	stamp := [2]time.Time{mtime(c.Path), mtime(filepath.Join(filepath.Dir(c.Path), "cgroup.conf"))}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ok && stamp == c.stamp {
		return c.val, nil
	}
	v, err := slurm.ReadSettings(c.Path)
	if err != nil {
		return v, err
	}
	c.val, c.stamp, c.ok = v, stamp, true
	return v, nil
}

func mtime(path string) time.Time {
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

func (h *Handler) cgroups() Cgroups {
	if h.Cgroups == nil {
		return jobcgroup.Node{}
	}
	return h.Cgroups
}

func (h *Handler) imex() IMEXReader {
	if h.IMEX == nil {
		return imexchan.Reader{}
	}
	return h.IMEX
}

// forPID locates the step that pid runs in.
func (h *Handler) forPID(pid int) (jobcgroup.Location, error) {
	p, err := h.cgroups().PathOf(pid)
	if err != nil {
		return jobcgroup.Location{}, err
	}
	loc, err := jobcgroup.Parse(h.Mount, p, h.Scope)
	if err != nil {
		return jobcgroup.Location{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return loc, nil
}

// watch asks to be told when a step's cgroup goes.
func (h *Handler) watch(cg cgroup.Cgroup) {
	if h.Watch == nil || cg.Path == "" {
		return
	}
	if err := h.Watch.Add(cg.Path, cg.ID); err != nil {
		h.Log.Debug("step cgroup not watched; reconcile will find its end", "cgroup", cg.Path, "err", err)
	}
}

// WatchRecorded asks Watch to be told when each recorded step's cgroup
// goes (records taken back at start).
func (h *Handler) WatchRecorded() {
	for _, s := range h.Registry.Steps() {
		h.watch(s.Cgroup)
	}
}

// WriteRecorded writes, through set, the kernel entry of every recorded
// step whose cgroup is still the one recorded: a filter attached at start
// (again: a crash may have come between a record and its entry) gets them
// before it first enforces. A step whose cgroup went is left for reconcile
// to release.
func (h *Handler) WriteRecorded(set func(cgroup.Cgroup, devfilter.Policy) error) {
	for _, s := range h.Registry.Steps() {
		if id, err := h.cgroups().ID(s.Cgroup.Path); err != nil || id != s.Cgroup.ID {
			continue
		}
		var p devfilter.Policy // a list the table no longer holds: no GPU
		if set, err := h.Table.Devices(s.GPUs); err == nil {
			p = devfilter.Policy{GPUMinors: set.GPUMinors, CapsMinors: set.CapsMinors}
		}
		p.AuditOnly, p.IMEXChannels = s.AuditOnly, s.IMEXChannels
		if err := set(s.Cgroup, p); err != nil {
			h.Log.Error("restore a step's kernel entry", "job_id", s.JobID, "cgroup", s.Cgroup.Path, "err", err)
		}
	}
}
