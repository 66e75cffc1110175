// SPDX-License-Identifier: Apache-2.0

// Package store keeps the agent's records of jobs and steps in BPF hash
// maps pinned in bpffs, beside the device filter's own pins. A record there
// outlives the agent (a crash, kill -9, an upgrade) exactly as the kernel's
// policies do, costs a map update (microseconds) where a state file costs a
// write and an fsync, and goes with a reboot, as the jobs do. Only root can
// open the pins (bpffs is mode 0700).
//
// The agent writes a job's trusted GPU list here before it answers the job
// prolog, and a step's record before it answers the step: an answered
// request is never lost to a crash.
package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/gpulist"
)

// Pin names under the pin directory. The device filter's pins are
// "state", "link", "map_*" and "cgroup_*"; it leaves others alone.
const (
	jobsPin  = "store_jobs"
	stepsPin = "store_steps"
	// newSuffix marks a map made by Open and not yet committed (bpffs
	// refuses names with a dot).
	newSuffix = "_new"
)

const gpuWords = (gpulist.MaxIndex + 1) / 64

// Flags of a job record.
const (
	// FlagRecovered: the trusted list came from slurmctld, not the prolog.
	FlagRecovered uint32 = 1 << 0
	// FlagBroken: the prolog's list was unusable; the job's GPU steps are
	// refused.
	FlagBroken uint32 = 1 << 1
	// FlagNoProlog: a placeholder for a job whose steps came without a
	// prolog; it carries no trusted list.
	FlagNoProlog uint32 = 1 << 2
	// FlagUnconfirmedAuditOnly, FlagUnconfirmedDeny: a running job adopted
	// at agent start whose GPUs slurmctld did not confirm, handled as
	// adopt_unconfirmed said (audit-only or deny).
	FlagUnconfirmedAuditOnly uint32 = 1 << 3
	FlagUnconfirmedDeny      uint32 = 1 << 4
)

// Flags of a step record.
const (
	// StepFlagAuditOnly: the step's kernel entry reports what it may not
	// open and allows it (a step of an unconfirmed job, audit-only).
	StepFlagAuditOnly uint32 = 1 << 0
	// StepFlagAdopted: the step was running when its job was adopted.
	StepFlagAdopted uint32 = 1 << 1
	// StepFlagIMEXChannel: the step may open the IMEX channel in the flags'
	// top 20 bits (IMEXFlags), which were zero before: older records read
	// as no channel.
	StepFlagIMEXChannel uint32 = 1 << 2
)

// imexShift is where a step's IMEX channel (a 20-bit minor) sits in its
// flags.
const imexShift = 12

// IMEXFlags are the step flags that record channels (none or one minor,
// below 1<<20; more or larger is an error).
func IMEXFlags(channels []uint32) (uint32, error) {
	switch {
	case len(channels) == 0:
		return 0, nil
	case len(channels) > 1 || channels[0] >= 1<<(32-imexShift):
		return 0, fmt.Errorf("IMEX channels %v: the store holds one below %d", channels, 1<<(32-imexShift))
	}
	return StepFlagIMEXChannel | channels[0]<<imexShift, nil
}

// IMEXChannels are the channels step flags record.
func IMEXChannels(flags uint32) []uint32 {
	if flags&StepFlagIMEXChannel == 0 {
		return nil
	}
	return []uint32{flags >> imexShift}
}

// Job is one job's record.
type Job struct {
	ID, UID uint32
	Flags   uint32
	GPUs    []int // ascending
	// CreatedUnixNano is when the record was made.
	CreatedUnixNano int64
}

// Step is one registered step's record, keyed by its cgroup id.
type Step struct {
	CgroupID           uint64
	JobID, StepID, UID uint32
	Flags              uint32
	GPUs               []int
	Cgroup             string // the cgroup's path, "" when longer than pathLen
}

const pathLen = 256

type jobValue struct {
	UID     uint32
	Flags   uint32
	Created int64
	GPUs    [gpuWords]uint64
}

type stepValue struct {
	JobID  uint32
	StepID uint32
	UID    uint32
	Flags  uint32 // was padding: older records read as 0
	GPUs   [gpuWords]uint64
	Cgroup [pathLen]byte
}

var (
	jobsSpec = &ebpf.MapSpec{Name: "gf_store_jobs", Type: ebpf.Hash, KeySize: 4,
		ValueSize: 16 + 8*gpuWords, MaxEntries: 65536, Flags: unix.BPF_F_NO_PREALLOC}
	stepsSpec = &ebpf.MapSpec{Name: "gf_store_steps", Type: ebpf.Hash, KeySize: 8,
		ValueSize: 16 + 8*gpuWords + pathLen, MaxEntries: 65536, Flags: unix.BPF_F_NO_PREALLOC}
)

// Store is the pair of pinned maps.
type Store struct {
	jobs, steps *ebpf.Map
	// Created is true when a map was made now (no earlier agent left it):
	// the caller fills the store from an older state file, then calls
	// Commit.
	Created bool

	dir string
	// pending are the pins made now, under their name with newSuffix
	// until Commit.
	pending []string
}

// Open opens the maps pinned in dir (a directory on bpffs), or creates and
// pins them. A pinned map of another layout (an agent of another version)
// is replaced, its records lost: the agent then recovers what running jobs
// hold from slurmctld.
//
// A map made now is pinned under a temporary name until Commit: a store
// that an agent began to fill from an older agent's state file and was
// killed before it finished is never taken for a complete one; the next
// Open makes it again, and the state file is read again.
func Open(dir string) (*Store, error) {
	s := &Store{dir: dir}
	var err error
	var created bool
	if s.jobs, created, err = openOrCreate(dir, jobsPin, jobsSpec); err != nil {
		return nil, err
	}
	if created {
		s.pending = append(s.pending, jobsPin)
	}
	if s.steps, created, err = openOrCreate(dir, stepsPin, stepsSpec); err != nil {
		s.jobs.Close()
		return nil, err
	}
	if created {
		s.pending = append(s.pending, stepsPin)
	}
	s.Created = len(s.pending) > 0
	return s, nil
}

func openOrCreate(dir, name string, spec *ebpf.MapSpec) (*ebpf.Map, bool, error) {
	path := filepath.Join(dir, name)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err == nil {
		if cerr := spec.Compatible(m); cerr == nil {
			return m, false, nil
		}
		m.Close()
		if err := unix.Unlink(path); err != nil {
			return nil, false, fmt.Errorf("replace pinned store %s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("open pinned store %s: %w", path, err)
	}
	// Left by an agent killed before its Commit: incomplete.
	tmp := path + newSuffix
	if err := unix.Unlink(tmp); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, false, fmt.Errorf("remove unfinished store map %s: %w", tmp, err)
	}
	if m, err = ebpf.NewMap(spec); err != nil {
		return nil, false, fmt.Errorf("create store map %s: %w", name, err)
	}
	if err := m.Pin(tmp); err != nil {
		m.Close()
		return nil, false, fmt.Errorf("pin store map %s: %w", tmp, err)
	}
	return m, true, nil
}

// Commit gives the maps made by Open their names, once the caller has
// filled them: from then on they are the records a restart reads. It does
// nothing for maps that were opened.
func (s *Store) Commit() error {
	for len(s.pending) > 0 {
		n := filepath.Join(s.dir, s.pending[0])
		if err := os.Rename(n+newSuffix, n); err != nil {
			return fmt.Errorf("commit the pinned store: %w", err)
		}
		s.pending = s.pending[1:]
	}
	return nil
}

// Close closes the maps; the pins keep them.
func (s *Store) Close() error {
	return errors.Join(s.jobs.Close(), s.steps.Close())
}

func bitmap(gpus []int) ([gpuWords]uint64, error) {
	var b [gpuWords]uint64
	for _, g := range gpus {
		if g < 0 || g > gpulist.MaxIndex {
			return b, fmt.Errorf("GPU index %d out of range", g)
		}
		b[g/64] |= 1 << (g % 64)
	}
	return b, nil
}

func indices(b [gpuWords]uint64) []int {
	out := []int{}
	for w, word := range b {
		for bit := range 64 {
			if word&(1<<bit) != 0 {
				out = append(out, w*64+bit)
			}
		}
	}
	return out
}

// PutJob writes a job's record, replacing any.
func (s *Store) PutJob(j Job) error {
	g, err := bitmap(j.GPUs)
	if err != nil {
		return fmt.Errorf("store job %d: %w", j.ID, err)
	}
	v := jobValue{UID: j.UID, Flags: j.Flags, Created: j.CreatedUnixNano, GPUs: g}
	if err := s.jobs.Put(j.ID, &v); err != nil {
		return fmt.Errorf("store job %d: %w", j.ID, err)
	}
	return nil
}

// DeleteJob removes a job's record; an absent one is no error.
func (s *Store) DeleteJob(id uint32) error {
	if err := s.jobs.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget job %d: %w", id, err)
	}
	return nil
}

// PutStep writes a step's record, replacing any of the same cgroup.
func (s *Store) PutStep(st Step) error {
	g, err := bitmap(st.GPUs)
	if err != nil {
		return fmt.Errorf("store step %d.%d: %w", st.JobID, st.StepID, err)
	}
	v := stepValue{JobID: st.JobID, StepID: st.StepID, UID: st.UID, Flags: st.Flags, GPUs: g}
	if len(st.Cgroup) < pathLen {
		copy(v.Cgroup[:], st.Cgroup)
	}
	if err := s.steps.Put(st.CgroupID, &v); err != nil {
		return fmt.Errorf("store step %d.%d: %w", st.JobID, st.StepID, err)
	}
	return nil
}

// DeleteStep removes the record of the step in cgroup id.
func (s *Store) DeleteStep(cgroupID uint64) error {
	if err := s.steps.Delete(cgroupID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget step of cgroup %d: %w", cgroupID, err)
	}
	return nil
}

// Jobs returns every job record, by id.
func (s *Store) Jobs() ([]Job, error) {
	var out []Job
	var id uint32
	var v jobValue
	it := s.jobs.Iterate()
	for it.Next(&id, &v) {
		out = append(out, Job{ID: id, UID: v.UID, Flags: v.Flags, GPUs: indices(v.GPUs), CreatedUnixNano: v.Created})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read stored jobs: %w", err)
	}
	slices.SortFunc(out, func(a, b Job) int { return int(a.ID) - int(b.ID) })
	return out, nil
}

// Steps returns every step record.
func (s *Store) Steps() ([]Step, error) {
	var out []Step
	var id uint64
	var v stepValue
	it := s.steps.Iterate()
	for it.Next(&id, &v) {
		n := 0
		for n < pathLen && v.Cgroup[n] != 0 {
			n++
		}
		out = append(out, Step{CgroupID: id, JobID: v.JobID, StepID: v.StepID, UID: v.UID, Flags: v.Flags, GPUs: indices(v.GPUs), Cgroup: string(v.Cgroup[:n])})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read stored steps: %w", err)
	}
	return out, nil
}
