// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// memConn is a net.Conn over bytes: reads from in, writes to out.
type memConn struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (m *memConn) Read(p []byte) (int, error)       { return m.in.Read(p) }
func (m *memConn) Write(p []byte) (int, error)      { return m.out.Write(p) }
func (m *memConn) Close() error                     { return nil }
func (m *memConn) LocalAddr() net.Addr              { return nil }
func (m *memConn) RemoteAddr() net.Addr             { return nil }
func (m *memConn) SetDeadline(time.Time) error      { return nil }
func (m *memConn) SetReadDeadline(time.Time) error  { return nil }
func (m *memConn) SetWriteDeadline(time.Time) error { return nil }

func frame(size uint64, body []byte) []byte {
	return append(protowire.AppendVarint(nil, size), body...)
}

func prolog() *pb.Request {
	return &pb.Request{Version: pb.ProtocolVersion_PROTOCOL_VERSION_1,
		Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 7, Uid: 1000, JobGpus: proto.String("0,2")}}}
}

func TestRead(t *testing.T) {
	good, err := proto.Marshal(prolog())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		in    []byte
		check func(error) bool
	}{
		{"one frame", frame(uint64(len(good)), good), func(err error) bool { return err == nil }},
		{"nothing", nil, func(err error) bool { return err == io.EOF }},
		{"size over the cap, no body", frame(MaxFrameSize+1, nil), func(err error) bool { return errors.Is(err, ErrFrameTooLarge) }},
		{"size 2^63, no body", frame(1<<63, nil), func(err error) bool { return errors.Is(err, ErrFrameTooLarge) }},
		{"size at the cap, short body", frame(MaxFrameSize, good), isTruncated},
		{"body cut short", frame(uint64(len(good)), good[:len(good)-1]), isTruncated},
		{"length cut short", []byte{0x80}, isTruncated},
		{"length of 11 bytes", bytes.Repeat([]byte{0xff}, 11), isBad},
		{"garbage body", frame(3, []byte{0xff, 0xff, 0xff}), isBad},
		{"invalid UTF-8 in a string", frame(7, []byte{0x52, 0x05, 0x1a, 0x03, 0xff, 0xfe, 0xfd}), isBad},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &pb.Request{}
			err := NewConn(&memConn{in: bytes.NewReader(tt.in)}).Read(m, time.Now().Add(time.Second))
			if !tt.check(err) {
				t.Fatalf("Read: %v", err)
			}
			if err == nil && !proto.Equal(m, prolog()) {
				t.Fatalf("Read %v, want %v", m, prolog())
			}
		})
	}
}

func isTruncated(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) && err != io.EOF && !errors.Is(err, ErrFrameTooLarge)
}

func isBad(err error) bool {
	return err != nil && err != io.EOF && !errors.Is(err, ErrFrameTooLarge) && strings.HasPrefix(err.Error(), "read frame: ")
}

func TestWriteTooLarge(t *testing.T) {
	m := &pb.Response{Error: strings.Repeat("x", MaxFrameSize)}
	c := &memConn{in: bytes.NewReader(nil)}
	if err := NewConn(c).Write(m, time.Now().Add(time.Second)); !errors.Is(err, ErrFrameTooLarge) || c.out.Len() != 0 {
		t.Fatalf("Write of %d bytes: %v, %d bytes sent", proto.Size(m), err, c.out.Len())
	}
}

// TestUnixSocket speaks to a real socket: a hostile length is refused at
// once, a stalled peer meets the deadline, a good frame goes through.
func TestUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "gfwire")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	l, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	serve := func(send []byte, thenClose bool) *Conn {
		t.Helper()
		c, err := net.Dial("unix", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if _, err := c.Write(send); err != nil {
			t.Fatal(err)
		}
		if thenClose {
			c.Close()
		}
		return NewConn(s)
	}

	if err := serve(frame(1<<40, nil), false).Read(&pb.Request{}, time.Now().Add(5*time.Second)); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("1 TiB length: %v, want %v", err, ErrFrameTooLarge)
	}
	start := time.Now()
	var ne net.Error
	if err := serve(frame(100, []byte{0x08}), false).Read(&pb.Request{}, time.Now().Add(200*time.Millisecond)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("stalled peer: %v after %v, want a timeout", err, time.Since(start))
	}
	if err := serve(frame(100, []byte{0x08}), true).Read(&pb.Request{}, time.Now().Add(5*time.Second)); !isTruncated(err) {
		t.Errorf("peer gone mid-frame: %v", err)
	}
	c := &memConn{in: bytes.NewReader(nil)}
	if err := NewConn(c).Write(prolog(), time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	got := &pb.Request{}
	if err := serve(c.out.Bytes(), true).Read(got, time.Now().Add(5*time.Second)); err != nil || !proto.Equal(got, prolog()) {
		t.Errorf("good frame: %v, %v", got, err)
	}
}

// heapAllocs is the bytes allocated so far by the whole process.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// maxReadAlloc bounds what one Read may allocate whatever the peer sends:
// the body (at most MaxFrameSize) and the message decoded from it.
const maxReadAlloc = 32 * MaxFrameSize

// FuzzRead reads a stream of frames as the agent reads a request, and checks
// each outcome against the framing decoded here independently: EOF only
// before a frame, a length over the cap refused whatever follows, a
// truncated frame or a body that is not a Request an error, and a good
// frame read exactly. No Read allocates more than maxReadAlloc.
func FuzzRead(f *testing.F) {
	good, _ := proto.Marshal(prolog())
	step, _ := proto.Marshal(&pb.Request{Version: 1, Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{
		JobId: 9, StepId: 0, Uid: 1000, StepGpus: proto.String("1"), TaskPids: []uint32{100, 101, 102}}}})
	f.Add(frame(uint64(len(good)), good))
	f.Add(append(frame(uint64(len(good)), good), frame(uint64(len(step)), step)...))
	f.Add(frame(MaxFrameSize+1, nil))
	f.Add(frame(1<<63, good))
	f.Add(frame(uint64(len(good)), good[:3]))
	f.Add([]byte{0x80, 0x80})
	f.Add(frame(3, []byte{0xff, 0xff, 0xff}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := NewConn(&memConn{in: bytes.NewReader(data)})
		for off := 0; ; {
			m := &pb.Request{}
			before := heapAllocs()
			err := c.Read(m, time.Now().Add(time.Second))
			if a := heapAllocs() - before; a > maxReadAlloc {
				t.Fatalf("one Read allocated %d bytes (%d bytes of input)", a, len(data))
			}
			rest := data[off:]
			if len(rest) == 0 {
				if err != io.EOF {
					t.Fatalf("at the end of the stream: %v, want io.EOF", err)
				}
				return
			}
			size, n := protowire.ConsumeVarint(rest)
			switch {
			case n < 0 && len(rest) < 10 && rest[len(rest)-1] >= 0x80:
				if !isTruncated(err) {
					t.Fatalf("length cut short (% x): %v", rest, err)
				}
				return
			case n < 0:
				if err == nil || err == io.EOF || errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("bad length (% x): %v", rest[:min(len(rest), 11)], err)
				}
				return
			case size > MaxFrameSize:
				if !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("length %d: %v, want %v", size, err, ErrFrameTooLarge)
				}
				return
			case uint64(len(rest)-n) < size:
				if !isTruncated(err) {
					t.Fatalf("frame of %d with %d bytes: %v", size, len(rest)-n, err)
				}
				return
			}
			want := &pb.Request{}
			if werr := proto.Unmarshal(rest[n:n+int(size)], want); werr != nil {
				if !isBad(err) {
					t.Fatalf("body that is no Request (%v): %v", werr, err)
				}
				return
			}
			if err != nil || !proto.Equal(m, want) {
				t.Fatalf("frame read as %v, %v; want %v", m, err, want)
			}
			off += n + int(size)
		}
	})
}

// FuzzRoundTrip: any Request that fits is written as one frame and read
// back equal; one that does not fit is refused before anything is sent.
func FuzzRoundTrip(f *testing.F) {
	good, _ := proto.Marshal(prolog())
	f.Add(good)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		m := &pb.Request{}
		if proto.Unmarshal(body, m) != nil {
			return
		}
		c := &memConn{in: bytes.NewReader(nil)}
		err := NewConn(c).Write(m, time.Now().Add(time.Second))
		if proto.Size(m) > MaxFrameSize {
			if !errors.Is(err, ErrFrameTooLarge) || c.out.Len() != 0 {
				t.Fatalf("%d bytes: %v, %d bytes sent", proto.Size(m), err, c.out.Len())
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		back := &pb.Request{}
		r := NewConn(&memConn{in: bytes.NewReader(c.out.Bytes())})
		if err := r.Read(back, time.Now().Add(time.Second)); err != nil || !proto.Equal(back, m) {
			t.Fatalf("read back %v, %v; want %v", back, err, m)
		}
		if err := r.Read(&pb.Request{}, time.Now().Add(time.Second)); err != io.EOF {
			t.Fatalf("after the one frame: %v, want io.EOF", err)
		}
	})
}
