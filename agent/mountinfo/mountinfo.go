// SPDX-License-Identifier: Apache-2.0

// Package mountinfo parses /proc/<pid>/mountinfo (proc(5)). It reads text
// only the kernel writes: the mount points of a job user's own mount
// namespace are escaped by the kernel and parsed field by field.
package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Mount is one line of mountinfo.
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

// Parse parses mountinfo, undoing the kernel's escapes.
func Parse(r io.Reader) ([]Mount, error) {
	var mounts []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+2 >= len(fields) {
			return nil, fmt.Errorf("parse mountinfo: malformed line %q", sc.Text())
		}
		m := Mount{Root: unescape(fields[3]), MountPoint: unescape(fields[4]),
			FSType: fields[sep+1], Source: unescape(fields[sep+2])}
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

// Read parses the mountinfo file at path (e.g. /proc/self/mountinfo).
func Read(path string) ([]Mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mounts, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return mounts, nil
}

// Cgroup2 returns the cgroup2 mounts of mounts.
func Cgroup2(mounts []Mount) []Mount {
	var out []Mount
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			out = append(out, m)
		}
	}
	return out
}

// unescape undoes the kernel's octal escapes (\040 for a space).
func unescape(s string) string {
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
