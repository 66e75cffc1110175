// SPDX-License-Identifier: Apache-2.0

package accept

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.EMFILE)}, ReasonEMFILE},
		{&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.ENFILE)}, ReasonENFILE},
		{syscall.ENOBUFS, ReasonENOBUFS},
		{syscall.ENOMEM, ReasonENOMEM},
		{syscall.ECONNABORTED, ReasonECONNABORTED},
		{syscall.EPROTO, ReasonOther},
		{errors.New("no errno"), ReasonOther},
	} {
		if got := Reason(tc.err); got != tc.want {
			t.Errorf("Reason(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

func TestBudget(t *testing.T) {
	for _, tc := range []struct {
		configured int
		nofile     uint64
		want       int
	}{
		{64, 65536, 64},   // the unit's LimitNOFILE: the setting rules
		{64, 1024, 64},    // systemd's default soft limit
		{64, 256, 64},     // exactly a quarter
		{64, 100, 25},     // a tight limit: a quarter of it
		{1000, 1024, 256}, // a setting above the budget is cut
		{64, 2, 1},        // never 0: the endpoint still answers one
	} {
		if got := Budget(tc.configured, tc.nofile); got != tc.want {
			t.Errorf("Budget(%d, %d) = %d, want %d", tc.configured, tc.nofile, got, tc.want)
		}
	}
}

// flaky fails its first accepts with EMFILE, then accepts.
type flaky struct {
	net.Listener
	left atomic.Int32
}

func (f *flaky) Accept() (net.Conn, error) {
	if f.left.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return f.Listener.Accept()
}

// Limited holds at most max connections: the next ones are closed at once
// (the client reads EOF or a reset, not a hang) and counted; closing one
// frees a place; failed accepts are retried inside Accept, never returned.
func TestLimited(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &flaky{Listener: raw}
	f.left.Store(3)
	var shed, errs atomic.Int32
	l := Limit(f, 2, &Retry{Name: "test", OnError: func(string) { errs.Add(1) }}, func() { shed.Add(1) })
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	dial()
	first := <-accepted
	<-accepted
	if errs.Load() != 3 {
		t.Errorf("%d failed accepts counted, want 3", errs.Load())
	}
	// The third is over the cap: reset by the listener within moments
	// (so fast that the reset may reach connect itself).
	if over, err := net.Dial("tcp", raw.Addr().String()); err == nil {
		defer over.Close()
		over.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := over.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection over the cap: read %v, want EOF or reset", err)
		}
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connection over the cap: %v", err)
	}
	for deadline := time.Now().Add(2 * time.Second); shed.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if shed.Load() != 1 || l.Open() != 2 {
		t.Errorf("shed %d, open %d; want 1 and 2", shed.Load(), l.Open())
	}
	// A place freed is taken by the next client.
	first.Close()
	first.Close() // a second Close frees nothing more
	dial()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(2 * time.Second):
		t.Fatal("no connection accepted after one closed")
	}
	if l.Open() != 1 {
		t.Errorf("open %d after one of two closed and a third closed, want 1", l.Open())
	}
	l.Close()
	if _, ok := <-accepted; ok {
		t.Error("Accept returned a connection after Close")
	}
}

// Close ends a backoff wait at once: a stop never waits out a second.
func TestRetryStopsOnDone(t *testing.T) {
	r := &Retry{delay: maxDelay}
	done := make(chan struct{})
	close(done)
	t0 := time.Now()
	if r.Failed(io.ErrUnexpectedEOF, done) {
		t.Error("Failed returned true after done closed")
	}
	if time.Since(t0) > 500*time.Millisecond {
		t.Errorf("Failed waited %s after done", time.Since(t0))
	}
}
