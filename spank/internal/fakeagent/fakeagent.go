// SPDX-License-Identifier: Apache-2.0

// Package fakeagent is a scripted gpufence agent for tests: it listens on a
// unix socket, speaks the real framing (proto/wire) and answers each request
// with what the test says.
package fakeagent

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/proto/wire"
)

// Answer returns the response to req, nil to never answer (the connection
// stays open until the test ends), or HangUp.
type Answer func(req *pb.Request) *pb.Response

// HangUp, returned by an Answer, closes the connection without answering,
// as an agent that dies mid-request does.
var HangUp = &pb.Response{Error: "fakeagent: hang up"}

// Agent is one listening fake agent.
type Agent struct {
	Socket string

	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	reqs []*pb.Request
	done chan struct{}
}

// Start listens on a fresh socket (short path, under 108 bytes) and serves
// until the test ends.
func Start(t testing.TB, answer Answer) *Agent {
	t.Helper()
	dir, err := os.MkdirTemp("", "gf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return StartAt(t, filepath.Join(dir, "agent.sock"), answer)
}

// StartAt listens on socket, for an agent that appears where a client
// already looks (AbsentSocket).
func StartAt(t testing.TB, socket string, answer Answer) *Agent {
	t.Helper()
	a := &Agent{Socket: socket, done: make(chan struct{})}
	var err error
	if a.ln, err = net.Listen("unix", a.Socket); err != nil {
		t.Fatal(err)
	}
	a.wg.Add(1)
	go a.serve(t, answer)
	t.Cleanup(func() {
		close(a.done)
		a.ln.Close()
		a.wg.Wait()
	})
	return a
}

// AbsentSocket returns a socket path where nothing listens.
func AbsentSocket(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "absent.sock")
}

// Requests returns the requests received so far, in order.
func (a *Agent) Requests() []*pb.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*pb.Request(nil), a.reqs...)
}

func (a *Agent) serve(t testing.TB, answer Answer) {
	defer a.wg.Done()
	for {
		c, err := a.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			t.Errorf("fake agent: accept: %v", err)
			return
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.handle(t, c, answer)
		}()
	}
}

func (a *Agent) handle(t testing.TB, c net.Conn, answer Answer) {
	conn := wire.NewConn(c)
	defer conn.Close()
	req := &pb.Request{}
	if err := conn.Read(req, time.Now().Add(10*time.Second)); err != nil {
		t.Errorf("fake agent: read request: %v", err)
		return
	}
	a.mu.Lock()
	a.reqs = append(a.reqs, req)
	a.mu.Unlock()
	resp := answer(req)
	if resp == nil {
		<-a.done
		return
	}
	if resp == HangUp {
		return
	}
	if err := conn.Write(resp, time.Now().Add(10*time.Second)); err != nil {
		t.Errorf("fake agent: write response: %v", err)
	}
}
