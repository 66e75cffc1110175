// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/server"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

type nothing struct{}

func (nothing) Handle(context.Context, peer.Peer, *pb.Request) *pb.Response { return &pb.Response{} }

// agentHealth fails while the socket is not served (its listener exists,
// connects succeed into the backlog, nobody accepts) and while the state
// stays locked; it passes once the server serves and the lock is free.
func TestAgentHealth(t *testing.T) {
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := server.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	var locked sync.Mutex
	health := agentHealth(sock, func() { locked.Lock(); locked.Unlock() })
	check := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		return health(ctx)
	}
	if err := check(); err == nil || !strings.Contains(err.Error(), "plugin socket does not serve") {
		t.Errorf("health with nobody accepting: %v, want the socket named", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go server.New(ln, nothing{}, discard, time.Second).Serve(ctx)
	if err := check(); err != nil {
		t.Errorf("health of a serving agent: %v", err)
	}
	locked.Lock()
	if err := check(); err == nil || !strings.Contains(err.Error(), "state stayed locked") {
		t.Errorf("health with the state locked: %v", err)
	}
	locked.Unlock()
}

// The watchdog pings systemd only while health passes: an agent that
// cannot serve stops pinging, and systemd (WatchdogSec=) restarts it.
func TestWatchdogPingsOnlyWhenHealthy(t *testing.T) {
	dir := t.TempDir()
	notifySock := filepath.Join(dir, "notify")
	nc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifySock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	t.Setenv("NOTIFY_SOCKET", notifySock)
	t.Setenv("WATCHDOG_USEC", "100000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	var healthy atomic.Bool
	health := func(context.Context) error {
		if healthy.Load() {
			return nil
		}
		return io.ErrUnexpectedEOF
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { watchdog(ctx, health, slog.New(slog.NewTextHandler(io.Discard, nil))); close(done) }()
	defer func() { cancel(); <-done }()
	read := func(within time.Duration) string {
		nc.SetReadDeadline(time.Now().Add(within))
		b := make([]byte, 256)
		n, err := nc.Read(b)
		if err != nil {
			return ""
		}
		return string(b[:n])
	}
	// Ten intervals of a failing check: not one ping.
	if got := read(time.Second); got != "" {
		t.Fatalf("watchdog pinged %q while health failed", got)
	}
	healthy.Store(true)
	if got := read(2 * time.Second); got != "WATCHDOG=1" {
		t.Errorf("watchdog with health passing: %q, want WATCHDOG=1", got)
	}
}
