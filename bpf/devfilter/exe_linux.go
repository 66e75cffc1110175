// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"errors"
	"fmt"
	"os"

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
