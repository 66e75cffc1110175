// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/proto/agentclient"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

type echo struct{ peers chan peer.Peer }

func (e echo) Handle(_ context.Context, p peer.Peer, r *pb.Request) *pb.Response {
	e.peers <- p
	if r.GetJobEpilog().GetJobId() == 13 {
		return &pb.Response{Error: "unlucky job"}
	}
	return &pb.Response{Gpus: []uint32{r.GetStepStart().GetJobId()}}
}

func start(t *testing.T) (string, chan peer.Peer) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	peers := make(chan peer.Peer, 10)
	ctx, cancel := context.WithCancel(context.Background())
	srv := New(ln, echo{peers}, slog.New(slog.NewTextHandler(io.Discard, nil)), 500*time.Millisecond)
	done := make(chan error)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return sock, peers
}

func TestExchange(t *testing.T) {
	sock, peers := start(t)
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	resp, err := agentclient.Call(sock, &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 42}}}, time.Second)
	if err != nil || len(resp.Gpus) != 1 || resp.Gpus[0] != 42 {
		t.Fatalf("got %v, %v", resp, err)
	}
	if p := <-peers; p.PID != os.Getpid() || p.UID != uint32(os.Geteuid()) {
		t.Errorf("peer %+v, want pid %d", p, os.Getpid())
	}
	_, err = agentclient.Call(sock, &pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 13}}}, time.Second)
	if !errors.Is(err, agentclient.ErrAgent) || !strings.Contains(err.Error(), "unlucky job") {
		t.Errorf("refusal: %v", err)
	}
}

func TestListenRefusesLiveSocket(t *testing.T) {
	sock, _ := start(t)
	if _, err := Listen(sock); err == nil || !strings.Contains(err.Error(), "already listening") {
		t.Errorf("second Listen: %v", err)
	}
}

func TestListenReplacesStaleSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	ln2, err := Listen(sock)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln2.Close()
}

func TestBadInput(t *testing.T) {
	sock, _ := start(t)
	dial := func() net.Conn {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	readErr := func(c net.Conn) string {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b, _ := io.ReadAll(c)
		return string(b)
	}

	// A frame announcing 1 MiB is refused without reading it.
	c := dial()
	c.Write(protowire.AppendVarint(nil, 1<<20))
	if got := readErr(c); !strings.Contains(got, "size cap") {
		t.Errorf("oversized frame answer %q", got)
	}
	c.Close()

	// A client that never sends is cut off after the timeout.
	c = dial()
	t0 := time.Now()
	got := readErr(c)
	if d := time.Since(t0); d > 1500*time.Millisecond {
		t.Errorf("silent client held the server for %v", d)
	}
	if !strings.Contains(got, "timeout") {
		t.Errorf("silent client answer %q", got)
	}
	c.Close()

	// Unknown protocol version.
	_, err := agentclient.Call(sock, &pb.Request{Version: 9, Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{}}}, time.Second)
	if err == nil || !strings.Contains(err.Error(), "protocol version 9") {
		t.Errorf("version 9: %v", err)
	}
}

// TestPrivilegedNonRootPeerRefused shows SO_PEERCRED guards the agent even if
// the socket's mode were opened up: a process running as nobody is refused.
func TestPrivilegedNonRootPeerRefused(t *testing.T) {
	if os.Getenv("GPUFENCE_TEST_DIAL") != "" {
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	sock, peers := start(t)
	// Both the socket and a copy of this test binary must be reachable by
	// nobody; t.TempDir's folders are private.
	for d := filepath.Dir(sock); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	os.Chmod(sock, 0o666)
	bin := filepath.Join(filepath.Dir(sock), "server.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestDialHelper$")
	cmd.Env = append(os.Environ(), "GPUFENCE_TEST_DIAL="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "only root may talk to the gpufence agent") {
		t.Errorf("non-root client was not refused: %s", out)
	}
	select {
	case p := <-peers:
		t.Errorf("handler ran for non-root peer %+v", p)
	default:
	}
}

func TestDialHelper(t *testing.T) {
	sock := os.Getenv("GPUFENCE_TEST_DIAL")
	if sock == "" {
		t.Skip("helper for TestPrivilegedNonRootPeerRefused")
	}
	if os.Getenv("GPUFENCE_TEST_DIAL_NOWAIT") != "" {
		// Send a request and exit without waiting for the answer.
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := proto.Marshal(&pb.Request{Version: pb.ProtocolVersion_PROTOCOL_VERSION_1, Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 2}}})
		c.Write(append(protowire.AppendVarint(nil, uint64(len(b))), b...))
		os.Exit(0)
	}
	_, err := agentclient.Call(sock, &pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 1}}}, time.Second)
	t.Logf("uid %d: %v", os.Getuid(), err)
	os.Stdout.WriteString(err.Error() + "\n")
}

// verifier answers after the test says so, with what Peer.Verify found then.
type verifier struct {
	got     chan peer.Peer
	proceed chan struct{}
	result  chan error
}

func (v verifier) Handle(_ context.Context, p peer.Peer, _ *pb.Request) *pb.Response {
	v.got <- p
	<-v.proceed
	v.result <- p.Verify()
	return &pb.Response{}
}

// kernelAtLeast reports whether the running kernel is at least major.minor.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	var ma, mi int
	fmt.Sscanf(b.String(), "%d.%d", &ma, &mi)
	return ma > major || (ma == major && mi >= minor)
}

// A peer pinned by its pidfd: Verify passes while it runs and fails once it
// exited, so a pid reused after slurmstepd died never stands in for it.
func TestPeerVerify(t *testing.T) {
	if os.Getenv("GPUFENCE_TEST_DIAL") != "" {
		return
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	v := verifier{got: make(chan peer.Peer, 1), proceed: make(chan struct{}), result: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := New(ln, v, slog.New(slog.NewTextHandler(io.Discard, nil)), 5*time.Second)
	go srv.Serve(ctx)

	// This process: alive throughout.
	go agentclient.Call(sock, &pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 1}}}, 5*time.Second)
	p := <-v.got
	if want := kernelAtLeast(t, 6, 5); p.Pinned() != want {
		t.Errorf("Pinned() = %v on this kernel, want %v (SO_PEERPIDFD is Linux 6.5+)", p.Pinned(), want)
	}
	v.proceed <- struct{}{}
	if err := <-v.result; err != nil {
		t.Errorf("Verify of a live peer: %v", err)
	}
	if !p.Pinned() {
		return
	}

	// A child that connects, sends, and exits before the handler looks.
	cmd := exec.Command(os.Args[0], "-test.run=^TestDialHelper$")
	cmd.Env = append(os.Environ(), "GPUFENCE_TEST_DIAL="+sock, "GPUFENCE_TEST_DIAL_NOWAIT=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p = <-v.got
	if p.PID != cmd.Process.Pid {
		t.Fatalf("peer pid %d, want the child's %d", p.PID, cmd.Process.Pid)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	v.proceed <- struct{}{}
	if err := <-v.result; err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("Verify of a peer that exited: %v, want an error saying it exited", err)
	}
}

// blocker holds every request until released.
type blocker struct {
	in      chan struct{}
	release chan struct{}
}

func (b blocker) Handle(context.Context, peer.Peer, *pb.Request) *pb.Response {
	b.in <- struct{}{}
	<-b.release
	return &pb.Response{}
}

// At most Limit connections are served at once; one that finds every slot
// busy for shedWait is closed unanswered and counted.
func TestConnectionLimit(t *testing.T) {
	old := shedWait
	shedWait = 200 * time.Millisecond
	defer func() { shedWait = old }()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	b := blocker{in: make(chan struct{}, 10), release: make(chan struct{})}
	srv := New(ln, b, slog.New(slog.NewTextHandler(io.Discard, nil)), 5*time.Second)
	var shed atomic.Int32
	srv.Limit(2, func() { shed.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()

	results := make(chan error, 3)
	call := func() {
		_, err := agentclient.Call(sock, &pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 1}}}, 3*time.Second)
		results <- err
	}
	go call()
	go call()
	<-b.in
	<-b.in
	go call() // finds both slots busy
	select {
	case err := <-results:
		if err == nil {
			t.Fatal("the third request was answered while two were held")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the third connection was neither served nor shed")
	}
	if shed.Load() != 1 {
		t.Errorf("shed %d connections, want 1", shed.Load())
	}
	close(b.release)
	for range 2 {
		if err := <-results; err != nil {
			t.Errorf("held request: %v", err)
		}
	}
	// Slots free again: served.
	go call()
	<-b.in
	if err := <-results; err != nil {
		t.Errorf("request after the burst: %v", err)
	}
}
