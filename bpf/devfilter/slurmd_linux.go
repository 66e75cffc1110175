// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// AttachSlurmd attaches the scope program to slurmd's own cgroup dir (cgroup
// id id) too, for a slurmd outside the scope: under systemd slurmd runs in
// slurmd.service, where the child it forks to serve sbcast drops to the
// job's user and opens the destination, any device node included. The
// program decides a task there by its own cgroup's entry, which the caller
// writes first (allow-all for root only), so slurmd's NVML never meets a
// missing entry. Like the scope link it is a bpf_link (BPF_F_ALLOW_MULTI:
// systemd's own device program on the unit stays and must allow too),
// pinned as link_slurmd over any previous one, whose cgroup (a
// slurmd.service systemd removed at a restart) is then let go. Attaching
// to the cgroup the link is already on does nothing. Only for ModeScope.
func (f *Filter) AttachSlurmd(dir string, id uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return ErrClosed
	}
	if f.mode != ModeScope {
		return fmt.Errorf("device filter in %s mode has no scope program to attach to slurmd's cgroup", f.mode)
	}
	if id == 0 {
		return fmt.Errorf("attach device filter to slurmd's cgroup %s: cgroup id 0", dir)
	}
	if f.slurmdLink != nil {
		if on, err := linkCgroupID(f.slurmdLink); err == nil && on == id {
			return nil
		}
	}
	l, err := attach(dir, id, f.program)
	if err != nil {
		return err
	}
	if f.pinDir != "" {
		if err := pinOver(f.pinDir, pinSlurmdLink, l.Pin); err != nil {
			return errors.Join(err, l.Close())
		}
	}
	old := f.slurmdLink
	f.slurmdLink = l
	if old != nil {
		// The pin names the new link now: detach the old one explicitly.
		if err := old.Detach(); err != nil && !errors.Is(err, link.ErrNotSupported) {
			f.log.Warn("detach the old device filter link of slurmd's cgroup", "err", err)
		}
		old.Close()
	}
	f.log.Info("device filter attached to slurmd's cgroup", "cgroup", dir, "cgroup_id", id)
	return nil
}

// SlurmdCgroupID returns the id of the cgroup the slurmd link is on, as
// the kernel reports it: 0 when there is no such link, and 0 or the old id
// once its cgroup is gone (a slurmd.service systemd removed at a restart:
// the link is defunct; the kernel reports 0 once it freed the cgroup).
func (f *Filter) SlurmdCgroupID() (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, ErrClosed
	}
	if f.slurmdLink == nil {
		return 0, nil
	}
	return linkCgroupID(f.slurmdLink)
}

// DetachSlurmd detaches the program from slurmd's cgroup and removes its
// pin (slurmd now runs inside the scope, which covers it).
func (f *Filter) DetachSlurmd() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return ErrClosed
	}
	if f.slurmdLink == nil {
		return nil
	}
	var errs []error
	if err := f.slurmdLink.Detach(); err != nil && !errors.Is(err, link.ErrNotSupported) {
		errs = append(errs, fmt.Errorf("detach device filter from slurmd's cgroup: %w", err))
	}
	if f.pinDir != "" {
		if err := unlinkPin(filepath.Join(f.pinDir, pinSlurmdLink)); err != nil {
			errs = append(errs, fmt.Errorf("unpin device filter of slurmd's cgroup: %w", err))
		}
	}
	errs = append(errs, f.slurmdLink.Close())
	f.slurmdLink = nil
	return errors.Join(errs...)
}

// adoptSlurmdLink takes over the pinned slurmd link of prev, swapping the
// new program in (BPF_LINK_UPDATE). A link whose cgroup is gone is
// removed: the agent attaches to slurmd's new cgroup when it finds it.
func (f *Filter) adoptSlurmdLink(prev *pinned) error {
	if prev.slurmd == nil {
		return nil
	}
	on, err := linkCgroupID(prev.slurmd)
	if err == nil && on != 0 {
		err = prev.slurmd.Update(f.program)
	}
	if err == nil && on != 0 {
		f.slurmdLink, prev.slurmd = prev.slurmd, nil
		return nil
	}
	if err != nil && !errors.Is(err, unix.ENOLINK) {
		return fmt.Errorf("update device filter program on slurmd's cgroup: %w", err)
	}
	f.log.Info("removing the device filter pin of slurmd's removed cgroup")
	return removePins(prev.dir, []string{pinSlurmdLink})
}

// PinnedSlurmdCgroup returns the id of the cgroup the slurmd link pinned
// in pinDir is on, 0 when there is none (or it is defunct): the entry of
// that cgroup is not stale although it is outside the scope.
func PinnedSlurmdCgroup(pinDir string) uint64 {
	l, err := link.LoadPinnedLink(filepath.Join(pinDir, pinSlurmdLink), nil)
	if err != nil {
		return 0
	}
	defer l.Close()
	id, _ := linkCgroupID(l)
	return id
}
