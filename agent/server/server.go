// SPDX-License-Identifier: Apache-2.0

// Package server accepts the SPANK plugin's connections on the agent's unix
// socket: root peers only (SO_PEERCRED), one size-capped, time-limited request
// and answer per connection.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/gpufence/gpufence/agent/accept"
	"github.com/gpufence/gpufence/agent/peer"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/proto/wire"
)

// Handler answers one request. The Response's Error is shown to the user.
type Handler interface {
	Handle(ctx context.Context, p peer.Peer, req *pb.Request) *pb.Response
}

// Listen creates the socket at path, mode 0600 owned by root. A stale socket
// left by a dead agent is replaced; a live one is an error, so two agents never
// fight over one node.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another agent is already listening on %s", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	// The umask keeps the socket private from its first moment; the
	// SO_PEERCRED check below guards even if the mode were changed later.
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return ln, nil
}

// Listener is what Server accepts on; *net.UnixListener is one.
type Listener interface {
	AcceptUnix() (*net.UnixConn, error)
	Close() error
	Addr() net.Addr
}

// Server serves one listener.
type Server struct {
	ln      Listener
	h       Handler
	log     *slog.Logger
	timeout time.Duration
	// uid besides root that may connect: the agent's own (root in
	// production; the test user when tests run unprivileged).
	uid uint32
	wg  sync.WaitGroup

	// slots bounds the connections served at once (one goroutine and one
	// fd each); onShed is told of each connection closed unserved.
	slots  chan struct{}
	onShed func()
	// onAcceptError is told of each failed accept, by accept.Reason.
	onAcceptError func(reason string)
}

// MaxConns is how many connections the server serves at once by default:
// far above what a node's steps send together (one per starting step),
// far below the agent's fd limit.
const MaxConns = 512

// shedWait is how long an accepted connection waits for a free slot before
// it is closed unserved: the plugin then tries once more.
var shedWait = time.Second

// New returns a server; timeout bounds reading a request and writing its
// answer (the handler's own work is bounded by the context it gets).
func New(ln Listener, h Handler, log *slog.Logger, timeout time.Duration) *Server {
	return &Server{ln: ln, h: h, log: log.With("component", "server"), timeout: timeout, uid: uint32(os.Geteuid()),
		slots: make(chan struct{}, MaxConns), onShed: func() {}, onAcceptError: func(string) {}}
}

// OnAcceptError sets what is told of each failed accept (by accept.Reason):
// the loop retries them, so this is where they become visible.
func (s *Server) OnAcceptError(f func(reason string)) {
	if f != nil {
		s.onAcceptError = f
	}
}

// Limit sets how many connections are served at once, and what is told of
// each one closed unserved because none was free for shedWait.
func (s *Server) Limit(max int, onShed func()) {
	s.slots = make(chan struct{}, max)
	if onShed != nil {
		s.onShed = onShed
	}
}

// Serve accepts until ctx ends, then waits for open exchanges. A failed
// accept (EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED, …) is retried
// with backoff, logged and counted: while the agent's descriptors are
// spent, steps wait in the socket's backlog instead of finding it dead for
// good. Only a closed listener ends the loop.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.ln.Close() })
	defer stop()
	retry := accept.Retry{Name: "plugin", Log: s.log, OnError: s.onAcceptError}
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if !accept.Closed(err) && ctx.Err() == nil && retry.Failed(err, ctx.Done()) {
				continue
			}
			s.wg.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		retry.Accepted()
		select {
		case s.slots <- struct{}{}:
		default:
			if !s.waitSlot(ctx) {
				// Closed unanswered: the plugin tries again, the agent's
				// goroutines and fds stay bounded.
				s.onShed()
				c.Close()
				s.log.Warn("connection shed: every slot busy", "max", cap(s.slots))
				continue
			}
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.slots }()
			s.serveConn(ctx, c)
		}()
	}
}

// waitSlot waits up to shedWait for a slot; the accept loop waits with it,
// so connections queue in the kernel's backlog meanwhile.
func (s *Server) waitSlot(ctx context.Context) bool {
	t := time.NewTimer(shedWait)
	defer t.Stop()
	select {
	case s.slots <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func (s *Server) serveConn(ctx context.Context, c *net.UnixConn) {
	conn := wire.NewConn(c)
	defer conn.Close()
	p, err := peer.Of(c)
	if err != nil {
		s.log.Error("cannot read peer credentials; closing", "err", err)
		return
	}
	defer p.Close()
	log := s.log.With("peer_pid", p.PID, "peer_uid", p.UID)
	// The request is read (size-capped, time-limited) before the peer is
	// judged, so that a refused client gets the reason instead of a broken
	// pipe; nothing of it is acted on unless the peer is root.
	req := &pb.Request{}
	if err := conn.Read(req, time.Now().Add(s.timeout)); err != nil {
		if !errors.Is(err, io.EOF) {
			log.Warn("bad request", "err", err)
			_ = conn.Write(&pb.Response{Error: "bad request: " + err.Error()}, time.Now().Add(s.timeout))
		}
		return
	}
	var resp *pb.Response
	if p.UID != 0 && p.UID != s.uid {
		log.Warn("refused request from non-root peer")
		resp = &pb.Response{Error: "permission denied: only root may talk to the gpufence agent"}
	} else if req.GetVersion() != pb.ProtocolVersion_PROTOCOL_VERSION_1 {
		resp = &pb.Response{Error: unsupportedVersion(req.GetVersion())}
	} else {
		hctx, cancel := context.WithTimeout(ctx, s.timeout)
		resp = s.h.Handle(hctx, p, req)
		cancel()
	}
	if err := conn.Write(resp, time.Now().Add(s.timeout)); err != nil {
		log.Warn("cannot send answer", "err", err)
	}
}

// unsupportedVersion is the answer to a request of protocol version v,
// which this agent does not speak.
func unsupportedVersion(v pb.ProtocolVersion) string {
	return fmt.Sprintf("protocol version %d is not supported by this agent (it speaks version %d); install matching gpufence plugin and agent versions",
		v, pb.ProtocolVersion_PROTOCOL_VERSION_1)
}

// Probe exchanges one frame with the server listening at socket within
// timeout: a request without a protocol version, which Serve answers
// itself, without the handler. Connecting alone would prove nothing: a
// unix socket's connect succeeds while the connection waits in the
// backlog, whether the agent accepts or not.
func Probe(socket string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("unix", socket)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", socket, err)
	}
	conn := wire.NewConn(c)
	defer conn.Close()
	if err := conn.Write(&pb.Request{}, deadline); err != nil {
		return fmt.Errorf("send to %s: %w", socket, err)
	}
	resp := &pb.Response{}
	if err := conn.Read(resp, deadline); err != nil {
		return fmt.Errorf("no answer from %s within %s: %w", socket, timeout, err)
	}
	if resp.GetError() != unsupportedVersion(0) {
		return fmt.Errorf("%s answered %q, not the agent's answer to a probe", socket, resp.GetError())
	}
	return nil
}
