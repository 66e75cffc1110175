// SPDX-License-Identifier: Apache-2.0

package gputable

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/slurm"
)

// What slurmd's late answer did to a pending table (Settle).
const (
	// SettleFailed: slurmd -G failed again; the table is still pending.
	SettleFailed = "failed"
	// SettleConfirmed: slurmd's table is the one in use; its origin is
	// slurmd's now.
	SettleConfirmed = "confirmed"
	// SettleSwitched: slurmd's table differs and no job held a GPU; it
	// replaced the one in use.
	SettleSwitched = "switched"
	// SettleKept: slurmd's table differs while jobs hold GPUs given from
	// the table in use, which stays; no GPU is given until a restart
	// (Recheck's rule).
	SettleKept = "kept"
)

// Settled is what slurmd's late answer did.
type Settled struct {
	// Outcome is one of the Settle… constants.
	Outcome string
	// Message says it in one sentence, for the log and the audit record.
	Message string
	// Origin is the table's origin after it.
	Origin Origin
}

// Settle takes slurmd's answer for a table made without it (Pending): in
// comes from the same sources as at start, asked again once slurmd runs.
// held says whether any job or step holds a GPU from the table in use
// (kernel entries were made from it).
//
//   - slurmd -G failed again: nothing changes, the table stays pending.
//   - slurmd's chosen table (Choose) names the same devices for every
//     index: confirmed, the origin becomes slurmd's and its verdict
//     (under AutoDetect the table becomes trusted).
//   - it differs and held is false: no kernel entry uses the table, so
//     slurmd's replaces it (with its verdict; a table whose sources
//     disagree stays untrusted, as at start).
//   - it differs and held is true: the table in use stays (running jobs'
//     entries were made from it) and no step gets a GPU until the agent
//     restarts with slurmd's table, which then rewrites every recorded
//     step's entry from it.
//
// Once it returns anything but SettleFailed, the table is no longer
// pending; a table that was not pending gives Outcome "".
func (t *Table) Settle(in Input, held bool) Settled {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.layout.Load()
	if !t.pending.Load() {
		return Settled{Origin: cur.origin} // settled already

	}
	if in.SlurmdErr != nil {
		return Settled{Outcome: SettleFailed, Message: fmt.Sprintf("slurmd -G failed again: %v", in.SlurmdErr), Origin: cur.origin}
	}
	gpus, o, err := Choose(in)
	if err != nil { // not reached: slurmd answered
		return Settled{Outcome: SettleFailed, Message: err.Error(), Origin: cur.origin}
	}
	inUse := make([]slurm.GPU, 0, len(cur.gpus))
	for _, g := range cur.sorted() {
		inUse = append(inUse, g.GPU)
	}
	t.pending.Store(false)
	i, differ := firstDifference(gpus, inUse)
	switch {
	case !differ:
		t.layout.Store(&layout{gpus: cur.gpus, devs: cur.devs, byMinor: cur.byMinor, byCaps: cur.byCaps, shares: sharesOf(in, o), origin: o})
		t.sources.Store(&o.Untrusted)
		return Settled{Outcome: SettleConfirmed, Origin: o,
			Message: fmt.Sprintf("slurmd answered: its GPU table is the one in use (%d GPU(s)); the table is slurmd's now: %s", len(gpus), o.Detail)}
	case !held:
		r, err := resolve(gpus, o, t.NvidiaMajor, t.CapsMajor)
		if err != nil {
			why := fmt.Sprintf("slurmd's GPU table cannot be used (%v); gpufence gives no GPU to any step until the agent restarts with a table it can resolve", err)
			t.sources.Store(&why)
			return Settled{Outcome: SettleKept, Origin: cur.origin, Message: why}
		}
		r.shares = sharesOf(in, o)
		t.layout.Store(r)
		t.sources.Store(&o.Untrusted)
		if v := t.nvml.Load(); v != nil {
			t.checkNVMLLocked(v.driver)
		}
		return Settled{Outcome: SettleSwitched, Origin: o,
			Message: fmt.Sprintf("slurmd answered with another GPU table than the one in use (%s) and no job holds a GPU: the table is slurmd's now (%d GPU(s)): %s", describeDifference(i, gpus, inUse), len(gpus), o.Detail)}
	default:
		why := changed(o.Source, "answered late with another table than the one in use, while jobs hold GPUs from it", i, gpus, inUse)
		t.sources.Store(&why)
		return Settled{Outcome: SettleKept, Origin: cur.origin, Message: why}
	}
}

// Late asks slurmd again for a table made without its answer (slurmd -G
// failed at start: under the packaged unit the agent starts before
// slurmd), once slurmd runs, until it answers (Settle). One slurmd -G
// runs at a time; failures are retried after a growing pause, at most
// Tries times (a SIGHUP asks again after that). Its methods are safe for
// concurrent use; none blocks but Await, for at most Wait.
type Late struct {
	Table *Table
	// Ask reads the sources again, slurmd -G included (bounded by its
	// own timeout).
	Ask func(context.Context) Input
	// Held says whether a kernel entry was made from the table: a step
	// holds a GPU (called with the table held against requests, see
	// Hold).
	Held     func() bool
	Log      *slog.Logger
	Recorder interface{ Emit(audit.Record) }
	// Changed, when set, is called after the table was settled (the state
	// file is written again).
	Changed func()
	// First and Max pace the retries (default 5 s and 5 min); Tries
	// bounds them (default 20); Wait bounds how long a request waits for
	// a slurmd -G in flight (default 3 s, and never past its deadline
	// less 1 s).
	First, Max time.Duration
	Tries      int
	Wait       time.Duration

	mu      sync.Mutex
	ctx     context.Context
	running chan struct{} // closed when the run in flight ends; nil: none
	next    time.Time
	fails   int
	sawUp   bool
	runs    int
}

// Start sets the context runs are made in and the first retry's time; call
// it once, before Kick.
func (l *Late) Start(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ctx = ctx
	l.next = time.Now().Add(l.first())
}

func (l *Late) first() time.Duration {
	if l.First > 0 {
		return l.First
	}
	return 5 * time.Second
}

// Kick asks slurmd again when the table is pending, no run is in flight,
// and the pause after the last failure is over. up says slurmd is seen
// running (its pid file written, a prolog or a step it started): the first
// such kick asks at once, without waiting for the pause.
func (l *Late) Kick(up bool) {
	if l == nil || !l.Table.Pending() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.kickLocked(up)
}

func (l *Late) kickLocked(up bool) {
	tries := l.Tries
	if tries <= 0 {
		tries = 20
	}
	if l.ctx == nil || l.running != nil || l.fails >= tries || l.ctx.Err() != nil {
		return
	}
	now := time.Now()
	if up && !l.sawUp {
		l.sawUp = true
		l.next = now
	}
	if now.Before(l.next) {
		return
	}
	done := make(chan struct{})
	l.running = done
	l.runs++
	go l.run(l.ctx, done)
}

func (l *Late) run(ctx context.Context, done chan struct{}) {
	s := l.Offer(l.Ask(ctx))
	l.mu.Lock()
	if s.Outcome == SettleFailed {
		l.fails++
		pause := l.first() << min(l.fails-1, 16)
		mx := l.Max
		if mx <= 0 {
			mx = 5 * time.Minute
		}
		pause = min(pause, mx)
		l.next = time.Now().Add(pause)
		tries := l.Tries
		if tries <= 0 {
			tries = 20
		}
		if l.fails >= tries {
			l.Log.Error("GPU table: slurmd -G still fails; the agent stops asking (send it SIGHUP to ask again)", "tries", l.fails, "detail", s.Message)
		} else {
			l.Log.Warn("GPU table: slurmd -G failed again; asking again later", "tries", l.fails, "next_in", pause, "detail", s.Message)
		}
	}
	l.running = nil
	l.mu.Unlock()
	close(done)
}

// Pending is the table's Pending (a nil Late waits for nothing).
func (l *Late) Pending() bool { return l != nil && l.Table.Pending() }

// Hold is the table's Hold (a nil Late holds nothing).
func (l *Late) Hold() (release func()) {
	if l == nil {
		return func() {}
	}
	return l.Table.Hold()
}

// Runs is how many slurmd -G Late started (for tests).
func (l *Late) Runs() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs
}

// Await, for a request that would give a GPU while the table is pending,
// kicks (slurmd runs: it sent the request) and waits for the slurmd -G in
// flight, at most Wait and never past ctx's deadline less 1 s. The request
// then decides with the table as it is: settled, or still pending (and
// then as trusted as at start).
func (l *Late) Await(ctx context.Context) {
	if l == nil || !l.Table.Pending() {
		return
	}
	l.mu.Lock()
	l.kickLocked(true)
	done := l.running
	l.mu.Unlock()
	if done == nil {
		return
	}
	wait := l.Wait
	if wait <= 0 {
		wait = 3 * time.Second
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)-time.Second)
	}
	if wait <= 0 {
		return
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	case <-ctx.Done():
	}
}

// Offer settles the table with in (Settle), logs and audits what came of
// it, and returns it. SIGHUP offers slurmd's answer this way too.
func (l *Late) Offer(in Input) Settled {
	l.Table.use.Lock()
	s := l.Table.Settle(in, l.Held != nil && l.Held())
	l.Table.use.Unlock()
	if s.Outcome == SettleFailed || s.Outcome == "" {
		return s
	}
	attrs := []any{"outcome", s.Outcome, "source", s.Origin.Source, "gpus", len(l.Table.GPUs()), "detail", s.Message}
	if s.Origin.Slurmd != "" {
		attrs = append(attrs, "slurmd", s.Origin.Slurmd)
	}
	rec := audit.Record{Event: audit.EventGPUTableMismatch, Severity: audit.SeverityInfo, Error: "slurmd_late_" + s.Outcome + ": " + s.Message}
	switch why := l.Table.Untrusted(); {
	case why != "":
		l.Log.Error("GPU table settled by slurmd's late answer: failing closed: steps that ask for a GPU are refused, CPU-only steps run", append(attrs, "untrusted", why)...)
		rec.Severity, rec.Message = audit.SeverityError, "once slurmd ran, its GPU table was asked again ("+s.Outcome+"); steps that ask for a GPU are refused"
	default:
		l.Log.Info("GPU table settled by slurmd's late answer", attrs...)
		rec.Message = "once slurmd ran, its GPU table was asked again (" + s.Outcome + "); the GPU table is " + s.Origin.Source + "'s; GPUs are given out"
	}
	if l.Recorder != nil {
		l.Recorder.Emit(rec)
	}
	if l.Changed != nil {
		l.Changed()
	}
	return s
}
