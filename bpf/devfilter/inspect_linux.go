// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// PinnedView is what a filter left pinned in a directory, read without
// changing anything (for `gpufence status`, which runs while the agent may
// be down). Fields that could not be read are zero and named in Errors.
type PinnedView struct {
	Dir string
	// Pins are the gpufence pin names found in Dir, sorted; none means
	// nothing is pinned (the other fields are then zero).
	Pins []string
	// Version, Mode and ScopeID come from the state map.
	Version uint32
	Mode    Mode
	ScopeID uint64
	// Config is what the program's config map holds; nil when unreadable.
	Config *PinnedConfig
	// Link is the scope link (ModeScope); nil when absent or unreadable.
	Link *PinnedLink
	// SlurmdLink is the link on slurmd's cgroup outside the scope
	// (ModeScope, link_slurmd); nil when absent or unreadable.
	SlurmdLink *PinnedLink
	// Entries are the kernel's policies by cgroup id: the policies map
	// (ModeScope) or the cgroup_<id> pins with their storage (ModePerCgroup).
	Entries map[uint64]PinnedEntry
	// Lost is the per-CPU lost counter summed (events the ring buffer had
	// no room for), RateFull the rate_full one over every decision
	// (accesses not reported because the rate map was full; an older
	// program counted accesses reported without rate limit there),
	// RateEntries the number of entries in the rate map.
	Lost, RateFull uint64
	RateEntries    int
	// Errors are what could not be read.
	Errors []string
}

// PinnedConfig is the program's configuration as the config map holds it.
type PinnedConfig struct {
	NvidiaMajor uint32
	// CapsMajor is the nvidia-caps major the program narrows; 0: none.
	CapsMajor uint32
	// NVSwitchMajor and NVLinkMajor are the management majors the program
	// denies to job steps; 0: none (or a program older than these fields).
	NVSwitchMajor, NVLinkMajor uint32
	// IMEXMajor is the IMEX channel major the program narrows; 0: none (or
	// a program older than this field).
	IMEXMajor    uint32
	AuditOnly    bool
	AuditAllowed AuditAllowed
	RateWindow   time.Duration
	RateBurst    uint32
}

// PinnedLink describes a pinned bpf_link, like `bpftool link show`.
type PinnedLink struct {
	Pin         string
	ID          uint32
	ProgramID   uint32
	ProgramName string
	// CgroupID is the cgroup the link is attached to; 0 once that cgroup is
	// gone (the link is defunct).
	CgroupID uint64
}

// PinnedEntry is the kernel's policy for one cgroup.
type PinnedEntry struct {
	CgroupID uint64
	Policy   Policy
	// Link is the per-cgroup link (ModePerCgroup), else nil.
	Link *PinnedLink
	// PolicyErr says why the policy could not be read (ModePerCgroup), else "".
	PolicyErr string
}

// InspectPins reads what a filter pinned in dir. Maps are opened read-only
// and nothing is written, detached or removed; links are opened only to read
// their info. A dir that does not exist or holds no pins gives an empty view
// and no error; an unreadable state map is an error.
func InspectPins(dir string) (*PinnedView, error) {
	v := &PinnedView{Dir: dir, Entries: map[uint64]PinnedEntry{}}
	names, err := pinNames(dir)
	if err != nil {
		return v, err
	}
	slices.Sort(names)
	v.Pins = names
	if len(names) == 0 {
		return v, nil
	}
	fail := func(format string, args ...any) { v.Errors = append(v.Errors, fmt.Sprintf(format, args...)) }

	st, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinStateName), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return v, fmt.Errorf("open pinned device filter state: %w", err)
	}
	var ps pinState
	err = stateSpec.Compatible(st)
	if err == nil {
		err = st.Lookup(uint32(0), &ps)
	}
	st.Close()
	if err != nil {
		return v, fmt.Errorf("read pinned device filter state: %w", err)
	}
	v.Version, v.ScopeID = ps.Version, ps.ScopeID
	switch ps.Mode {
	case pinModeScope:
		v.Mode = ModeScope
	case pinModePerCgrp:
		v.Mode = ModePerCgroup
	default:
		return v, fmt.Errorf("pinned device filter state: unknown mode %d (layout version %d)", ps.Mode, ps.Version)
	}

	open := func(n string) *ebpf.Map {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinMapPrefix+n), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			fail("map %s: %v", n, err)
			return nil
		}
		return m
	}
	if m := open("config"); m != nil {
		if c, err := readConfig(m); err != nil {
			fail("map config: %v", err)
		} else {
			v.Config = &PinnedConfig{NvidiaMajor: c.NvidiaMajor, CapsMajor: c.CapsMajor, AuditOnly: c.AuditOnly != 0,
				RateWindow: time.Duration(c.RateWindowNs), RateBurst: c.RateBurst,
				NVSwitchMajor: c.NvswitchMajor, NVLinkMajor: c.NvlinkMajor, IMEXMajor: c.ImexMajor}
			for name, code := range auditAllowedCodes {
				if uint32(code) == c.AuditAllowed {
					v.Config.AuditAllowed = name
				}
			}
		}
		m.Close()
	}
	for _, n := range []string{"lost", "rate_full"} {
		m := open(n)
		if m == nil {
			continue
		}
		var total uint64
		// Every entry: rate_full counts by decision (one entry in its
		// first layout), lost in entry 0.
		for k := range m.MaxEntries() {
			var perCPU []uint64
			if err := m.Lookup(k, &perCPU); err != nil {
				fail("map %s: %v", n, err)
				break
			}
			total += sum(perCPU)
		}
		if n == "lost" {
			v.Lost = total
		} else {
			v.RateFull = total
		}
		m.Close()
	}
	if m := open("rate"); m != nil {
		k, val := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
		it := m.Iterate()
		for it.Next(k, val) {
			v.RateEntries++
		}
		if err := it.Err(); err != nil {
			fail("map rate: %v", err)
		}
		m.Close()
	}

	if v.Mode == ModeScope {
		if slices.Contains(names, pinLinkName) {
			l, err := readLink(dir, pinLinkName)
			if err != nil {
				fail("%v", err)
			}
			v.Link = l
		}
		if slices.Contains(names, pinSlurmdLink) {
			l, err := readLink(dir, pinSlurmdLink)
			if err != nil {
				fail("%v", err)
			}
			v.SlurmdLink = l
		}
		if m := open("policies"); m != nil {
			var id uint64
			// Raw values: the map may still have an older layout.
			val := make([]byte, m.ValueSize())
			it := m.Iterate()
			for it.Next(&id, val) {
				p, err := decodePolicyValue(val)
				if err != nil {
					fail("map policies: cgroup %d: %v", id, err)
					continue
				}
				v.Entries[id] = PinnedEntry{CgroupID: id, Policy: decodePolicy(p)}
			}
			if err := it.Err(); err != nil {
				fail("map policies: %v", err)
			}
			m.Close()
		}
		return v, nil
	}

	storage := open("storage")
	if storage != nil {
		defer storage.Close()
	}
	for _, n := range names {
		id, err := strconv.ParseUint(strings.TrimPrefix(n, pinCgroupPref), 10, 64)
		if !strings.HasPrefix(n, pinCgroupPref) || err != nil {
			continue // not a cgroup link, or a _new left by a crash
		}
		e := PinnedEntry{CgroupID: id}
		l, err := readLink(dir, n)
		if err != nil {
			fail("%v", err)
		}
		e.Link = l
		switch {
		case storage == nil:
			e.PolicyErr = "no storage map"
		case l != nil && l.CgroupID == 0:
			e.PolicyErr = "link defunct: its cgroup is gone"
		default:
			if val, err := lookupPolicy(storage, storageKey(id)); err != nil {
				e.PolicyErr = err.Error()
			} else {
				e.Policy = decodePolicy(val)
			}
		}
		v.Entries[id] = e
	}
	return v, nil
}

// readLink reads the info of the link pinned at dir/name and of its program.
// (A link pin cannot be opened read-only; nothing is changed through it.)
func readLink(dir, name string) (*PinnedLink, error) {
	l, err := link.LoadPinnedLink(filepath.Join(dir, name), nil)
	if err != nil {
		return nil, fmt.Errorf("pinned link %s: %w", name, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return nil, fmt.Errorf("pinned link %s: %w", name, err)
	}
	out := &PinnedLink{Pin: name, ID: uint32(info.ID), ProgramID: uint32(info.Program)}
	if c := info.Cgroup(); c != nil {
		out.CgroupID = c.CgroupId
	}
	if p, err := ebpf.NewProgramFromID(info.Program); err == nil {
		if pi, err := p.Info(); err == nil {
			out.ProgramName = pi.Name
		}
		p.Close()
	}
	return out, nil
}
