// SPDX-License-Identifier: Apache-2.0

package shares

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/slurm"
)

type ctld struct {
	mu    sync.Mutex
	jobs  map[uint32]slurm.ControllerJob
	asked []uint32
}

func (c *ctld) Job(_ context.Context, id uint32) (slurm.ControllerJob, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, id)
	j, ok := c.jobs[id]
	if !ok {
		return j, slurm.ErrJobUnknown
	}
	return j, nil
}

func (c *ctld) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.asked)
}

// placer: shard devices 0-3 on GPUs 0-3, mps device 0 on GPU 1.
type placer struct{}

func (placer) HasShares() bool { return true }

func (placer) ShareGPU(kind string, dev int) (int, bool) {
	switch {
	case kind == "shard" && dev >= 0 && dev < 4:
		return dev, true
	case kind == "mps" && dev == 0:
		return 1, true
	}
	return 0, false
}

func TestPlace(t *testing.T) {
	got, err := Place(slurm.ControllerJob{ID: 1, Shares: []slurm.Share{{Kind: "shard", Device: 3, Count: 2}, {Kind: "mps", Device: 0, Count: 50}}}, placer{})
	want := []audit.Share{{Kind: "mps", GPU: 1, Count: 50}, {Kind: "shard", GPU: 3, Count: 2}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("%v %v, want %v", got, err, want)
	}
	if _, err := Place(slurm.ControllerJob{ID: 1, Shares: []slurm.Share{{Kind: "mps", Device: 2}}}, placer{}); err == nil {
		t.Error("an mps device on no GPU placed")
	}
	if got, err := Place(slurm.ControllerJob{ID: 1, GPUs: []int{0}}, placer{}); err != nil || got != nil {
		t.Errorf("a gpu job: %v %v", got, err)
	}
}

// TestBook: each job is asked about once, off the caller's path; its
// shares are readable once learned and gone once the job is.
func TestBook(t *testing.T) {
	src := &ctld{jobs: map[uint32]slurm.ControllerJob{
		7: {ID: 7, Shares: []slurm.Share{{Kind: "shard", Device: 2, Count: 5}}},
		8: {ID: 8, GPUs: []int{0}},
		9: {ID: 9, Shares: []slurm.Share{{Kind: "mps", Device: 3, Count: 5}}}, // on no GPU
	}}
	b := New(src, placer{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	changed := make(chan struct{}, 10)
	b.Changed = func() { changed <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go b.Run(ctx)
	b.Jobs([]uint32{7, 8, 9, 10})
	b.Jobs([]uint32{7, 8, 9, 10})
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("job 7's shares never learned")
	}
	if got := b.Of(7); !slices.Equal(got, []audit.Share{{Kind: "shard", GPU: 2, Count: 5}}) {
		t.Errorf("job 7: %v", got)
	}
	for deadline := time.Now().Add(5 * time.Second); src.count() < 4 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := src.count(); n != 4 {
		t.Errorf("slurmctld asked %d times, want once per job (4): %v", n, src.asked)
	}
	for _, id := range []uint32{8, 9, 10} {
		if got := b.Of(id); got != nil {
			t.Errorf("job %d: %v, want none", id, got)
		}
	}
	b.Jobs([]uint32{8})
	if got := b.Of(7); got != nil {
		t.Errorf("job 7 after it ended: %v", got)
	}
	var nilBook *Book
	if nilBook.Of(7) != nil {
		t.Error("a nil book names shares")
	}
}

// TestJobsNeverBlocks: with slurmctld stuck, a flood of new jobs returns
// at once (the registry's lock is held meanwhile); the queue drops.
func TestJobsNeverBlocks(t *testing.T) {
	b := New(&ctld{}, placer{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ids := make([]uint32, 4*queueSize)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	done := make(chan struct{})
	go func() { b.Jobs(ids); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Jobs blocked with no worker running")
	}
	if len(b.queue) != queueSize {
		t.Errorf("%d queued, want %d", len(b.queue), queueSize)
	}
}

// lateTable has no shares until slurmd's late answer brings them.
type lateTable struct {
	placer
	has atomic.Bool
}

func (l *lateTable) HasShares() bool { return l.has.Load() }

// TestBookLateShares: on a node whose table gains shared GRES after the
// agent started (slurmd answered late), jobs are asked about from then on,
// and not before.
func TestBookLateShares(t *testing.T) {
	src := &ctld{jobs: map[uint32]slurm.ControllerJob{7: {ID: 7, Shares: []slurm.Share{{Kind: "shard", Device: 1, Count: 2}}}}}
	table := &lateTable{}
	b := New(src, table, slog.New(slog.NewTextHandler(io.Discard, nil)))
	changed := make(chan struct{}, 10)
	b.Changed = func() { changed <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go b.Run(ctx)
	b.Jobs([]uint32{7})
	time.Sleep(100 * time.Millisecond)
	if n := src.count(); n != 0 {
		t.Fatalf("slurmctld asked %d times while the table has no shares", n)
	}
	table.has.Store(true)
	b.Jobs([]uint32{7})
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("job 7's shares never learned after the table gained shares")
	}
	if got := b.Of(7); !slices.Equal(got, []audit.Share{{Kind: "shard", GPU: 1, Count: 2}}) {
		t.Errorf("job 7: %v", got)
	}
	// The table loses its shares again: nothing is named any more.
	table.has.Store(false)
	b.Jobs([]uint32{7})
	if got := b.Of(7); got != nil {
		t.Errorf("job 7 after the table lost its shares: %v", got)
	}
}
