// SPDX-License-Identifier: Apache-2.0

package fakenode

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Filter is the kernel's device filter map in memory: what each cgroup
// id's entry holds, checked as bpf/devfilter checks it. TestContract runs
// the same cases against it and against the kernel's.
type Filter struct {
	mode devfilter.Mode
	node *Node

	mu        sync.Mutex
	entries   map[uint64]devfilter.Policy
	attached  map[uint64]bool // per-cgroup mode: the program is on the cgroup
	auditOnly bool
	scopeID   uint64
	slurmdID  uint64
	closed    bool
	done      chan struct{}
	sets      int

	// FailSet, when set, is the error of every Set (an exhausted map).
	FailSet error
	// FailReattach, when set, is the error of Reattach.
	FailReattach error
}

// NewFilter returns an empty filter in mode on scope (its id read from
// node; "" in per-cgroup mode).
func NewFilter(mode devfilter.Mode, node *Node, scope string) *Filter {
	f := &Filter{mode: mode, node: node, entries: map[uint64]devfilter.Policy{}, attached: map[uint64]bool{}, done: make(chan struct{})}
	if scope != "" && node != nil {
		f.scopeID, _ = node.ID(scope)
	}
	return f
}

// Mode is the mode the filter runs in.
func (f *Filter) Mode() devfilter.Mode { return f.mode }

func norm(u []uint32) []uint32 {
	if len(u) == 0 {
		return nil
	}
	out := slices.Clone(u)
	slices.Sort(out)
	return slices.Compact(out)
}

func check(cg cgroup.Cgroup, p devfilter.Policy) error {
	if cg.ID == 0 {
		return errors.New("cgroup id 0")
	}
	for _, m := range p.GPUMinors {
		if m > devfilter.MaxGPUMinor {
			return fmt.Errorf("GPU minor %d: larger than %d", m, devfilter.MaxGPUMinor)
		}
	}
	for _, m := range p.CapsMinors {
		if m < devfilter.FirstCapsAccessMinor || m > devfilter.MaxCapsMinor {
			return fmt.Errorf("nvidia-caps minor %d: outside %d..%d", m, devfilter.FirstCapsAccessMinor, devfilter.MaxCapsMinor)
		}
	}
	if len(p.IMEXChannels) > 1 {
		return fmt.Errorf("IMEX channels %v: a policy holds at most one", p.IMEXChannels)
	}
	if len(p.IMEXChannels) == 1 && p.IMEXChannels[0] > devfilter.MaxIMEXChannel {
		return fmt.Errorf("IMEX channel %d: larger than %d", p.IMEXChannels[0], devfilter.MaxIMEXChannel)
	}
	return nil
}

// Set gives cg the policy p, replacing any previous one.
func (f *Filter) Set(cg cgroup.Cgroup, p devfilter.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("set device policy of cgroup %d: %w", cg.ID, devfilter.ErrClosed)
	}
	if f.FailSet != nil {
		return fmt.Errorf("set device policy of cgroup %d: %w", cg.ID, f.FailSet)
	}
	if err := check(cg, p); err != nil {
		return fmt.Errorf("set device policy of cgroup %d: %w", cg.ID, err)
	}
	if f.mode == devfilter.ModePerCgroup && !f.attached[cg.ID] {
		if cg.Path == "" {
			return fmt.Errorf("set device policy of cgroup %d: no path", cg.ID)
		}
		f.attached[cg.ID] = true
	}
	p.GPUMinors, p.CapsMinors, p.IMEXChannels = norm(p.GPUMinors), norm(p.CapsMinors), norm(p.IMEXChannels)
	f.entries[cg.ID] = p
	f.sets++
	return nil
}

// Remove takes cg's entry away; one that is not there is no error.
func (f *Filter) Remove(cg cgroup.Cgroup) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("remove device policy of cgroup %d: %w", cg.ID, devfilter.ErrClosed)
	}
	delete(f.entries, cg.ID)
	delete(f.attached, cg.ID)
	return nil
}

// Policies returns the entries by cgroup id.
func (f *Filter) Policies() (map[uint64]devfilter.Policy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, fmt.Errorf("list device policies: %w", devfilter.ErrClosed)
	}
	out := make(map[uint64]devfilter.Policy, len(f.entries))
	for id, p := range f.entries {
		out[id] = p
	}
	return out, nil
}

// Entry returns cgroup id's entry.
func (f *Filter) Entry(id uint64) (devfilter.Policy, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.entries[id]
	return p, ok
}

// Sets is how many Set calls succeeded.
func (f *Filter) Sets() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sets
}

// ReadEvent blocks until the filter is closed: the fake reports no access.
func (f *Filter) ReadEvent() (devfilter.Event, error) {
	<-f.done
	return devfilter.Event{}, devfilter.ErrClosed
}

// Suppressed reports no suppressed events.
func (f *Filter) Suppressed() (map[devfilter.RateKey]uint64, error) {
	return map[devfilter.RateKey]uint64{}, nil
}

// ForgetRate does nothing: there are no rate counts.
func (f *Filter) ForgetRate(uint64) error { return nil }

// Lost reports no lost event.
func (f *Filter) Lost() (uint64, error) { return 0, nil }

// RateFull reports no full rate table.
func (f *Filter) RateFull() (map[devfilter.Decision]uint64, error) {
	return map[devfilter.Decision]uint64{}, nil
}

// SetAuditOnly switches the filter to audit-only.
func (f *Filter) SetAuditOnly(on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.auditOnly = on
	return nil
}

// AuditOnly reports what SetAuditOnly last set.
func (f *Filter) AuditOnly() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.auditOnly
}

// ScopeCgroupID is the cgroup the scope link is on.
func (f *Filter) ScopeCgroupID() (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.scopeID, nil
}

// Reattach moves the scope link onto scope as it is now.
func (f *Filter) Reattach(scope string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.FailReattach != nil {
		return f.FailReattach
	}
	id, err := f.node.ID(scope)
	if err != nil {
		return err
	}
	f.scopeID = id
	return nil
}

// AttachSlurmd puts the program on slurmd's cgroup id.
func (f *Filter) AttachSlurmd(_ string, id uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slurmdID = id
	return nil
}

// SlurmdCgroupID is the cgroup the slurmd link is on.
func (f *Filter) SlurmdCgroupID() (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slurmdID, nil
}

// Close closes the filter.
func (f *Filter) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		close(f.done)
	}
	return nil
}
