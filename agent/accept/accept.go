// SPDX-License-Identifier: Apache-2.0

// Package accept keeps a listener serving through the accept errors that
// pass (EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED: a full descriptor
// table is a state of the node, not the end of the service) and bounds the
// connections one listener holds, so that no client can spend the agent's
// descriptors.
package accept

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// Backoff bounds, as net/http's Server uses for the same errors: short
// enough that a step waits milliseconds once descriptors are free again,
// long enough that a full table does not spin a core.
const (
	minDelay = 5 * time.Millisecond
	maxDelay = time.Second
)

// logEvery bounds how often a failing listener logs: an attacker who keeps
// the table full must not fill the journal too.
var logEvery = 10 * time.Second

// Reasons an accept failed, as metric label values: a fixed set.
const (
	ReasonEMFILE       = "EMFILE"
	ReasonENFILE       = "ENFILE"
	ReasonENOBUFS      = "ENOBUFS"
	ReasonENOMEM       = "ENOMEM"
	ReasonECONNABORTED = "ECONNABORTED"
	ReasonOther        = "other"
)

// Reasons are every value Reason returns, for a metric's label set.
var Reasons = []string{ReasonEMFILE, ReasonENFILE, ReasonENOBUFS, ReasonENOMEM, ReasonECONNABORTED, ReasonOther}

// Reason names err's errno for a metric label.
func Reason(err error) string {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return ReasonOther
	}
	switch errno {
	case syscall.EMFILE:
		return ReasonEMFILE
	case syscall.ENFILE:
		return ReasonENFILE
	case syscall.ENOBUFS:
		return ReasonENOBUFS
	case syscall.ENOMEM:
		return ReasonENOMEM
	case syscall.ECONNABORTED:
		return ReasonECONNABORTED
	}
	return ReasonOther
}

// Closed reports whether err means the listener was closed: the only
// accept error that ends a loop.
func Closed(err error) bool { return errors.Is(err, net.ErrClosed) }

// Retry is one listener's backoff after failed accepts. Not safe for
// concurrent use: one accept loop owns it.
type Retry struct {
	// Name is the listener in logs and metrics (plugin, metrics).
	Name string
	Log  *slog.Logger
	// OnError is told of every failed accept, by Reason; nil counts nowhere.
	OnError func(reason string)

	delay    time.Duration
	failures int // since the last accept that worked
	unlogged int // failures since the last log line
	lastLog  time.Time
	first    time.Time // of the current failing spell
}

// Failed records a failed accept and waits the backoff delay, or until done
// closes; it returns false when done closed.
func (r *Retry) Failed(err error, done <-chan struct{}) bool {
	reason := Reason(err)
	if r.OnError != nil {
		r.OnError(reason)
	}
	now := time.Now()
	if r.failures == 0 {
		r.first = now
	}
	r.failures++
	r.unlogged++
	if r.delay == 0 {
		r.delay = minDelay
	} else if r.delay *= 2; r.delay > maxDelay {
		r.delay = maxDelay
	}
	if r.Log != nil && now.Sub(r.lastLog) >= logEvery {
		r.Log.Error("accept failed; retrying", "listener", r.Name, "reason", reason, "err", err,
			"failures", r.unlogged, "retry_in", r.delay)
		r.lastLog, r.unlogged = now, 0
	}
	t := time.NewTimer(r.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// Accepted ends a failing spell: the next failure starts from the shortest
// delay again.
func (r *Retry) Accepted() {
	if r.failures == 0 {
		return
	}
	if r.Log != nil {
		r.Log.Warn("accepting again", "listener", r.Name, "failures", r.failures, "after", time.Since(r.first).Round(time.Millisecond))
	}
	r.failures, r.unlogged, r.delay, r.lastLog = 0, 0, 0, time.Time{}
}

// Limited is a listener that holds at most Max connections: one accepted
// beyond that is closed at once, so it costs a descriptor for microseconds,
// and the clients holding the others are the ones a timeout must end.
// Its Accept retries failed accepts itself (Retry), so the server above it
// sees a connection or the listener's close, never a passing error.
type Limited struct {
	net.Listener
	max    int
	retry  *Retry
	onShed func()

	mu        sync.Mutex
	open      int
	done      chan struct{}
	closeOnce sync.Once

	// Owned by Accept: shed connections not logged yet, and when the last
	// line about them went out.
	unloggedShed int
	lastShedLog  time.Time
}

// Limit wraps ln; max is at least 1 (Budget). onShed, when set, is told
// of each connection closed unserved because max were open.
func Limit(ln net.Listener, max int, retry *Retry, onShed func()) *Limited {
	return &Limited{Listener: ln, max: max, retry: retry, onShed: onShed, done: make(chan struct{})}
}

// Open is how many connections it holds now.
func (l *Limited) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Accept returns the next connection while fewer than Max are open.
func (l *Limited) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if Closed(err) || !l.retry.Failed(err, l.done) {
				return nil, err
			}
			continue
		}
		l.retry.Accepted()
		l.mu.Lock()
		full := l.open >= l.max
		if !full {
			l.open++
		}
		l.mu.Unlock()
		if full {
			// A reset rather than a FIN: the client learns at once, and no
			// TIME_WAIT is left on the agent's side.
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
			c.Close()
			if l.onShed != nil {
				l.onShed()
			}
			l.logShed()
			continue
		}
		return &conn{Conn: c, l: l}, nil
	}
}

// logShed says, at most every logEvery, that connections are being shed.
func (l *Limited) logShed() {
	l.unloggedShed++
	if l.retry.Log == nil || time.Since(l.lastShedLog) < logEvery {
		return
	}
	l.retry.Log.Warn("connections shed: the listener holds its maximum", "listener", l.retry.Name, "max", l.max, "shed", l.unloggedShed)
	l.lastShedLog, l.unloggedShed = time.Now(), 0
}

// Close closes the listener and ends a backoff wait.
func (l *Limited) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type conn struct {
	net.Conn
	l    *Limited
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		c.l.mu.Unlock()
	})
	return err
}

// Budget is how many connections the metrics endpoint may hold: the
// configured number, but never more than a quarter of the open-files limit
// nofile, so that three quarters stay for the plugin's socket and the
// agent's own work (BPF objects, pidfds, /proc reads, audit sinks), whatever
// local users do to the endpoint. At least 1.
func Budget(configured int, nofile uint64) int {
	n := uint64(configured)
	if q := nofile / 4; q < n {
		n = q
	}
	if n < 1 {
		n = 1
	}
	return int(n)
}

// RaiseNoFile raises the soft open-files limit to the hard one and returns
// the soft limit in force afterwards. (The Go runtime does this at start
// too; doing it here makes the figure Budget uses the one in force, and the
// children the agent runs inherit it.)
func RaiseNoFile() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, err
		}
	}
	return lim.Cur, nil
}
