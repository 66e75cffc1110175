// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is one line of /proc/self/mountinfo (proc(5)).
type Mount struct {
	// ID is the mount id; Major and Minor are the device of the mount's
	// superblock (st_dev of most of its files, not all: btrfs subvolumes).
	ID           uint64
	Major, Minor uint32
	// Root is the part of the file system the mount shows at its mount
	// point: for cgroup2 the cgroup there (not "/" for a bind mount of a
	// subtree or inside a cgroup namespace).
	Root       string
	MountPoint string
	FSType     string
	Source     string
	Options    string // super options, e.g. "rw,nsdelegate"
}

// ParseMountinfo parses mountinfo (proc(5)), undoing the kernel's escapes.
func ParseMountinfo(r io.Reader) ([]Mount, error) {
	var mounts []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+2 >= len(fields) {
			return nil, fmt.Errorf("parse mountinfo: malformed line %q", sc.Text())
		}
		m := Mount{Root: unescapeMountinfo(fields[3]), MountPoint: unescapeMountinfo(fields[4]),
			FSType: fields[sep+1], Source: unescapeMountinfo(fields[sep+2])}
		id, err1 := strconv.ParseUint(fields[0], 10, 64)
		maj, min, ok := strings.Cut(fields[2], ":")
		ma, err2 := strconv.ParseUint(maj, 10, 32)
		mi, err3 := strconv.ParseUint(min, 10, 32)
		if err1 != nil || !ok || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("parse mountinfo: malformed mount id or device in %q", sc.Text())
		}
		m.ID, m.Major, m.Minor = id, uint32(ma), uint32(mi)
		if sep+3 < len(fields) {
			m.Options = fields[sep+3]
		}
		mounts = append(mounts, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse mountinfo: %w", err)
	}
	return mounts, nil
}

// cgroup2Mounts returns the cgroup2 mounts of mountinfo.
func cgroup2Mounts(r io.Reader) ([]Mount, error) {
	all, err := ParseMountinfo(r)
	if err != nil {
		return nil, err
	}
	var mounts []Mount
	for _, m := range all {
		if m.FSType == "cgroup2" {
			mounts = append(mounts, m)
		}
	}
	return mounts, nil
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// cgroupLevel returns the level of dir in the cgroup2 hierarchy (the root
// cgroup is level 0), as bpf_get_current_ancestor_cgroup_id counts it. dir
// must be clean and absolute; the mount with the longest matching mount
// point is used.
func cgroupLevel(mounts []Mount, dir string) (int, error) {
	dir = filepath.Clean(dir)
	best := -1
	for i, m := range mounts {
		if !within(m.MountPoint, dir) {
			continue
		}
		if best < 0 || len(m.MountPoint) > len(mounts[best].MountPoint) {
			best = i
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("%s is not inside a cgroup2 mount", dir)
	}
	m := mounts[best]
	rel, err := filepath.Rel(m.MountPoint, dir)
	if err != nil {
		return 0, fmt.Errorf("%s relative to %s: %w", dir, m.MountPoint, err)
	}
	return depth(m.Root) + depth(rel), nil
}

func within(parent, p string) bool {
	parent = filepath.Clean(parent)
	return p == parent || parent == "/" || strings.HasPrefix(p, parent+"/")
}

// depth counts the components of a relative or absolute clean path.
func depth(p string) int {
	n := 0
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			n++
		}
	}
	return n
}

// scopeLevel finds the level of the scope cgroup dir on this host.
func scopeLevel(dir string) (int, error) {
	if err := checkCgroup2Dir(dir, 0); err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	mounts, err := cgroup2Mounts(f)
	if err != nil {
		return 0, err
	}
	return cgroupLevel(mounts, dir)
}

// checkCgroup2Dir checks that dir is a cgroup2 directory and, when id is not
// 0, that it is the cgroup with that id (its inode number).
func checkCgroup2Dir(dir string, id uint64) error {
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
