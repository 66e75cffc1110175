// Package agentclient sends one request to the gpufence agent and waits for
// its answer. It is what the SPANK plugin runs inside slurmstepd, and what
// tests use to speak to a real agent.
package agentclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/proto/wire"
)

// ErrAgent marks an error the agent itself returned (as opposed to failing to
// reach it); its text is meant for the user.
var ErrAgent = errors.New("agent refused")

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
