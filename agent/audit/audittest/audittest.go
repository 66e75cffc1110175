// SPDX-License-Identifier: Apache-2.0

// Package audittest keeps, for tests, what a stage hands to its audit
// recorder: the records, the reported ring-buffer losses and rate-map-full
// counts. It satisfies the Recorder interfaces the stages declare.
package audittest

import (
	"sync"

	"github.com/gpufence/gpufence/agent/audit"
)

// Recorder keeps everything it is given; the zero value is ready.
type Recorder struct {
	mu       sync.Mutex
	recs     []audit.Record
	lost     uint64
	rateFull uint64
}

// Emit keeps r.
func (m *Recorder) Emit(r audit.Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = append(m.recs, r)
}

// ReportLoss adds n records lost before the recorder.
func (m *Recorder) ReportLoss(n uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lost += n
}

// ReportRateFull adds the counts of every decision.
func (m *Recorder) ReportRateFull(byDecision map[string]uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range byDecision {
		m.rateFull += n
	}
}

// Records are the kept records of event ev, in order.
func (m *Recorder) Records(ev audit.Event) []audit.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []audit.Record
	for _, r := range m.recs {
		if r.Event == ev {
			out = append(out, r)
		}
	}
	return out
}

// Lost is the sum of ReportLoss.
func (m *Recorder) Lost() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost
}

// RateFull is the sum of ReportRateFull.
func (m *Recorder) RateFull() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rateFull
}
