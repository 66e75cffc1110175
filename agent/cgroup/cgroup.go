// SPDX-License-Identifier: Apache-2.0

// Package cgroup names cgroup2 cgroups the way every stage of the agent
// refers to them (an id, the inode number of the directory, and its path)
// and checks that an id still names a live cgroup. Finding where a job
// lives is jobcgroup's; attaching programs is devfilter's.
package cgroup

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gpufence/gpufence/agent/mountinfo"
	"golang.org/x/sys/unix"
)

// Cgroup names a cgroup2 directory.
type Cgroup struct {
	// ID is the cgroup id, the inode number of its directory.
	ID uint64
	// Path is the absolute path of the directory; needed where a program
	// is attached to the cgroup itself (devfilter's per-cgroup mode).
	Path string
}

// CheckDir checks that dir is a cgroup2 directory and, when id is not 0,
// that it is the cgroup with that id (its inode number).
func CheckDir(dir string, id uint64) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("%s is not in a cgroup2 file system", dir)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("stat %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if id != 0 && st.Ino != id {
		return fmt.Errorf("%s has cgroup id %d, not %d", dir, st.Ino, id)
	}
	return nil
}

// fileIDKernfs is the file handle type of kernfs (cgroup2): the handle is
// the 64-bit cgroup id.
const fileIDKernfs = 0xfe

// ErrNoRootMount is returned where no mount shows the root cgroup.
var ErrNoRootMount = errors.New("no cgroup2 mount of the root cgroup")

// RootMount returns the mount point of a cgroup2 mount of the root cgroup
// in this process's mount namespace.
func RootMount() (string, error) {
	mounts, err := mountinfo.Read("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	for _, m := range mountinfo.Cgroup2(mounts) {
		if m.Root == "/" {
			return m.MountPoint, nil
		}
	}
	return "", ErrNoRootMount
}

// OpenByID opens the cgroup2 directory whose id is id (O_RDONLY,
// O_DIRECTORY, O_CLOEXEC), by file handle: needs CAP_DAC_READ_SEARCH. A
// cgroup that is gone fails with ESTALE or ENOENT.
func OpenByID(id uint64) (int, error) {
	mnt, err := RootMount()
	if err != nil {
		return -1, err
	}
	mfd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(mfd)
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], id)
	fd, err := unix.OpenByHandleAt(mfd, unix.NewFileHandle(fileIDKernfs, b[:]), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open cgroup %d: %w", id, err)
	}
	return fd, nil
}

// Exists reports whether the cgroup with this id exists (needs
// CAP_DAC_READ_SEARCH).
func Exists(id uint64) (bool, error) {
	fd, err := OpenByID(id)
	if errors.Is(err, unix.ESTALE) || errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	unix.Close(fd)
	return true, nil
}
