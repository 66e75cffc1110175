// SPDX-License-Identifier: Apache-2.0

// Package agentclient sends one request to the gpufence agent and waits for
// its answer. It is what the SPANK plugin runs inside slurmstepd, and what
// tests use to speak to a real agent.
package agentclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/proto/wire"
)

// ErrAgent marks an error the agent itself returned (as opposed to failing to
// reach it); its text is meant for the user.
var ErrAgent = errors.New("agent refused")

// ErrNotAgent is returned when the process listening on the socket is not
// root (nor this process's own user): whatever it answers is not the
// gpufence agent's, so it is never trusted, and failure=open does not apply.
var ErrNotAgent = errors.New("the listener is not the gpufence agent")

// Call dials socket, sends req and returns the agent's response. The whole
// exchange, connect included, is bounded by timeout.
func Call(socket string, req *pb.Request, timeout time.Duration) (*pb.Response, error) {
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("connect to agent at %s: %w", socket, err)
	}
	if err := checkListener(c, socket); err != nil {
		c.Close()
		return nil, err
	}
	conn := wire.NewConn(c)
	defer conn.Close()
	if req.Version == pb.ProtocolVersion_PROTOCOL_VERSION_UNSPECIFIED {
		req.Version = pb.ProtocolVersion_PROTOCOL_VERSION_1
	}
	if err := conn.Write(req, deadline); err != nil {
		return nil, fmt.Errorf("send to agent at %s: %w", socket, err)
	}
	resp := &pb.Response{}
	if err := conn.Read(resp, deadline); err != nil {
		return nil, fmt.Errorf("read answer from agent at %s: %w", socket, err)
	}
	if resp.Error != "" {
		return resp, fmt.Errorf("%w: %s", ErrAgent, resp.Error)
	}
	return resp, nil
}

// checkListener refuses a socket whose listening process is not root: the
// agent runs as root, and slurmstepd, which calls this, is root too. (A
// client that is not root, a test, may also trust a listener of its own
// uid.) SO_PEERCRED of a connected unix socket names the process that
// called listen.
func checkListener(c net.Conn, socket string) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("check the listener at %s: %w", socket, err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return fmt.Errorf("check the listener at %s: %w", socket, err)
	}
	if credErr != nil {
		return fmt.Errorf("check the listener at %s: %w", socket, credErr)
	}
	if cred.Uid != 0 && cred.Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("%w: the process listening on %s (pid %d) runs as uid %d, not root; gpufence refuses to trust it (is something other than the gpufence agent bound to its socket?)",
			ErrNotAgent, socket, cred.Pid, cred.Uid)
	}
	return nil
}
