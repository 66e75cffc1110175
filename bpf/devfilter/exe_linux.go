// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/gpufence/gpufence/agent/mountinfo"
	"golang.org/x/sys/unix"
)

// ErrExeUnknown is returned by SameExe when the file's identity cannot be
// compared with the program's.
var ErrExeUnknown = errors.New("executable identity cannot be compared")

// SameExe reports whether the file at path (following links: /proc/<pid>/exe)
// is the executable want that the program identified at an access. The
// program reads the inode number and the device of the inode's superblock;
// stat shows another device for some file systems (btrfs subvolumes,
// overlayfs over several file systems), and then the superblock's device is
// looked up by the file's mount id in mountinfo (/proc/<pid>/mountinfo for
// a process's exe: its mount namespace). It returns an error wrapping
// ErrExeUnknown when want is unknown or the mount cannot be found.
func SameExe(path, mountinfo string, want ExeID) (bool, error) {
	if !want.Known() {
		return false, fmt.Errorf("%s: %w: the program gave no identity", path, ErrExeUnknown)
	}
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_INO|unix.STATX_MNT_ID, &stx); err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	return sameID(path, &stx, mountinfo, want)
}

// SameName reports whether path, resolved below root, names the
// executable want. The name /proc/<pid>/exe shows is the file's path in
// the process's mount namespace; in another (a user's own, a container's)
// the same path may be another file. root is a folder of the namespace
// that is to resolve it (/proc/1/root: the node's, whatever namespace the
// caller is in; / for the caller's own) and mountinfo that namespace's
// (/proc/1/mountinfo). No symbolic link is followed, below root or in the
// last component: /proc shows a program's path with none, so a path that
// needs one is not the program's name there. A path that names nothing is
// not the file (false, no error).
func SameName(root, path, mountinfo string, want ExeID) (bool, error) {
	if !want.Known() {
		return false, fmt.Errorf("%s: %w: the program gave no identity", path, ErrExeUnknown)
	}
	if !filepath.IsAbs(path) {
		// Not a path of any namespace: resolved it would name a file of
		// the caller's working folder.
		return false, nil
	}
	var stx unix.Statx_t
	err := statBelow(root, path, &stx)
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP):
		// Nothing there, or only through a link.
		return false, nil
	case err != nil:
		return false, err
	}
	return sameID(path, &stx, mountinfo, want)
}

// statBelow stats path resolved below root, following no link.
func statBelow(root, path string, stx *unix.Statx_t) error {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS})
	if errors.Is(err, unix.ENOSYS) {
		// Before Linux 5.6 (no openat2): a link in the last component
		// is still not followed, one on the way is (an absolute one
		// then from the caller's root).
		if err := unix.Statx(unix.AT_FDCWD, filepath.Join(root, path), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_MNT_ID, stx); err != nil {
			return fmt.Errorf("stat %s below %s: %w", path, root, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s below %s: %w", path, root, err)
	}
	defer unix.Close(fd)
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_INO|unix.STATX_MNT_ID, stx); err != nil {
		return fmt.Errorf("stat %s below %s: %w", path, root, err)
	}
	return nil
}

// sameID compares the file stat showed (path's) with want, through the
// superblock device of its mount in mountinfo where stat shows another.
func sameID(path string, stx *unix.Statx_t, mountinfoPath string, want ExeID) (bool, error) {
	if stx.Ino != want.Ino {
		return false, nil
	}
	if stx.Dev_major == want.Major && stx.Dev_minor == want.Minor {
		return true, nil
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		return false, fmt.Errorf("%s: %w: device %d:%d is not the superblock's %d:%d and the kernel gives no mount id",
			path, ErrExeUnknown, stx.Dev_major, stx.Dev_minor, want.Major, want.Minor)
	}
	mounts, err := mountinfo.Read(mountinfoPath)
	if err != nil {
		return false, fmt.Errorf("%s: %w: %w", path, ErrExeUnknown, err)
	}
	for _, m := range mounts {
		if m.ID == stx.Mnt_id {
			return m.Major == want.Major && m.Minor == want.Minor, nil
		}
	}
	return false, fmt.Errorf("%s: %w: mount %d not in %s", path, ErrExeUnknown, stx.Mnt_id, mountinfoPath)
}
