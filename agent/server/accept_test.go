// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/accept"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/proto/agentclient"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// failing fails its first accepts with errno, as accept4 does when the
// agent's descriptor table is full, then accepts from the real listener.
type failing struct {
	*net.UnixListener
	errno syscall.Errno

	mu    sync.Mutex
	left  int
	calls []time.Time
}

func (f *failing) AcceptUnix() (*net.UnixConn, error) {
	f.mu.Lock()
	f.calls = append(f.calls, time.Now())
	fail := f.left > 0
	f.left--
	f.mu.Unlock()
	if fail {
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", f.errno)}
	}
	return f.UnixListener.AcceptUnix()
}

// syncBuffer is a log sink that tests read while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The accept loop outlives every temporary accept error: the request after
// them is answered, each failure is counted by its errno, the retries back
// off instead of spinning, and the log says it once, then that it recovered.
func TestServeRetriesAcceptErrors(t *testing.T) {
	for _, tc := range []struct {
		errno  syscall.Errno
		reason string
	}{
		{syscall.EMFILE, accept.ReasonEMFILE},
		{syscall.ENFILE, accept.ReasonENFILE},
		{syscall.ENOBUFS, accept.ReasonENOBUFS},
		{syscall.ENOMEM, accept.ReasonENOMEM},
		{syscall.ECONNABORTED, accept.ReasonECONNABORTED},
		{syscall.EPROTO, accept.ReasonOther},
	} {
		t.Run(tc.reason+"/"+tc.errno.Error(), func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "agent.sock")
			ln, err := Listen(sock)
			if err != nil {
				t.Fatal(err)
			}
			const failures = 6
			f := &failing{UnixListener: ln, errno: tc.errno, left: failures}
			var logs syncBuffer
			srv := New(f, echo{make(chan peer.Peer, 10)}, slog.New(slog.NewTextHandler(&logs, nil)), time.Second)
			var mu sync.Mutex
			counted := map[string]int{}
			srv.OnAcceptError(func(r string) { mu.Lock(); counted[r]++; mu.Unlock() })
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ctx) }()

			resp, err := agentclient.Call(sock, &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 7}}}, 5*time.Second)
			if err != nil || len(resp.Gpus) != 1 || resp.Gpus[0] != 7 {
				t.Fatalf("request after %d failed accepts: %v %v", failures, resp, err)
			}
			select {
			case err := <-done:
				t.Fatalf("Serve returned after a temporary error: %v", err)
			default:
			}
			mu.Lock()
			if counted[tc.reason] != failures || len(counted) != 1 {
				t.Errorf("counted %v, want %d × %s", counted, failures, tc.reason)
			}
			mu.Unlock()
			// 5+10+20+40+80+160 ms: backing off, not spinning.
			f.mu.Lock()
			spent := f.calls[failures].Sub(f.calls[0])
			f.mu.Unlock()
			if spent < 300*time.Millisecond || spent > 3*time.Second {
				t.Errorf("%d retries took %s, want the 5ms-doubling backoff (~315ms)", failures, spent)
			}
			out := logs.String()
			if n := strings.Count(out, "accept failed; retrying"); n != 1 {
				t.Errorf("%d 'accept failed' lines for %d failures in a burst, want 1 (rate-limited):\n%s", n, failures, out)
			}
			if !strings.Contains(out, "accepting again") {
				t.Errorf("no recovery line:\n%s", out)
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve after cancel: %v", err)
			}
		})
	}
}

// A listener closed under the loop ends it with an error (the agent then
// stops and systemd restarts it), never a spin.
func TestServeEndsOnClosedListener(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(ln, echo{make(chan peer.Peer, 1)}, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Second)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	ln.Close()
	select {
	case err := <-done:
		if err == nil || !accept.Closed(err) {
			t.Errorf("Serve on a closed listener: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve still running 5s after its listener was closed")
	}
}

// Probe passes only while the accept loop serves: a socket whose listener
// nobody accepts on (connect succeeds, into the backlog) fails it, and so
// does a missing one.
func TestProbe(t *testing.T) {
	sock, _ := start(t)
	if err := Probe(sock, 2*time.Second); err != nil {
		t.Errorf("probe of a serving agent: %v", err)
	}
	idle := filepath.Join(t.TempDir(), "idle.sock")
	ln, err := Listen(idle)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t0 := time.Now()
	if err := Probe(idle, 300*time.Millisecond); err == nil {
		t.Error("probe passed on a socket nobody accepts on")
	} else if time.Since(t0) > 2*time.Second {
		t.Errorf("probe took %s, want its timeout", time.Since(t0))
	}
	if err := Probe(filepath.Join(t.TempDir(), "none.sock"), time.Second); err == nil {
		t.Error("probe passed on a missing socket")
	}
}
