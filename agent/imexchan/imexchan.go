// SPDX-License-Identifier: Apache-2.0

// Package imexchan finds the IMEX channel Slurm gave a step on this node.
//
// Slurm's switch/nvidia_imex (24.05 and later) allocates the channel in
// slurmctld, sends it to slurmstepd in the step's signed credential, and
// there (switch_p_job_init, or switch_p_fs_init under a namespace plugin)
// unshares a mount namespace, mounts a tmpfs on
// /dev/nvidia-caps-imex-channels and makes one node, channel<N>, of the
// IMEX major and minor N. The tasks inherit that namespace. Nothing a user
// controls reaches it: the tmpfs is root's (mode 0755), device nodes need
// CAP_MKNOD in the initial user namespace, and a user's own mount namespace
// (through a user namespace) is a copy that slurmstepd's namespace never
// sees. So what slurmstepd's /proc/<pid>/root shows there is Slurm's word.
// It exists only after slurmstepd's switch setup, which Slurm runs after
// the SPANK init callback: the plugin asks from task_post_fork.
package imexchan

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/mountinfo"
)

// Dir is where Slurm mounts a step's channel node.
const Dir = "/dev/nvidia-caps-imex-channels"

// Entry is one directory entry of the channel directory, as lstat saw it.
type Entry struct {
	Name string
	Mode os.FileMode
	Rdev uint64
}

// Reader reads a process's channel. The zero value reads Dir under /proc.
type Reader struct {
	Proc string // default /proc
	Dir  string // default Dir
}

// ErrNoMount says the process has no private channel directory: Slurm made
// no channel for the step (no switch/nvidia_imex, no channel for the job on
// this node, or a step Slurm sets none up for).
var ErrNoMount = errors.New("no IMEX channel mount")

// Read returns the channels (one, as Slurm makes them) of the process pid,
// from its own mount namespace: ErrNoMount when there is no tmpfs mounted
// at the directory, an error naming what is wrong when the directory holds
// anything but channel nodes of major.
func (r Reader) Read(pid int, major uint32) ([]uint32, error) {
	proc, dir := r.Proc, r.Dir
	if proc == "" {
		proc = "/proc"
	}
	if dir == "" {
		dir = Dir
	}
	f, err := os.Open(filepath.Join(proc, strconv.Itoa(pid), "mountinfo"))
	if err != nil {
		return nil, err
	}
	fstype, found, err := MountAt(f, dir)
	f.Close()
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNoMount
	}
	if fstype != "tmpfs" {
		return nil, fmt.Errorf("%s is a %s mount in pid %d's namespace, not the tmpfs Slurm mounts", dir, fstype, pid)
	}
	root := filepath.Join(proc, strconv.Itoa(pid), "root", dir)
	names, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var ents []Entry
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, n.Name()), &st); err != nil {
			return nil, err
		}
		ents = append(ents, Entry{Name: n.Name(), Mode: modeOf(st.Mode), Rdev: st.Rdev})
	}
	return Channels(ents, major)
}

func modeOf(m uint32) os.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFCHR:
		return os.ModeDevice | os.ModeCharDevice
	case unix.S_IFBLK:
		return os.ModeDevice
	case unix.S_IFDIR:
		return os.ModeDir
	case unix.S_IFLNK:
		return os.ModeSymlink
	case unix.S_IFREG:
		return 0
	}
	return os.ModeIrregular
}

// Channels checks the entries of the channel directory: each must be a
// char device named channel<N> of major and minor N, and there may be at
// most one (Slurm makes one per step). It returns the channels.
func Channels(ents []Entry, major uint32) ([]uint32, error) {
	var out []uint32
	for _, e := range ents {
		if e.Mode&os.ModeCharDevice == 0 {
			return nil, fmt.Errorf("%s/%s: not a char device (mode %v)", Dir, e.Name, e.Mode)
		}
		if got := unix.Major(e.Rdev); got != major {
			return nil, fmt.Errorf("%s/%s: major %d, not the IMEX channel major %d", Dir, e.Name, got, major)
		}
		minor := unix.Minor(e.Rdev)
		if e.Name != "channel"+strconv.FormatUint(uint64(minor), 10) {
			return nil, fmt.Errorf("%s/%s: device %d:%d, not the node Slurm names channel%d", Dir, e.Name, major, minor, minor)
		}
		out = append(out, minor)
	}
	if len(out) > 1 {
		return nil, fmt.Errorf("%s holds %d channel nodes, Slurm makes one", Dir, len(out))
	}
	return out, nil
}

// MountAt reads a mountinfo file and returns the file system type of the
// topmost mount at dir, and whether there is one.
func MountAt(r io.Reader, dir string) (fstype string, found bool, err error) {
	mounts, err := mountinfo.Parse(r)
	if err != nil {
		return "", false, fmt.Errorf("%w: not in the kernel's format", err)
	}
	for _, m := range mounts {
		if m.MountPoint == dir {
			fstype, found = m.FSType, true
		}
	}
	return fstype, found, nil
}
