// SPDX-License-Identifier: Apache-2.0

package statefile

import (
	"context"
	"log/slog"
	"time"
)

// Interval is the least time between two writes.
const Interval = 200 * time.Millisecond

// Writer writes the agent's records to its state file, off the request
// path: woken by every change, it writes the newest snapshot (temp file,
// fsync, rename) at most every Interval, and once more at stop. Nothing
// waits for it. The crash-safe copy of the records is the pinned store
// (agent/store); this file is for `gpufence status` while the agent is
// down, and for an agent started where only an older version's state file
// exists.
//
// It writes Snapshot() to Path after each value on Changed.
type Writer struct {
	Path     string
	Snapshot func() File
	Changed  <-chan struct{}
	Log      *slog.Logger
	Interval time.Duration
}

// Run writes until ctx ends, then writes the last snapshot.
func (w *Writer) Run(ctx context.Context) {
	if w.Path == "" {
		return
	}
	every := w.Interval
	if every <= 0 {
		every = Interval
	}
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			w.write()
			return
		case <-w.Changed:
		}
		if wait := every - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				w.write()
				return
			case <-time.After(wait):
			}
		}
		w.write()
		last = time.Now()
	}
}

func (w *Writer) write() {
	if err := Write(w.Path, w.Snapshot()); err != nil {
		w.Log.Error("write the state file (gpufence status reads it while the agent is down)", "file", w.Path, "err", err)
	}
}
