// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSameName: a path names the executable only as itself, resolved below
// the root given: not through a symbolic link anywhere, not once nothing
// is there, not as a relative name; another file at the path is not it.
func TestSameName(t *testing.T) {
	dir := t.TempDir()
	file, other := filepath.Join(dir, "tool"), filepath.Join(dir, "other")
	for _, p := range []string{file, other} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link, dirLink := filepath.Join(dir, "link"), filepath.Join(dir, "dirlink")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dir, dirLink); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	id := ExeID{Ino: st.Ino, Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev)}
	if same, err := SameExe(file, "/proc/self/mountinfo", id); err != nil || !same {
		t.Skipf("skipping: stat's device of %s is not its superblock's here (%v, %v)", file, same, err)
	}
	// From the folder, "tool" would resolve to the file.
	t.Chdir(dir)
	for _, tc := range []struct {
		name, root, path string
		want             bool
	}{
		{"the file", "/", file, true},
		{"the file, below /proc/self/root", "/proc/self/root", file, true},
		{"the file, below its folder as root", dir, "/tool", true},
		{"another file", "/", other, false},
		{"a link to the file", "/", link, false},
		{"through a link to its folder", "/", filepath.Join(dirLink, "tool"), false},
		{"nothing there", "/", filepath.Join(dir, "gone"), false},
		{"the link text of a deleted file", "/", file + " (deleted)", false},
		{"below a file", "/", filepath.Join(file, "x"), false},
		{"a relative name", "/", "tool", false},
		{"outside root", dir, file, false},
	} {
		if same, err := SameName(tc.root, tc.path, "/proc/self/mountinfo", id); err != nil || same != tc.want {
			t.Errorf("%s: SameName(%s, %s) = %v, %v; want %v", tc.name, tc.root, tc.path, same, err, tc.want)
		}
	}
	if _, err := SameName("/", file, "/proc/self/mountinfo", ExeID{}); !errors.Is(err, ErrExeUnknown) {
		t.Errorf("SameName with no identity: %v, want ErrExeUnknown", err)
	}
}
