// SPDX-License-Identifier: Apache-2.0

package events

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// exeCheck is what the agent can say of the program of an access.
type exeCheck struct {
	// exe is set when verified; now when /proc shows a path that is not
	// (or could not be shown to be) the program of the access; nsPath when
	// the process runs the file of the access under a name that, in the
	// node's mount namespace, is another file's or nobody's.
	exe, now, nsPath, status string
	// mntNS is the inode of the process's mount namespace when it is not
	// the node's; 0 when it is, or when it could not be read.
	mntNS uint64
}

// exeSeen is what the agent read of a process, for judgeExe to weigh.
type exeSeen struct {
	// gone: the process exited, or its pid is another process's, at any
	// of the reads.
	gone bool
	// path is /proc/<pid>/exe's link text: the file's path in the
	// process's mount namespace. pathErr: it could not be read though the
	// process lives (a kernel thread). moved: a second read gave another
	// path (an exec while the agent looked).
	path    string
	pathErr error
	moved   bool
	// same, sameErr: /proc/<pid>/exe is the file the kernel saw at the
	// access (devfilter.SameExe).
	same    bool
	sameErr error
	// named, namedErr: path, resolved in the node's mount namespace, is
	// that file too (devfilter.SameName).
	named    bool
	namedErr error
	// mntNS: the process's mount namespace, when not the node's.
	mntNS uint64
}

// nodeNS is the mount namespace where a path must name the program for
// the record to call it verified: the node's, PID 1's, as an admin's
// shell and the node's jobs see it. It is not the agent's own: systemd
// gives the agent's unit a namespace of its own (PrivateTmp: its /tmp and
// /var/tmp are not the node's). Where the agent may not look into PID 1's
// (a test sandbox), its own stands in.
type nodeNS struct {
	// root resolves a path in the namespace (/proc/1/root); mountinfo
	// is its mount table.
	root, mountinfo string
	dev, ino        uint64
}

// nodeNamespace is pid's mount namespace (under proc), or the agent's own
// where pid's cannot be read.
func nodeNamespace(proc, pid string) nodeNS {
	for _, p := range []string{pid, "self"} {
		dir := filepath.Join(proc, p)
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, "ns", "mnt"), &st) != nil {
			continue
		}
		root, err := unix.Open(filepath.Join(dir, "root"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		unix.Close(root)
		return nodeNS{root: filepath.Join(dir, "root"), mountinfo: filepath.Join(dir, "mountinfo"), dev: st.Dev, ino: st.Ino}
	}
	// Not even the agent's own namespace could be read: its root still
	// resolves paths; which namespace a process is in is not known.
	return nodeNS{root: filepath.Join(proc, "self", "root"), mountinfo: filepath.Join(proc, "self", "mountinfo")}
}

// userHZ is the unit of the start time in /proc/<pid>/stat (USER_HZ, 100
// on every Linux architecture gpufence runs on).
const userHZ = 100

// judgeExe decides what a record may say of the program of an access. A
// path is only a name for a file in one mount namespace: in a user's own
// (unshare -Urm, then mount --bind) or a container's, /usr/bin/true may be
// any file, so the link text is called the program only where the node's
// namespace resolves it to the file the kernel saw.
func judgeExe(s exeSeen) exeCheck {
	switch {
	case s.gone:
		return exeCheck{status: audit.ExeExited}
	case s.pathErr != nil:
		return exeCheck{status: audit.ExeUnverified, mntNS: s.mntNS}
	case s.sameErr != nil || s.moved:
		return exeCheck{now: s.path, status: audit.ExeUnverified, mntNS: s.mntNS}
	case !s.same:
		return exeCheck{now: s.path, status: audit.ExeChanged, mntNS: s.mntNS}
	case s.namedErr == nil && s.named:
		return exeCheck{exe: s.path, status: audit.ExeVerified, mntNS: s.mntNS}
	case s.namedErr == nil && s.mntNS != 0:
		return exeCheck{nsPath: s.path, status: audit.ExeOtherNamespace, mntNS: s.mntNS}
	}
	// The node's namespace: the file was renamed over, or deleted, since
	// the exec (the link text then ends in " (deleted)"); or its name could
	// not be compared. Either way the name is not the program's.
	return exeCheck{now: s.path, status: audit.ExeUnverified, mntNS: s.mntNS}
}

// seeExe makes the reads judgeExe weighs. An exec while it reads (the
// link moved) is read once more: the exec is then over, and the file the
// process runs now is compared with the kernel's as any other is.
func seeExe(proc string, node nodeNS, ev devfilter.Event) exeSeen {
	s := seeExeOnce(proc, node, ev)
	if s.moved {
		s = seeExeOnce(proc, node, ev)
	}
	return s
}

func seeExeOnce(proc string, node nodeNS, ev devfilter.Event) exeSeen {
	dir := filepath.Join(proc, strconv.FormatUint(uint64(ev.TGID), 10))
	start, ok := procStart(dir)
	if !ok || (ev.Start != 0 && start != uint64(ev.Start/(time.Second/userHZ))) {
		// Gone, or the pid is another process's now.
		return exeSeen{gone: true}
	}
	var s exeSeen
	s.mntNS = otherMntNS(node, dir)
	s.path, s.pathErr = os.Readlink(filepath.Join(dir, "exe"))
	if s.pathErr != nil {
		if _, serr := os.Stat(dir); serr != nil {
			return exeSeen{gone: true}
		}
		return s
	}
	s.same, s.sameErr = devfilter.SameExe(filepath.Join(dir, "exe"), filepath.Join(dir, "mountinfo"), ev.Exe)
	if s.sameErr == nil && s.same {
		s.named, s.namedErr = devfilter.SameName(node.root, s.path, node.mountinfo, ev.Exe)
	}
	again, err := os.Readlink(filepath.Join(dir, "exe"))
	if now, ok := procStart(dir); !ok || now != start || err != nil {
		return exeSeen{gone: true}
	}
	s.moved = again != s.path
	if s.moved {
		s.path = again
	}
	return s
}

// otherMntNS is the inode of the mount namespace of the process at dir
// when it is not the node's, else (or when it cannot be read) 0.
func otherMntNS(node nodeNS, dir string) uint64 {
	var task unix.Stat_t
	if node.ino == 0 || unix.Stat(filepath.Join(dir, "ns", "mnt"), &task) != nil {
		return 0
	}
	if node.dev == task.Dev && node.ino == task.Ino {
		return 0
	}
	return task.Ino
}

// procStart is field 22 of <dir>/stat, the process's start in clock ticks
// since boot.
func procStart(dir string) (uint64, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return 0, false
	}
	// comm may hold spaces and parentheses: the fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return 0, false
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 20 {
		return 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	return v, err == nil
}
