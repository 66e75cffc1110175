// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
	return sameFile(path, 0, mountinfo, want)
}

// SameName reports whether path, as the caller's mount namespace resolves
// it, names the executable want: the name /proc/<pid>/exe shows is the
// file's path in the process's mount namespace, and in another namespace
// (a user's, a container's) the same path may be another file. mountinfo
// is the caller's (/proc/self/mountinfo). A symbolic link in the last
// component is not followed: /proc never shows a link as a program's path,
// so a link there is another name's, not the file's. A path that names
// nothing is not the file (false, no error).
func SameName(path, mountinfo string, want ExeID) (bool, error) {
	if !filepath.IsAbs(path) {
		// Not a path of any namespace: resolved here it would name a
		// file of the caller's working folder.
		return false, nil
	}
	same, err := sameFile(path, unix.AT_SYMLINK_NOFOLLOW, mountinfo, want)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return false, nil
	}
	return same, err
}

func sameFile(path string, flags int, mountinfo string, want ExeID) (bool, error) {
	if !want.Known() {
		return false, fmt.Errorf("%s: %w: the program gave no identity", path, ErrExeUnknown)
	}
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, flags, unix.STATX_INO|unix.STATX_MNT_ID, &stx); err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
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
	f, err := os.Open(mountinfo)
	if err != nil {
		return false, fmt.Errorf("%s: %w: %w", path, ErrExeUnknown, err)
	}
	defer f.Close()
	mounts, err := ParseMountinfo(f)
	if err != nil {
		return false, fmt.Errorf("%s: %w: %w", path, ErrExeUnknown, err)
	}
	for _, m := range mounts {
		if m.ID == stx.Mnt_id {
			return m.Major == want.Major && m.Minor == want.Minor, nil
		}
	}
	return false, fmt.Errorf("%s: %w: mount %d not in %s", path, ErrExeUnknown, stx.Mnt_id, mountinfo)
}
