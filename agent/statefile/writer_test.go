// SPDX-License-Identifier: Apache-2.0

package statefile

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// Changes are coalesced: a burst of them is a few writes, the newest
// snapshot last, and the final one at stop.
func TestWriterCoalesces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	changed := make(chan struct{}, 1)
	var n, snaps atomic.Int32
	w := &Writer{Path: path, Changed: changed, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Interval: 50 * time.Millisecond,
		Snapshot: func() File {
			snaps.Add(1)
			return File{Jobs: []Job{{ID: uint32(n.Load())}}}
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	for i := 1; i <= 200; i++ {
		n.Store(int32(i))
		select {
		case changed <- struct{}{}:
		default:
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	f, _, err := Read(path)
	if err != nil || f == nil || len(f.Jobs) != 1 || f.Jobs[0].ID != 200 {
		t.Fatalf("state after the burst: %+v, %v; want the last snapshot (job 200)", f, err)
	}
	if s := snaps.Load(); s < 2 || s > 20 {
		t.Errorf("%d writes for 200 changes over ~200ms at most every 50ms", s)
	}
}
