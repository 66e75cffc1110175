// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/status"
)

// probeSocket reads the agent socket the way `gpufence status` does, below
// the doctor's root.
func probeSocket(e *Env) status.Socket {
	s := status.ProbeSocket(e.path(e.Config.Socket))
	s.Path = e.Config.Socket
	return s
}

func (r *run) startFix() string {
	if r.env.systemd() {
		return "systemctl enable --now gpufence.socket gpufence.service"
	}
	return "Start the agent as root: gpufence agent (from the node's init system)."
}

func (r *run) checkSocket() Check {
	c := newCheck("agent-socket", "agent socket")
	s := r.sock
	c.add("socket: %s", s.Path)
	switch {
	case errors.Is(s.StatErr, unix.ENOENT):
		fix := r.startFix()
		if r.env.systemd() {
			fix = "systemctl start gpufence.socket (and enable it: systemctl enable --now gpufence.socket gpufence.service)"
		}
		c.fail(fix, "no socket at %s: the agent is not running, so every GPU step is refused", s.Path)
		return c
	case s.StatErr != nil:
		c.fail("Make "+filepath.Dir(s.Path)+" readable to root.", "cannot stat %s: %v", s.Path, s.StatErr)
		return c
	case !s.IsSocket:
		c.fail("Remove "+s.Path+" and start the agent: it creates the socket.", "%s is not a socket (mode %s)", s.Path, s.Mode)
		return c
	}
	c.add("mode %04o, owner uid %d", uint32(s.Mode.Perm()), s.UID)
	if err := s.OwnerErr(r.env.AdminUID); err != nil {
		c.fail("Stop whatever created "+s.Path+", remove it and restart the agent (it runs as root).",
			"%v (a process that impersonates the agent would get every step's GPU list)", err)
	}
	if s.Mode.Perm()&0o077 != 0 {
		c.warn("chmod 0600 "+s.Path+" (the agent and gpufence.socket create it 0600).",
			"the socket is mode %04o: others may connect (the agent still refuses any peer but root)", uint32(s.Mode.Perm()))
	}
	if !s.Listening {
		c.fail(r.startFix(), "the socket refuses connections (%v): stale, the agent is not running", s.DialErr)
		return c
	}
	if err := s.ListenerErr(r.env.AdminUID); err != nil {
		c.fail("Stop the process listening on "+s.Path+" and restart the agent as root.", "%v", err)
		return c
	}
	who := s.Listener()
	if s.PeerPID == 1 {
		c.ok("accepts connections, held by systemd (pid 1) for socket activation of the agent")
	} else {
		c.ok("the agent accepts connections (%s, uid %d)", who, s.PeerUID)
	}
	return c
}

// minFreeAudit is the free space below which the audit check warns.
const minFreeAudit = 256 << 20

func (r *run) checkAudit() Check {
	c := newCheck("audit", "audit trail")
	a := r.env.Config.Audit
	journal := r.env.exists(audit.DefaultJournalSocket)
	switch a.Journald {
	case "on":
		if !journal {
			c.fail("Set audit.journald: auto (or off), or run systemd-journald.", "audit.journald is on but %s does not exist: the agent refuses to start", audit.DefaultJournalSocket)
		} else {
			c.add("journald: on (%s)", audit.DefaultJournalSocket)
		}
	case "auto":
		if journal {
			c.add("journald: auto, active (%s exists)", audit.DefaultJournalSocket)
		} else {
			c.add("journald: auto, inactive (no %s)", audit.DefaultJournalSocket)
		}
	default:
		c.add("journald: off")
	}
	journalOn := a.Journald == "on" || (a.Journald == "auto" && journal)
	if a.Syslog != "" {
		c.add("syslog: %s", a.Syslog)
		for _, pre := range []string{"unix://", "unixgram://"} {
			if p, ok := strings.CutPrefix(a.Syslog, pre); ok && !r.env.exists(p) {
				c.fail("Start the syslog daemon or fix audit.syslog.", "audit.syslog socket %s does not exist: the agent refuses to start", p)
			}
		}
	}
	if a.File == "" {
		if !journalOn && a.Syslog == "" {
			c.warn("Set audit.file (default /var/log/gpufence/audit.jsonl), audit.journald or audit.syslog.", "no audit sink: denied GPU accesses are recorded nowhere")
		} else {
			c.info("audit.file is empty: no JSON Lines file")
		}
		return c
	}
	dir := filepath.Dir(a.File)
	c.add("file: %s", a.File)
	var st unix.Stat_t
	err := unix.Stat(r.env.path(dir), &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		if r.sock.Listening {
			c.warn("Restart the agent: it creates "+dir+" (mode 0750).", "%s does not exist although the agent runs", dir)
		} else {
			c.info("%s does not exist yet: the agent creates it (mode 0750) when it starts", dir)
		}
		return c
	case err != nil:
		c.fail("Make "+dir+" reachable to root.", "cannot stat %s: %v", dir, err)
		return c
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		c.fail("Set audit.file to a path in a directory.", "%s is not a directory", dir)
		return c
	}
	c.add("%s: mode %04o, owner uid %d", dir, st.Mode&0o7777, st.Uid)
	if st.Mode&0o002 != 0 {
		c.fail("chmod 0750 "+dir, "%s is writable by everyone: anyone can replace the audit file", dir)
	} else if st.Mode&0o007 != 0 {
		c.warn("chmod 0750 "+dir, "%s is open to others (mode %04o)", dir, st.Mode&0o7777)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(r.env.path(dir), &fs); err == nil {
		free := fs.Bavail * uint64(fs.Bsize)
		c.add("free space: %s", bytesHuman(free))
		if fs.Flags&unix.ST_RDONLY != 0 {
			c.fail("Put audit.file on a writable file system.", "%s is on a read-only file system", dir)
		} else if free < minFreeAudit {
			c.warn("Free space on the audit file system, or rotate the audit file (logrotate).", "only %s free for the audit file", bytesHuman(free))
		}
	}
	if a.OCSFFile != "" {
		c.add("OCSF file: %s", a.OCSFFile)
		r.auditFileState(&c, a.OCSFFile, filepath.Dir(a.OCSFFile))
	}
	if r.auditFileState(&c, a.File, dir) && c.Verdict == "" {
		c.ok("%s is in place, writable and not world-readable", a.File)
	}
	return c
}

// auditFileState checks one audit file (the JSON Lines file or the OCSF
// file): a regular file root owns that no other user can read or write,
// or none yet (the agent creates it in dir). False when there is no file
// to check further.
func (r *run) auditFileState(c *Check, path, dir string) bool {
	var fst unix.Stat_t
	err := unix.Lstat(r.env.path(path), &fst)
	switch {
	case errors.Is(err, unix.ENOENT):
		c.ok("%s is writable; the agent creates %s (mode 0640) when it starts", dir, filepath.Base(path))
		return false
	case err != nil:
		c.fail("Make "+path+" readable to root.", "cannot stat %s: %v", path, err)
		return false
	case fst.Mode&unix.S_IFMT != unix.S_IFREG:
		c.fail("Remove "+path+": the audit file must be a regular file.", "%s is not a regular file", path)
		return false
	}
	c.add("%s: mode %04o, owner uid %d, %s", path, fst.Mode&0o7777, fst.Uid, bytesHuman(uint64(fst.Size)))
	if fst.Mode&0o004 != 0 || fst.Mode&0o002 != 0 {
		c.fail("chmod 0640 "+path+" (the agent creates it 0640; check logrotate's create mode too)",
			"%s is readable or writable by everyone (mode %04o): it shows users, commands and GPUs", path, fst.Mode&0o7777)
	}
	if fst.Uid != r.env.AdminUID {
		c.warn("chown root "+path, "%s is owned by uid %d, not %d", path, fst.Uid, r.env.AdminUID)
	}
	return true
}

func bytesHuman(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
