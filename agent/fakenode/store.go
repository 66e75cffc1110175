// SPDX-License-Identifier: Apache-2.0

package fakenode

import (
	"cmp"
	"slices"
	"sync"

	"github.com/gpufence/gpufence/agent/store"
)

// Store is the pinned store in memory.
type Store struct {
	mu    sync.Mutex
	jobs  map[uint32]store.Job
	steps map[uint64]store.Step
	// Fail, when set, is the error of every write and read.
	Fail error
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{jobs: map[uint32]store.Job{}, steps: map[uint64]store.Step{}}
}

// PutJob writes j.
func (s *Store) PutJob(j store.Job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Fail != nil {
		return s.Fail
	}
	j.GPUs = slices.Clone(j.GPUs)
	s.jobs[j.ID] = j
	return nil
}

// DeleteJob forgets job id.
func (s *Store) DeleteJob(id uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Fail != nil {
		return s.Fail
	}
	delete(s.jobs, id)
	return nil
}

// PutStep writes st.
func (s *Store) PutStep(st store.Step) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Fail != nil {
		return s.Fail
	}
	st.GPUs = slices.Clone(st.GPUs)
	s.steps[st.CgroupID] = st
	return nil
}

// DeleteStep forgets the step on cgroupID.
func (s *Store) DeleteStep(cgroupID uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Fail != nil {
		return s.Fail
	}
	delete(s.steps, cgroupID)
	return nil
}

// Jobs returns the jobs, by id.
func (s *Store) Jobs() ([]store.Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Fail != nil {
		return nil, s.Fail
	}
	out := make([]store.Job, 0, len(s.jobs))
	for _, j := range s.jobs {
		out = append(out, j)
	}
	slices.SortFunc(out, func(a, b store.Job) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// Steps returns the steps, by cgroup id.
func (s *Store) Steps() ([]store.Step, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Fail != nil {
		return nil, s.Fail
	}
	out := make([]store.Step, 0, len(s.steps))
	for _, st := range s.steps {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b store.Step) int { return cmp.Compare(a.CgroupID, b.CgroupID) })
	return out, nil
}

// Pins is what an earlier agent pinned: the cgroup its slurmd link is on
// and the ids of its entries.
type Pins struct {
	mu      sync.Mutex
	Slurmd  uint64
	Entries []uint64
}

// SlurmdCgroup is the cgroup the pinned slurmd link is on.
func (p *Pins) SlurmdCgroup(string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.Slurmd
}

// CleanStale removes the entries live does not keep and returns them.
func (p *Pins) CleanStale(_ string, live func(uint64) bool) ([]uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var removed, kept []uint64
	for _, id := range p.Entries {
		if live(id) {
			kept = append(kept, id)
		} else {
			removed = append(removed, id)
		}
	}
	p.Entries = kept
	return removed, nil
}
