// SPDX-License-Identifier: Apache-2.0

package events

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// TestResumeAcrossRestart: what the kernel counted between one agent's
// last flush and the next agent's start (a restart, an upgrade) is
// reported by the next agent, once; without the saved counts it was taken
// as reported and lost.
func TestResumeAcrossRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit-counts.json")
	key := devfilter.RateKey{CgroupID: 7, Major: 195, Minor: 0, Decision: devfilter.DecisionAllowed}
	other := devfilter.RateKey{CgroupID: 8, Major: 195, Minor: 1, Decision: devfilter.DecisionDenied}
	f := &countsFilter{supp: map[devfilter.RateKey]uint64{key: 10}, lost: 1, full: map[devfilter.Decision]uint64{devfilter.DecisionDenied: 2}}

	rec1 := &audittest.Recorder{}
	a := newStage(rec1)
	a.Read(closedSource{}, f, false)
	a.Flush(f) // the stopping agent's last flush
	a.Close()
	if err := SaveReported(path, a.Reported()); err != nil {
		t.Fatal(err)
	}
	if s := rec1.Records(audit.EventAccessSuppressed); len(s) != 1 || s[0].Suppressed != 10 || rec1.Lost() != 1 || rec1.RateFull() != 2 {
		t.Fatalf("first agent: summaries %+v lost %d rate_full %d; want one of 10, 1, 2", s, rec1.Lost(), rec1.RateFull())
	}

	// No agent runs: the kernel counts on.
	f.supp[key], f.supp[other], f.lost, f.full[devfilter.DecisionDenied] = 14, 5, 3, 6

	r, err := LoadReported(path)
	if err != nil || r == nil {
		t.Fatalf("LoadReported: %v, %v", r, err)
	}
	rec2 := &audittest.Recorder{}
	b := New(Options{Log: newStage(rec2).o.Log, Recorder: rec2, Owners: registry.New(nil, newStage(rec2).o.Log),
		Table: noTable{}, Users: newStage(rec2).o.Users, Resume: r})
	defer b.Close()
	b.Read(closedSource{}, f, true)
	b.Flush(f)
	b.Flush(f)
	got := map[uint32]uint64{}
	for _, s := range rec2.Records(audit.EventAccessSuppressed) {
		got[s.Device.Minor] += s.Suppressed
	}
	if got[0] != 4 || got[1] != 5 || len(got) != 2 || rec2.Lost() != 2 || rec2.RateFull() != 4 {
		t.Errorf("next agent reported suppressed %v lost %d rate_full %d; want minor 0: 4, minor 1: 5, lost 2, rate_full 4",
			got, rec2.Lost(), rec2.RateFull())
	}
	if f.supp[key] != 14 {
		t.Errorf("the baseline changed the kernel's totals: %d", f.supp[key])
	}
}

// Saved counts above the kernel's (counters re-created with the same ids)
// never make a count negative: the totals now are the most reported.
func TestResumeNeverAboveTotals(t *testing.T) {
	key := devfilter.RateKey{CgroupID: 7, Major: 195, Minor: 0, Decision: devfilter.DecisionAllowed}
	f := &countsFilter{supp: map[devfilter.RateKey]uint64{key: 3}, lost: 0, full: map[devfilter.Decision]uint64{}}
	rec := &audittest.Recorder{}
	e := newStage(rec)
	e.o.Resume = &Reported{Suppressed: map[devfilter.RateKey]uint64{key: 100}, Lost: 50}
	defer e.Close()
	e.Read(closedSource{}, f, true)
	e.Flush(f)
	f.supp[key], f.lost = 5, 1
	e.Flush(f)
	s := rec.Records(audit.EventAccessSuppressed)
	if len(s) != 1 || s[0].Suppressed != 2 || rec.Lost() != 1 {
		t.Errorf("summaries %+v lost %d; want one of 2 and 1", s, rec.Lost())
	}
}

func TestSaveLoadReported(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit-counts.json")
	if r, err := LoadReported(path); r != nil || err != nil {
		t.Fatalf("no file: %v, %v; want nil, nil", r, err)
	}
	key := devfilter.RateKey{CgroupID: 1 << 40, Major: 195, Minor: 255, Decision: devfilter.DecisionWouldDeny}
	in := Reported{Suppressed: map[devfilter.RateKey]uint64{key: 9}, Lost: 4, RateFull: map[devfilter.Decision]uint64{devfilter.DecisionAllowed: 2}}
	if err := SaveReported(path, in); err != nil {
		t.Fatal(err)
	}
	out, err := LoadReported(path)
	if err != nil || out.Suppressed[key] != 9 || len(out.Suppressed) != 1 || out.Lost != 4 || out.RateFull[devfilter.DecisionAllowed] != 2 {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadReported(path); err == nil {
		t.Error("a corrupt file: no error")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
}

// oneEvent yields one event, then is closed.
type oneEvent struct {
	ev   devfilter.Event
	done bool
}

func (s *oneEvent) ReadEvent() (devfilter.Event, error) {
	if s.done {
		return devfilter.Event{}, devfilter.ErrClosed
	}
	s.done = true
	return s.ev, nil
}

// TestEventOfReleasedStep: an event read after its step's entry went (an
// agent starting on the ring buffer an earlier one left, a step ending
// with events queued) is still the step's, until the flush after next.
func TestEventOfReleasedStep(t *testing.T) {
	rec := &audittest.Recorder{}
	e := newStage(rec)
	f := &countsFilter{supp: map[devfilter.RateKey]uint64{}, full: map[devfilter.Decision]uint64{}}
	e.Release(42, registry.Owner{JobID: 5, StepID: 3, UID: 2001})
	e.Flush(f)
	e.Read(&oneEvent{ev: devfilter.Event{CgroupID: 42, Major: 195, Minor: 1, Decision: devfilter.DecisionDenied, PID: 1}}, f, false)
	e.Close()
	r := rec.Records(audit.EventGPUAccess)
	if len(r) != 1 || r[0].JobID != 5 || r[0].StepID != "3" {
		t.Fatalf("records %+v; want one of job 5 step 3", r)
	}
}
