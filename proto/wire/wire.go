// SPDX-License-Identifier: Apache-2.0

// Package wire frames protocol messages on a stream: a varint length, then the
// message (protodelim), with a size cap and a deadline on every exchange, so a
// stuck or hostile peer can neither block a step launch nor make the agent
// allocate without bound.
package wire

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"
)

// MaxFrameSize caps one message. The largest real message (a step with a few
// thousand task pids) is far below it.
const MaxFrameSize = 64 << 10

// ErrFrameTooLarge is returned for a frame over MaxFrameSize.
var ErrFrameTooLarge = errors.New("frame exceeds size cap")

// Conn reads and writes framed messages on one connection.
type Conn struct {
	c net.Conn
	r *bufio.Reader
}

// NewConn wraps c.
func NewConn(c net.Conn) *Conn {
	return &Conn{c: c, r: bufio.NewReaderSize(c, 4096)}
}

// Read reads one message, giving up at deadline.
func (c *Conn) Read(m proto.Message, deadline time.Time) error {
	if err := c.c.SetReadDeadline(deadline); err != nil {
		return err
	}
	err := protodelim.UnmarshalOptions{MaxSize: MaxFrameSize}.UnmarshalFrom(c.r, m)
	var sizeErr *protodelim.SizeTooLargeError
	switch {
	case errors.As(err, &sizeErr):
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, sizeErr.Size, MaxFrameSize)
	case errors.Is(err, io.EOF):
		return io.EOF
	case err != nil:
		return fmt.Errorf("read frame: %w", err)
	}
	return nil
}

// Write writes one message, giving up at deadline.
func (c *Conn) Write(m proto.Message, deadline time.Time) error {
	if size := proto.Size(m); size > MaxFrameSize {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, size, MaxFrameSize)
	}
	if err := c.c.SetWriteDeadline(deadline); err != nil {
		return err
	}
	// One write for length and body: a peer that has read the whole frame
	// may hang up at once, and a trailing empty write would then fail.
	var buf bytes.Buffer
	if _, err := protodelim.MarshalTo(&buf, m); err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	if _, err := c.c.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }
