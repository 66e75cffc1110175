// SPDX-License-Identifier: Apache-2.0

// Package peer is the process at the other end of a unix socket, as the
// kernel reports it (SO_PEERCRED, SO_PEERPIDFD): what the agent knows of
// who asks, never what the request says.
package peer

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Peer is the connecting process.
type Peer struct {
	PID int
	UID uint32
	GID uint32
	// pidfd pins the process (SO_PEERPIDFD, Linux 6.5+); pinned is false
	// on older kernels, where PID alone names it.
	pidfd  int
	pinned bool
}

// Of reads the peer of a connected unix socket. Close releases its pidfd.
func Of(c *net.UnixConn) (Peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var cred *unix.Ucred
	var credErr error
	pidfd, pidfdErr := -1, error(nil)
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		// The process that connected, as the kernel saw it at connect:
		// unlike its pid, a pidfd never comes to name another process.
		pidfd, pidfdErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return Peer{}, err
	}
	if credErr != nil {
		if pidfdErr == nil {
			unix.Close(pidfd)
		}
		return Peer{}, credErr
	}
	p := Peer{PID: int(cred.Pid), UID: cred.Uid, GID: cred.Gid}
	if pidfdErr == nil && pidfd >= 0 {
		unix.CloseOnExec(pidfd)
		p.pidfd, p.pinned = pidfd, true
	}
	return p, nil
}

// Close releases what Of opened.
func (p Peer) Close() {
	if p.pinned {
		unix.Close(p.pidfd)
	}
}

// Verify reports an error when the peer process has exited since it
// connected. Call it after reading something about the peer through its
// PID (/proc/<pid>/cgroup): if the peer still runs, that PID cannot have
// been reused by another process meanwhile, so what was read is the
// peer's. Without SO_PEERPIDFD (Linux < 6.5) it cannot tell and returns
// nil.
func (p Peer) Verify() error {
	if !p.pinned {
		return nil
	}
	if err := unix.PidfdSendSignal(p.pidfd, 0, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("the connecting process (pid %d) exited before its request was handled; its pid may belong to another process now", p.PID)
		}
		return fmt.Errorf("check the connecting process (pid %d): %w", p.PID, err)
	}
	return nil
}

// Pinned reports whether the peer is pinned by a pidfd (see Verify).
func (p Peer) Pinned() bool { return p.pinned }
