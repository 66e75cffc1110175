// SPDX-License-Identifier: Apache-2.0

package gputable

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/slurm"
)

// missing is a table of whole GPUs whose device files do not exist: their
// minors come from their names, as in TestRecheck.
func missing(minors ...int) []slurm.GPU {
	gpus := rows(minors...)
	for i := range gpus {
		gpus[i].Path = "/nonexistent" + gpus[i].Path
		gpus[i].Files = []string{gpus[i].Path}
	}
	return gpus
}

var errBoot = errors.New("/usr/sbin/slurmd -G: exit status 1: fatal: Unable to initialize cgroup plugin")

type recorder struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (r *recorder) Emit(rec audit.Record) { r.mu.Lock(); r.recs = append(r.recs, rec); r.mu.Unlock() }

func (r *recorder) all() []audit.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Record{}, r.recs...)
}

// minors is the table's GPU minors by index.
func minors(t *Table) []uint32 {
	var out []uint32
	for _, g := range t.GPUs() {
		out = append(out, g.Minor)
	}
	return out
}

// TestSettle: slurmd's late answer for a table made without it, on a node
// without AutoDetect (gres.conf's table, trusted with a warning) and one
// with it (no table until slurmd answers).
func TestSettle(t *testing.T) {
	gres := missing(0, 1, 2, 3)
	auto := slurm.GresConf{AutoDetect: "nvml"}
	tests := []struct {
		name      string
		gres      slurm.GresConf
		gresErr   error
		slurmd    []slurm.GPU
		held      bool
		outcome   string
		source    string
		minors    string // after, by index
		untrusted string // substring; "" = trusted
		message   string
	}{
		{name: "same table", gres: slurm.GresConf{GPUs: gres}, slurmd: gres, outcome: SettleConfirmed,
			source: SourceSlurmd, minors: "[0 1 2 3]", message: "is the one in use (4 GPU(s))"},
		{name: "same table, jobs hold GPUs", gres: slurm.GresConf{GPUs: gres}, slurmd: gres, held: true,
			outcome: SettleConfirmed, source: SourceSlurmd, minors: "[0 1 2 3]", message: "is the one in use"},
		{name: "another order, no job", gres: slurm.GresConf{GPUs: gres}, slurmd: missing(2, 3, 0, 1), outcome: SettleSwitched,
			source: SourceSlurmd, minors: "[2 3 0 1]", untrusted: "disagree", message: "GPU index 0 is /nonexistent/dev/nvidia2 for slurmd -G, /nonexistent/dev/nvidia0 in gres.conf"},
		{name: "AutoDetect, no job", gres: auto, gresErr: slurm.ErrNoGPUs, slurmd: missing(2, 3, 0, 1), outcome: SettleSwitched,
			source: SourceSlurmd, minors: "[2 3 0 1]", message: "the table is slurmd's now (4 GPU(s))"},
		{name: "fewer, no job", gres: slurm.GresConf{GPUs: gres}, slurmd: missing(0, 1), outcome: SettleSwitched,
			source: SourceSlurmd, minors: "[0 1]", message: "no job holds a GPU"},
		{name: "another order, jobs hold GPUs", gres: slurm.GresConf{GPUs: gres}, slurmd: missing(2, 3, 0, 1), held: true,
			outcome: SettleKept, source: SourceGresConf, minors: "[0 1 2 3]", untrusted: "until the agent restarts",
			message: "answered late with another table than the one in use, while jobs hold GPUs from it: GPU index 0 is /nonexistent/dev/nvidia2 now, /nonexistent/dev/nvidia0 in the table in use"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := Input{Gres: tt.gres, GresErr: tt.gresErr, SlurmdErr: errBoot}
			tab, err := Build(start, 195, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !tab.Pending() || tab.Origin().Source != SourceGresConf || tab.Origin().Kind != "slurmd_failed" {
				t.Fatalf("at start: pending %v, origin %+v", tab.Pending(), tab.Origin())
			}
			if s := tab.Settle(start, tt.held); s.Outcome != SettleFailed || !tab.Pending() || !strings.Contains(s.Message, "Unable to initialize cgroup plugin") {
				t.Fatalf("failing again: %+v, pending %v", s, tab.Pending())
			}
			answer := start
			answer.SlurmdErr, answer.Slurmd = nil, slurm.SlurmdView{GPUs: tt.slurmd, Command: "/usr/sbin/slurmd -G"}
			s := tab.Settle(answer, tt.held)
			if s.Outcome != tt.outcome || !strings.Contains(s.Message, tt.message) {
				t.Fatalf("outcome %q (%s), want %q (…%s…)", s.Outcome, s.Message, tt.outcome, tt.message)
			}
			if tab.Pending() {
				t.Fatal("still pending after slurmd answered")
			}
			if o := tab.Origin(); o.Source != tt.source || s.Origin.Source != tt.source {
				t.Errorf("origin %+v (settled %+v), want source %s", o, s.Origin, tt.source)
			}
			if got := fmt.Sprint(minors(tab)); got != tt.minors {
				t.Errorf("minors %s, want %s", got, tt.minors)
			}
			if u := tab.Untrusted(); (tt.untrusted == "") != (u == "") || !strings.Contains(u, tt.untrusted) {
				t.Errorf("untrusted %q, want …%s…", u, tt.untrusted)
			}
			// Settled once: a second answer changes nothing.
			if s := tab.Settle(answer, false); s.Outcome != "" {
				t.Errorf("second answer: %+v", s)
			}
		})
	}
}

// TestSettleNotPending: a table that had slurmd's answer, or was made with
// slurmd_gpu_table off, never waits for one.
func TestSettleNotPending(t *testing.T) {
	gres := missing(0, 1)
	for _, in := range []Input{
		{Gres: slurm.GresConf{GPUs: gres}, Slurmd: slurm.SlurmdView{GPUs: gres}},
		{Gres: slurm.GresConf{GPUs: gres}, SlurmdOff: true},
	} {
		tab, err := Build(in, 195, 0)
		if err != nil {
			t.Fatal(err)
		}
		l := &Late{Table: tab, Ask: func(context.Context) Input { t.Error("asked"); return in }, Log: slog.New(slog.DiscardHandler)}
		l.Start(context.Background())
		l.Kick(true)
		l.Await(context.Background())
		if tab.Pending() || l.Runs() != 0 {
			t.Errorf("%+v: pending %v, runs %d", in.SlurmdOff, tab.Pending(), l.Runs())
		}
	}
}

// late is a Late over a pending gres.conf table whose Ask is ask.
func late(t *testing.T, ask func(context.Context) Input, held *atomic.Bool) (*Late, *Table, func() string, *recorder) {
	t.Helper()
	tab, err := Build(Input{Gres: slurm.GresConf{GPUs: missing(0, 1, 2, 3)}, SlurmdErr: errBoot}, 195, 0)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var mu sync.Mutex
	rec := &recorder{}
	l := &Late{Table: tab, Ask: ask, Held: held.Load, Recorder: rec,
		Log: slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil)), First: 20 * time.Millisecond, Max: 40 * time.Millisecond, Tries: 4}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l.Start(ctx)
	return l, tab, func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }, rec
}

// idle reports whether no slurmd -G is in flight.
func (l *Late) idle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running == nil
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// eventually waits for cond, at most 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestLateFailsThenAnswers: slurmd -G fails at start and once more, then
// answers with the table in use: the origin becomes slurmd's, it is logged
// and audited once, and nothing asks again after.
func TestLateFailsThenAnswers(t *testing.T) {
	var calls atomic.Int32
	var held atomic.Bool
	answer := Input{Gres: slurm.GresConf{GPUs: missing(0, 1, 2, 3)}, Slurmd: slurm.SlurmdView{GPUs: missing(0, 1, 2, 3), Command: "/usr/sbin/slurmd -G -L /dev/null"}}
	l, tab, buf, rec := late(t, func(context.Context) Input {
		if calls.Add(1) == 1 {
			return Input{Gres: answer.Gres, SlurmdErr: errBoot}
		}
		return answer
	}, &held)
	l.Kick(false) // before the first pause is over: nothing
	if l.Runs() != 0 {
		t.Fatalf("a periodic kick during the first pause ran slurmd -G")
	}
	l.Kick(true) // slurmd's pid file: at once
	eventually(t, "the first retry", func() bool { return l.Runs() == 1 && l.idle() })
	if !tab.Pending() {
		t.Fatal("settled by a failure")
	}
	eventually(t, "the answer", func() bool { l.Kick(false); return !tab.Pending() && l.idle() })
	if o := tab.Origin(); o.Source != SourceSlurmd || o.Slurmd == "" || tab.Untrusted() != "" {
		t.Fatalf("origin %+v, untrusted %q", o, tab.Untrusted())
	}
	for range 5 {
		l.Kick(true)
		l.Kick(false)
	}
	time.Sleep(60 * time.Millisecond)
	if n := calls.Load(); n != 2 {
		t.Errorf("slurmd -G ran %d times, want 2", n)
	}
	log := buf()
	for _, want := range []string{"GPU table: slurmd -G failed again; asking again later", "tries=1",
		`msg="GPU table settled by slurmd's late answer" outcome=confirmed source="slurmd -G"`} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	rs := rec.all()
	if len(rs) != 1 || rs[0].Event != audit.EventGPUTableMismatch || rs[0].Severity != audit.SeverityInfo || !strings.HasPrefix(rs[0].Error, "slurmd_late_confirmed: ") {
		t.Fatalf("audit records %+v", rs)
	}
}

// TestLateKeptWhileHeld: slurmd answers with another table while a step
// holds a GPU: the table stays, no GPU is given, the log and audit say why.
func TestLateKeptWhileHeld(t *testing.T) {
	var held atomic.Bool
	held.Store(true)
	l, tab, buf, rec := late(t, func(context.Context) Input {
		return Input{Gres: slurm.GresConf{GPUs: missing(0, 1, 2, 3)}, Slurmd: slurm.SlurmdView{GPUs: missing(0, 1)}}
	}, &held)
	l.Await(context.Background())
	if tab.Pending() || fmt.Sprint(minors(tab)) != "[0 1 2 3]" || !strings.Contains(tab.Untrusted(), "until the agent restarts") {
		t.Fatalf("pending %v, minors %v, untrusted %q", tab.Pending(), minors(tab), tab.Untrusted())
	}
	if log := buf(); !strings.Contains(log, "failing closed") || !strings.Contains(log, "outcome=kept") {
		t.Errorf("log:\n%s", log)
	}
	if rs := rec.all(); len(rs) != 1 || rs[0].Severity != audit.SeverityError || !strings.HasPrefix(rs[0].Error, "slurmd_late_kept: ") {
		t.Fatalf("audit records %+v", rs)
	}
}

// TestLateBounded: slurmd -G that always fails, and hangs a while each
// time, under kicks from many requests at once: one run at a time, pauses
// between them, and no more than Tries runs in all.
func TestLateBounded(t *testing.T) {
	var inFlight, most, calls atomic.Int32
	var held atomic.Bool
	l, tab, buf, _ := late(t, func(ctx context.Context) Input {
		calls.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
		return Input{Gres: slurm.GresConf{GPUs: missing(0)}, SlurmdErr: errBoot}
	}, &held)
	var wg sync.WaitGroup
	stop := time.Now().Add(400 * time.Millisecond)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				l.Kick(true)
				l.Await(context.Background())
				l.Kick(false)
			}
		}()
	}
	wg.Wait()
	eventually(t, "the last run", func() bool { return inFlight.Load() == 0 })
	if most.Load() != 1 {
		t.Errorf("%d slurmd -G ran at once", most.Load())
	}
	if n := calls.Load(); n != 4 {
		t.Errorf("slurmd -G ran %d times, want Tries = 4", n)
	}
	eventually(t, "idle", l.idle)
	if log := buf(); !tab.Pending() || !strings.Contains(log, "the agent stops asking (send it SIGHUP to ask again)") {
		t.Errorf("pending %v; log:\n%s", tab.Pending(), log)
	}
}

// TestLateAwaitBounded: a request waits for a hung slurmd -G no longer than
// Wait, nor past its deadline less 1 s.
func TestLateAwaitBounded(t *testing.T) {
	release := make(chan struct{})
	var held atomic.Bool
	l, tab, _, _ := late(t, func(ctx context.Context) Input {
		<-release
		return Input{Gres: slurm.GresConf{GPUs: missing(0)}, SlurmdErr: errBoot}
	}, &held)
	defer close(release)
	l.Wait = 50 * time.Millisecond
	t0 := time.Now()
	l.Await(context.Background())
	if d := time.Since(t0); d < 50*time.Millisecond || d > 2*time.Second {
		t.Errorf("waited %s for Wait=50ms", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1100*time.Millisecond)
	defer cancel()
	l.Wait = 10 * time.Second
	t0 = time.Now()
	l.Await(ctx)
	if d := time.Since(t0); d > 500*time.Millisecond {
		t.Errorf("waited %s with 1.1 s to its deadline", d)
	}
	if !tab.Pending() || l.Runs() != 1 {
		t.Errorf("pending %v, runs %d", tab.Pending(), l.Runs())
	}
}

// TestHoldBlocksSwitch: while a request holds the table, slurmd's answer
// waits; it then finds the step the request recorded and keeps the table.
func TestHoldBlocksSwitch(t *testing.T) {
	var held atomic.Bool
	l, tab, _, _ := late(t, func(context.Context) Input {
		return Input{Gres: slurm.GresConf{GPUs: missing(0, 1, 2, 3)}, Slurmd: slurm.SlurmdView{GPUs: missing(3, 2, 1, 0)}}
	}, &held)
	release := l.Hold()
	done := make(chan Settled)
	go func() { done <- l.Offer(l.Ask(context.Background())) }()
	select {
	case s := <-done:
		t.Fatalf("settled while held: %+v", s)
	case <-time.After(50 * time.Millisecond):
	}
	held.Store(true) // the request recorded its step
	release()
	if s := <-done; s.Outcome != SettleKept || fmt.Sprint(minors(tab)) != "[0 1 2 3]" {
		t.Fatalf("%+v, minors %v", s, minors(tab))
	}
}
