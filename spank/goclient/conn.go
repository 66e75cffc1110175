// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// exchange is one request and answer on a new connection to the agent's
// socket, all before deadline. It talks to the kernel directly: the net
// package and its poller would add threads and init to every slurmstepd
// for one exchange of a few dozen bytes.
func exchange(socket string, deadline time.Time, frame []byte) (response, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return response{}, &sysErr{op: "socket", errno: errnoOf(err)}
	}
	defer syscall.Close(fd)
	if err := setTimeouts(fd, deadline); err != nil {
		return response{}, err
	}
	// A blocking connect on a unix socket waits, bounded by SO_SNDTIMEO,
	// only while the listener's backlog is full.
	for {
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: socket})
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return response{}, &sysErr{op: "connect", errno: errnoOf(err)}
	}
	if err := checkListener(fd, socket); err != nil {
		return response{}, err
	}
	for len(frame) > 0 {
		if err := setTimeouts(fd, deadline); err != nil {
			return response{}, err
		}
		n, err := syscall.Write(fd, frame)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return response{}, &sysErr{op: "write", errno: errnoOf(err)}
		}
		frame = frame[n:]
	}
	body, err := readFrame(fd, deadline)
	if err != nil {
		return response{}, err
	}
	return parseResponse(body)
}

// readFrame reads one varint-length-prefixed message.
func readFrame(fd int, deadline time.Time) ([]byte, error) {
	var buf []byte
	want := -1
	chunk := make([]byte, 512)
	for want < 0 || len(buf) < want {
		if want < 0 && len(buf) > 0 {
			size, n := protowire.ConsumeVarint(buf)
			switch {
			case n > 0 && size > maxFrame:
				return nil, errors.New("answer over " + strconv.Itoa(maxFrame) + " bytes")
			case n > 0:
				want = n + int(size)
				continue
			case len(buf) >= 10:
				return nil, errMalformed
			}
		}
		if err := setTimeouts(fd, deadline); err != nil {
			return nil, err
		}
		n, err := syscall.Read(fd, chunk)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &sysErr{op: "read", errno: errnoOf(err)}
		}
		if n == 0 {
			return nil, errHungUp
		}
		buf = append(buf, chunk[:n]...)
	}
	_, n := protowire.ConsumeVarint(buf)
	return buf[n:want], nil
}

var errHungUp = errors.New("the agent closed the connection without answering")

// setTimeouts bounds the next blocking call on fd by what is left until
// deadline.
func setTimeouts(fd int, deadline time.Time) error {
	left := time.Until(deadline)
	if left <= 0 {
		return errDeadline
	}
	tv := syscall.NsecToTimeval(left.Nanoseconds())
	if tv.Sec == 0 && tv.Usec == 0 {
		tv.Usec = 1 // 0 would mean no timeout at all
	}
	for _, opt := range []int{syscall.SO_SNDTIMEO, syscall.SO_RCVTIMEO} {
		if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, opt, &tv); err != nil {
			return &sysErr{op: "setsockopt", errno: errnoOf(err)}
		}
	}
	return nil
}

var errDeadline = errors.New("deadline")

// checkListener refuses a socket whose listening process is not root: the
// agent runs as root, and so does slurmstepd, which calls this. (A client
// that is not root, a test, may trust a listener of its own uid.)
// SO_PEERCRED of a connected unix socket names the process that listened.
func checkListener(fd int, socket string) error {
	cred, err := syscall.GetsockoptUcred(fd, syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	if err != nil {
		return &sysErr{op: "getsockopt SO_PEERCRED", errno: errnoOf(err)}
	}
	if cred.Uid != 0 && cred.Uid != uint32(syscall.Geteuid()) {
		return &refusal{text: "the process listening on " + socket + " (pid " + strconv.Itoa(int(cred.Pid)) +
			") runs as uid " + strconv.FormatUint(uint64(cred.Uid), 10) +
			", not root; gpufence refuses to trust it (is something other than the gpufence agent bound to its socket?)"}
	}
	return nil
}

// sysErr is a failed system call on the way to the agent.
type sysErr struct {
	op    string
	errno syscall.Errno
}

func (e *sysErr) Error() string { return e.op + ": " + e.errno.Error() }

func (e *sysErr) timeout() bool {
	return e.errno == syscall.EAGAIN || e.errno == syscall.EWOULDBLOCK || e.errno == syscall.ETIMEDOUT
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}
