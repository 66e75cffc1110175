// SPDX-License-Identifier: Apache-2.0

package status

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Socket is what the agent's socket looks like from outside: the file and,
// when something accepts on it, who that is. `gpufence status` and
// `gpufence doctor` both read it here.
type Socket struct {
	Path string
	// StatErr is why the path could not be looked at (ENOENT: no socket).
	StatErr  error
	IsSocket bool
	Mode     os.FileMode
	// UID owns the socket file.
	UID uint32
	// Listening: a connect succeeded (and was closed unused: the agent
	// reads EOF and drops it). The kernel queues a unix connect in the
	// listener's backlog whether or not anything accepts it, so this shows
	// who listens, not that the agent answers (server.Probe, the
	// watchdog's exchange, does that). DialErr says why not.
	Listening bool
	DialErr   error
	// PeerKnown says the kernel gave the listener's credentials
	// (SO_PEERCRED): PeerPID and PeerUID are those of the process that
	// called listen(), the agent or PID 1 when systemd holds the socket
	// for activation. PeerComm is its /proc comm, "" if unreadable.
	PeerKnown bool
	PeerPID   int32
	PeerUID   uint32
	PeerComm  string
}

// dialTimeout bounds the connect to a listener that does not accept.
const dialTimeout = 2 * time.Second

// ProbeSocket looks at the socket at path without following a link there,
// connects and closes at once, and asks the kernel who listens. It sends
// nothing: status and doctor judge the file and the listener's identity
// here, while the agent's own health check exchanges a frame
// (server.Probe).
func ProbeSocket(path string) Socket {
	s := Socket{Path: path}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		s.StatErr = err
		return s
	}
	s.Mode = os.FileMode(st.Mode & 0o7777)
	s.UID = st.Uid
	s.IsSocket = st.Mode&unix.S_IFMT == unix.S_IFSOCK
	if !s.IsSocket {
		return s
	}
	c, err := net.DialTimeout("unix", path, dialTimeout)
	if err != nil {
		s.DialErr = err
		return s
	}
	defer c.Close()
	s.Listening = true
	if uc, ok := c.(*net.UnixConn); ok {
		if raw, err := uc.SyscallConn(); err == nil {
			_ = raw.Control(func(fd uintptr) {
				if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
					s.PeerKnown, s.PeerPID, s.PeerUID = true, cred.Pid, cred.Uid
				}
			})
		}
	}
	if s.PeerPID > 0 {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", s.PeerPID)); err == nil {
			s.PeerComm = strings.TrimSpace(string(b))
		}
	}
	return s
}

// Listener names the listener for messages: "pid 42 gpufence".
func (s Socket) Listener() string {
	who := fmt.Sprintf("pid %d", s.PeerPID)
	if s.PeerComm != "" {
		who += " " + s.PeerComm
	}
	return who
}

// OwnerErr says why the socket file is not the agent's, which runs as
// uid: nil when it is.
func (s Socket) OwnerErr(uid uint32) error {
	if s.UID != uid {
		return fmt.Errorf("the socket %s is owned by uid %d, not %d: not the agent's", s.Path, s.UID, uid)
	}
	return nil
}

// ListenerErr says why what accepts on the socket is not the agent, which
// runs as uid: nil only when the kernel says the listener is uid. A
// listener whose credentials cannot be read is not trusted either.
func (s Socket) ListenerErr(uid uint32) error {
	switch {
	case !s.Listening:
		return fmt.Errorf("nothing accepts on %s", s.Path)
	case !s.PeerKnown:
		return fmt.Errorf("the kernel gave no credentials of the listener on %s: not known to be the agent", s.Path)
	case s.PeerUID != uid:
		return fmt.Errorf("the listener on %s (%s) runs as uid %d, not %d: not the agent", s.Path, s.Listener(), s.PeerUID, uid)
	}
	return nil
}
