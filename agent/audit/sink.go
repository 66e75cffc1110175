// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxLostRanges caps the seq ranges one audit_loss record lists.
const maxLostRanges = 256

// writer writes one record to one destination.
type writer interface {
	Name() string
	Write(r *Record) error
	Close() error
}

// sink runs one writer on its own goroutine behind a bounded queue, so a
// slow or failing destination never holds up the others.
type sink struct {
	name string
	w    writer
	p    *Pipeline
	ch   chan Record

	written, failed, dropped atomic.Uint64

	mu      sync.Mutex
	pending lossSet // not yet reported by this sink

	// Only the sink goroutine uses these.
	failing  bool
	lastTry  time.Time
	lastErr  error
	reported uint64 // lost records already logged through slog
}

type lossSet struct {
	failed, dropped uint64
	ranges          []SeqRange
	truncated       bool
}

func (l *lossSet) empty() bool { return l.failed == 0 && l.dropped == 0 }

func (l *lossSet) add(seq uint64) {
	if n := len(l.ranges); n > 0 && l.ranges[n-1].Last+1 == seq {
		l.ranges[n-1].Last = seq
		return
	}
	if len(l.ranges) >= maxLostRanges {
		last := &l.ranges[len(l.ranges)-1]
		last.First, last.Last = min(last.First, seq), max(last.Last, seq)
		l.truncated = true
		return
	}
	l.ranges = append(l.ranges, SeqRange{First: seq, Last: seq})
}

func (l *lossSet) merge(o lossSet) {
	l.failed += o.failed
	l.dropped += o.dropped
	l.truncated = l.truncated || o.truncated
	for _, r := range o.ranges {
		l.add(r.First)
		last := &l.ranges[len(l.ranges)-1]
		last.Last = max(last.Last, r.Last)
	}
}

func (l *lossSet) count() uint64 { return l.failed + l.dropped }

func (s *sink) enqueue(r Record) {
	select {
	case s.ch <- r:
	default:
		s.dropped.Add(1)
		s.mu.Lock()
		s.pending.dropped++
		s.pending.add(r.Seq)
		s.mu.Unlock()
	}
}

func (s *sink) lose(seq uint64) {
	s.failed.Add(1)
	s.mu.Lock()
	s.pending.failed++
	s.pending.add(seq)
	s.mu.Unlock()
}

func (s *sink) run() {
	defer s.p.sinksDone.Done()
	// A sink that lost records reports them as soon as it can write again,
	// not only when the next record happens to arrive.
	retry := time.NewTicker(s.p.opts.RetryInterval)
	defer retry.Stop()
loop:
	for {
		select {
		case r, ok := <-s.ch:
			if !ok {
				break loop
			}
			s.deliver(r)
		case <-retry.C:
			s.mu.Lock()
			pend := !s.pending.empty()
			s.mu.Unlock()
			if pend && time.Since(s.lastTry) >= s.p.opts.RetryInterval {
				s.lastTry = time.Now()
				if s.writeLoss() && s.failing {
					s.p.log.Info("audit sink writes again", "sink", s.name)
					s.failing = false
				}
			}
		}
	}
	// Tell this sink what it lost at the very end, if it can still write.
	s.mu.Lock()
	pend := !s.pending.empty()
	s.mu.Unlock()
	if pend {
		s.writeLoss()
	}
}

func (s *sink) deliver(r Record) {
	s.mu.Lock()
	pend := !s.pending.empty()
	s.mu.Unlock()
	if s.failing && time.Since(s.lastTry) < s.p.opts.RetryInterval {
		s.lose(r.Seq)
		return
	}
	if pend && !s.writeLoss() {
		s.lose(r.Seq)
		return
	}
	s.lastTry = time.Now()
	if err := s.w.Write(&r); err != nil {
		s.markFailed(err)
		s.lose(r.Seq)
		return
	}
	s.written.Add(1)
	if s.failing {
		s.p.log.Info("audit sink writes again", "sink", s.name)
	}
	s.failing = false
}

func (s *sink) markFailed(err error) {
	if !s.failing {
		s.p.log.Error("audit sink cannot write; counting lost records", "sink", s.name, "err", err)
	}
	s.failing = true
	s.lastErr = err
	s.lastTry = time.Now()
}

// writeLoss writes this sink's pending loss as an audit_loss record ahead of
// anything else. The record takes a seq of its own and goes to the other
// sinks too, so that no sink sees an unexplained gap.
func (s *sink) writeLoss() bool {
	s.mu.Lock()
	snap := s.pending
	s.pending = lossSet{}
	s.mu.Unlock()

	var parts []string
	for _, r := range snap.ranges {
		if r.First == r.Last {
			parts = append(parts, fmt.Sprint(r.First))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", r.First, r.Last))
		}
	}
	rec := Record{
		Event:    EventAuditLoss,
		Severity: SeverityWarning,
		Message: fmt.Sprintf("audit %s sink lost %d records (%d failed, %d dropped at its full queue): seq %s",
			s.name, snap.count(), snap.failed, snap.dropped, strings.Join(parts, ",")),
		Loss: &Loss{
			SinkFailed:    map[string]uint64{s.name: snap.failed},
			SinkDropped:   map[string]uint64{s.name: snap.dropped},
			Sink:          s.name,
			LostSeqs:      snap.ranges,
			SeqsTruncated: snap.truncated,
		},
	}
	if s.lastErr != nil {
		rec.Error = s.lastErr.Error()
	}
	s.p.fill(&rec)
	s.p.broadcast(rec, s)
	s.lastTry = time.Now()
	err := s.w.Write(&rec)
	if err != nil {
		s.markFailed(err)
		s.mu.Lock()
		s.pending.merge(snap)
		s.pending.failed++
		s.pending.add(rec.Seq)
		s.mu.Unlock()
		s.failed.Add(1)
		return false
	}
	s.written.Add(1)
	s.lastErr = nil
	return true
}
