// SPDX-License-Identifier: Apache-2.0

// Package shares learns which shared GRES (gres/shard, gres/mps) each job
// holds on the node's GPUs, for audit records and gpufence status. The job
// prolog cannot say: on 22.05 slurmd gives a shard job's prolog the same
// variables as a gpu job's (SLURM_JOB_GPUS naming the GPU), and what a
// step's environment says is the user's to set. slurmctld's allocation
// (gres_detail, read by agent/slurm.Controller from output no job field
// can steer) says it; it is asked by one worker, off every request's path,
// so no step start ever waits for it. The answer only labels records: the
// GPUs a job may open stay the prolog's.
package shares

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/slurm"
)

// Source is slurmctld; *slurm.Controller implements it.
type Source interface {
	Job(ctx context.Context, id uint32) (slurm.ControllerJob, error)
}

// Placer places a shared GRES device on a GPU; *gputable.Table implements it.
type Placer interface {
	ShareGPU(kind string, dev int) (int, bool)
	// HasShares tells whether the table has shared GRES now; a table that
	// slurmd settles late can gain (or lose) them while the agent runs.
	HasShares() bool
}

// Timeout bounds one question to slurmctld.
const Timeout = 5 * time.Second

// queueSize bounds the jobs waiting to be asked; more are dropped (and
// asked again at the next change of the agent's records).
const queueSize = 256

// Book is each job's shares. Of never blocks: the attribution stage reads
// it for every record.
type Book struct {
	Source Source
	Table  Placer
	Log    *slog.Logger
	// Changed, when set, is called after a job's shares are learned (the
	// state file is written again).
	Changed func()

	m     atomic.Pointer[map[uint32][]audit.Share]
	mu    sync.Mutex
	asked map[uint32]bool
	queue chan uint32
}

// New returns an empty book.
func New(src Source, table Placer, log *slog.Logger) *Book {
	b := &Book{Source: src, Table: table, Log: log, asked: map[uint32]bool{}, queue: make(chan uint32, queueSize)}
	b.m.Store(&map[uint32][]audit.Share{})
	return b
}

// Of returns job id's shares; nil when it holds none or they are not known
// (yet).
func (b *Book) Of(id uint32) []audit.Share {
	if b == nil {
		return nil
	}
	return (*b.m.Load())[id]
}

// Jobs updates the book to the agent's records: each job with GPUs not
// asked about yet is queued (never blocking: it is called with the
// records' lock held), and jobs no longer recorded are forgotten. While
// the table has no shared GRES, slurmctld is not asked: every job is
// forgotten, and asked about at the first change after the table gains
// shares.
func (b *Book) Jobs(ids []uint32) {
	if !b.Table.HasShares() {
		ids = nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		if b.asked[id] {
			continue
		}
		select {
		case b.queue <- id:
			b.asked[id] = true
		default:
		}
	}
	keep := make(map[uint32]bool, len(ids))
	for _, id := range ids {
		keep[id] = true
	}
	for id := range b.asked {
		if !keep[id] {
			delete(b.asked, id)
		}
	}
	cur := *b.m.Load()
	gone := false
	for id := range cur {
		gone = gone || !keep[id]
	}
	if !gone {
		return
	}
	next := make(map[uint32][]audit.Share, len(cur))
	for id, s := range cur {
		if keep[id] {
			next[id] = s
		}
	}
	b.m.Store(&next)
}

// Run asks slurmctld about each queued job until ctx ends.
func (b *Book) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-b.queue:
			b.ask(ctx, id)
		}
	}
}

func (b *Book) ask(ctx context.Context, id uint32) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	cj, err := b.Source.Job(ctx, id)
	if err != nil {
		b.Log.Debug("slurmctld not asked about the job's shares", "job_id", id, "err", err)
		return
	}
	s, err := Place(cj, b.Table)
	if err != nil {
		b.Log.Warn("the job's shares are not named in its audit records", "job_id", id, "err", err)
		return
	}
	if len(s) == 0 {
		return
	}
	b.set(id, s)
	b.Log.Info("shared GRES of job", "job_id", id, "shares", fmt.Sprint(s))
	if b.Changed != nil {
		b.Changed()
	}
}

func (b *Book) set(id uint32, s []audit.Share) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.asked[id] {
		return // forgotten meanwhile: the job ended
	}
	cur := *b.m.Load()
	next := make(map[uint32][]audit.Share, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	next[id] = s
	b.m.Store(&next)
}

// Place puts a job's shares on the node's GPUs, ordered by GPU; a share
// the table places on no GPU is an error naming it.
func Place(cj slurm.ControllerJob, t Placer) ([]audit.Share, error) {
	var out []audit.Share
	for _, s := range cj.Shares {
		g, ok := t.ShareGPU(s.Kind, s.Device)
		if !ok {
			return nil, fmt.Errorf("job %d: %s device %d (slurmctld) is on no GPU of this node's table", cj.ID, s.Kind, s.Device)
		}
		out = append(out, audit.Share{Kind: s.Kind, GPU: g, Count: s.Count})
	}
	slices.SortFunc(out, func(a, b audit.Share) int { return a.GPU - b.GPU })
	return out, nil
}
