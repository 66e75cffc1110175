// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// ScopeCgroupID returns the id of the cgroup the scope link is attached to
// as the kernel reports it: 0 once that cgroup is gone (the link is defunct:
// a scope made again at the same path is a new cgroup the program is not
// on). Only for ModeScope.
func (f *Filter) ScopeCgroupID() (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, ErrClosed
	}
	if f.mode != ModeScope || f.scopeLink == nil {
		return 0, fmt.Errorf("device filter in %s mode has no scope link", f.mode)
	}
	return linkCgroupID(f.scopeLink)
}

func linkCgroupID(l link.Link) (uint64, error) {
	info, err := l.Info()
	if err != nil {
		return 0, fmt.Errorf("read device filter link: %w", err)
	}
	c := info.Cgroup()
	if c == nil {
		return 0, errors.New("device filter link is not a cgroup link")
	}
	return c.CgroupId, nil
}

// Reattach moves the program onto scopeDir, Slurm's scope as it is now: the
// scope cgroup was removed and made again (an admin stopped its unit, its
// keep-alive died, Slurm was upgraded), so the old link is defunct and new
// job cgroups below the new scope would run unfiltered. The new link is
// attached before the old one is let go and, with a pin directory, pinned
// over the old pin in one rename, and the pinned state names the new scope.
// Policies are kept: they are keyed by step cgroup ids, which never repeat.
// Only for ModeScope.
func (f *Filter) Reattach(scopeDir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return ErrClosed
	}
	if f.mode != ModeScope {
		return fmt.Errorf("device filter in %s mode has no scope link", f.mode)
	}
	level, err := scopeLevel(scopeDir)
	if err != nil {
		return fmt.Errorf("re-attach device filter: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(scopeDir, &st); err != nil {
		return fmt.Errorf("re-attach device filter: %w", err)
	}
	if uint32(level) != f.cfg.ScopeLevel {
		// The program finds a task's job and step by their depth below
		// the scope; set it before any task of the new scope is judged.
		cfg := f.cfg
		cfg.ScopeLevel = uint32(level)
		if err := putConfig(f.config, cfg); err != nil {
			return fmt.Errorf("re-attach device filter: set scope level: %w", err)
		}
		f.cfg = cfg
	}
	l, err := attach(scopeDir, st.Ino, f.program)
	if err != nil {
		return err
	}
	if f.pinDir != "" {
		if err := pinOver(f.pinDir, pinLinkName, l.Pin); err != nil {
			return errors.Join(err, l.Close())
		}
		if err := f.pinScopeID(st.Ino); err != nil {
			return err
		}
	}
	old := f.scopeLink
	f.scopeLink = l
	if old != nil {
		// Defunct, or on a cgroup that is no longer Slurm's scope: the pin
		// names the new link now, so detach the old one explicitly.
		if err := old.Detach(); err != nil && !errors.Is(err, link.ErrNotSupported) {
			f.log.Warn("detach the old device filter link", "err", err)
		}
		if err := old.Close(); err != nil {
			f.log.Warn("close the old device filter link", "err", err)
		}
	}
	f.log.Info("device filter re-attached", "scope", scopeDir, "scope_cgroup_id", st.Ino, "scope_level", level)
	return nil
}

// pinScopeID records a new scope cgroup id in the pinned state map, so that
// a restarted agent adopts the pins for the new scope.
func (f *Filter) pinScopeID(id uint64) error {
	m, st, err := loadState(f.pinDir)
	if m != nil {
		defer m.Close()
	}
	if err != nil {
		return fmt.Errorf("re-attach device filter: %w", err)
	}
	st.ScopeID = id
	if err := m.Put(uint32(0), &st); err != nil {
		return fmt.Errorf("re-attach device filter: update pinned state: %w", err)
	}
	return nil
}
