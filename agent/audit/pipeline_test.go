// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestEveryEventKindValidates(t *testing.T) {
	opts := testOptions(t)
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	samples := sampleRecords()
	for _, r := range samples {
		p.Emit(r)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	recs := readRecords(t, opts.File)
	if len(recs) != len(samples) {
		t.Fatalf("got %d records, want %d", len(recs), len(samples))
	}
	kinds := map[Event]bool{}
	for i, r := range recs {
		if r.Seq != uint64(i+1) {
			t.Errorf("record %d has seq %d", i, r.Seq)
		}
		if r.Node != "gpu-node-1" || r.Cluster != "research" || r.AgentVersion != "v0.3.0-test" || r.BootID != testBootID {
			t.Errorf("record %d not filled: %+v", i, r)
		}
		kinds[r.Event] = true
	}
	for _, k := range []Event{EventGPUAccess, EventAccessSuppressed, EventAgentStart, EventAgentStop, EventPolicyApplied,
		EventPolicyReleased, EventFilterAttachFailed, EventLookupFailed, EventConfigReload, EventJobWithoutProlog, EventAuditLoss} {
		if !kinds[k] {
			t.Errorf("no %s record was emitted", k)
		}
	}
	if got := recs[2].GPUs; got == nil || len(got) != 0 {
		t.Errorf("empty GPU list not kept: %v", got)
	}
	if recs[5].UID == nil || *recs[5].UID != 0 {
		t.Errorf("uid 0 not kept: %v", recs[5].UID)
	}
	st, err := os.Stat(opts.File)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o640 {
		t.Errorf("audit file mode %v, want 0640", st.Mode().Perm())
	}
	dir, err := os.Stat(filepath.Dir(opts.File))
	if err != nil {
		t.Fatal(err)
	}
	if dir.Mode().Perm() != 0o750 {
		t.Errorf("audit directory mode %v, want 0750", dir.Mode().Perm())
	}
}

// The schema must catch drift, or validating against it proves nothing.
func TestSchemaRejectsDrift(t *testing.T) {
	good, err := json.Marshal(Record{SchemaVersion: "1", Seq: 1, RunID: testRunID, BootID: testBootID, Time: time.Now(), Event: EventAgentStart,
		Severity: SeverityInfo, Node: "n", Cluster: "c", AgentVersion: "v", Message: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := validateLine(t, good); err != nil {
		t.Fatalf("good record rejected: %v", err)
	}
	for name, edit := range map[string]func(m map[string]any){
		"unknown field":        func(m map[string]any) { m["jobid"] = 3 },
		"missing node":         func(m map[string]any) { delete(m, "node") },
		"bad event":            func(m map[string]any) { m["event"] = "gpu_open" },
		"bad decision":         func(m map[string]any) { m["decision"] = "deny" },
		"seq zero":             func(m map[string]any) { m["seq"] = 0 },
		"local time":           func(m map[string]any) { m["time"] = "2026-11-29T08:00:00+01:00" },
		"access without event": func(m map[string]any) { m["event"] = "gpu_access" },
		"loss on other event": func(m map[string]any) {
			m["loss"] = map[string]any{"queue_dropped": 1, "ringbuf_lost": 0, "sink_failed": map[string]any{}}
		},
	} {
		var m map[string]any
		if err := json.Unmarshal(good, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		b, _ := json.Marshal(m)
		if validateLine(t, b) == nil {
			t.Errorf("%s: schema accepted %s", name, b)
		}
	}
}

// blockingWriter blocks every write until release is closed.
type blockingWriter struct {
	release chan struct{}
	mu      sync.Mutex
	recs    []Record
}

func (w *blockingWriter) Name() string { return "syslog" }
func (w *blockingWriter) Write(r *Record) error {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recs = append(w.recs, *r)
	return nil
}
func (w *blockingWriter) Close() error { return nil }

func TestBlockedSinkNeverBlocksEmit(t *testing.T) {
	bw := &blockingWriter{release: make(chan struct{})}
	opts := testOptions(t)
	opts.SinkQueueSize = 4
	opts.testWriters = []writer{bw}
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	start := time.Now()
	for i := 0; i < n; i++ {
		r := sampleRecords()[3]
		r.PID = uint32(1000 + i)
		p.Emit(r)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Emit of %d records with a blocked sink took %v", n, d)
	}
	waitFor(t, "the file sink to handle everything", func() bool {
		f := p.Stats().Sinks["file"]
		return f.Written+f.Dropped >= n
	})
	if st := p.Stats(); st.Sinks["syslog"].Dropped == 0 {
		t.Fatalf("blocked sink dropped nothing: %+v", st)
	}
	close(bw.release)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	file := readRecords(t, opts.File)
	if f := st.Sinks["file"]; uint64(len(file))+f.Dropped+f.Failed != st.Emitted || st.Emitted < n {
		t.Errorf("file has %d records and dropped %d, emitted %d", len(file), st.Sinks["file"].Dropped, st.Emitted)
	}
	checkSeqs(t, file, "file")
	var buf bytes.Buffer
	for _, r := range bw.recs {
		b, _ := json.Marshal(r)
		if err := validateLine(t, b); err != nil {
			t.Fatalf("blocked sink record invalid: %v", err)
		}
		buf.Write(b)
	}
	lost := checkSeqs(t, bw.recs, "syslog")
	if uint64(len(lost)) != st.Sinks["syslog"].Dropped {
		t.Errorf("blocked sink reported %d lost seqs, stats say %d dropped", len(lost), st.Sinks["syslog"].Dropped)
	}
}

func TestFullQueueDropsAndReports(t *testing.T) {
	hold := make(chan struct{})
	var once sync.Once
	opts := testOptions(t)
	opts.QueueSize = 8
	opts.testStall = func() {
		once.Do(func() { <-hold }) // the dispatcher held up
	}
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	start := time.Now()
	for i := 0; i < n; i++ {
		p.Emit(sampleRecords()[3])
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Emit took %v with a full queue", d)
	}
	p.ReportLoss(7)
	// Counted even with the queue full, reported exactly.
	p.ReportRateFull(map[string]uint64{DecisionDenied: 11, DecisionAllowed: 2})
	p.ReportRateFull(map[string]uint64{DecisionDenied: 1, DecisionWouldDeny: 0})
	if st := p.Stats(); st.RateFull != 14 {
		t.Errorf("Stats().RateFull = %d, want 14", st.RateFull)
	}
	dropped := p.Stats().QueueDropped
	if dropped < n-9 {
		t.Fatalf("queue of 8 dropped only %d of %d", dropped, n)
	}
	close(hold)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	recs := readRecords(t, opts.File)
	checkSeqs(t, recs, "file")
	var access, reportedDrops, ringbuf uint64
	rateFull := map[string]uint64{}
	for _, r := range recs {
		switch r.Event {
		case EventGPUAccess:
			access++
			if r.User != "alice" {
				t.Errorf("record not attributed: %+v", r)
			}
		case EventAuditLoss:
			reportedDrops += r.Loss.QueueDropped
			ringbuf += r.Loss.RingbufLost
			for d, n := range r.Loss.RateFull {
				rateFull[d] += n
			}
		}
	}
	if want := map[string]uint64{DecisionDenied: 12, DecisionAllowed: 2}; fmt.Sprint(rateFull) != fmt.Sprint(want) {
		t.Errorf("audit_loss records report rate_full %v, want %v", rateFull, want)
	}
	if access+reportedDrops != n {
		t.Errorf("%d written + %d reported dropped != %d emitted", access, reportedDrops, n)
	}
	if ringbuf != 7 {
		t.Errorf("ring buffer loss reported %d, want 7", ringbuf)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for name, o := range map[string]Options{
		"journald value": {Journald: "yes"},
		"journald on":    {Journald: "on", JournalSocket: "/nonexistent/socket"},
		"syslog scheme":  {Journald: "off", Syslog: "udp://127.0.0.1:514"},
		"queue":          {Journald: "off", QueueSize: -1},
	} {
		o.BootID = testBootID
		if p, err := New(o, nil); err == nil {
			p.Close()
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestEmitAfterCloseIsCounted(t *testing.T) {
	opts := testOptions(t)
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p.Emit(sampleRecords()[0])
	if p.Stats().QueueDropped != 1 {
		t.Error("Emit after Close not counted")
	}
	if err := p.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		t.Error(err)
	}
}
