// SPDX-License-Identifier: Apache-2.0

package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCheckDirRefusesOtherFileSystems(t *testing.T) {
	dir := t.TempDir()
	if err := CheckDir(dir, 0); err == nil || !strings.Contains(err.Error(), "not in a cgroup2 file system") {
		t.Errorf("CheckDir(%s) = %v, want not in a cgroup2 file system", dir, err)
	}
	if err := CheckDir(filepath.Join(dir, "missing"), 0); err == nil || !strings.Contains(err.Error(), "statfs") {
		t.Errorf("CheckDir(missing) = %v, want a statfs error", err)
	}
}

// TestPrivilegedCgroupIdentity creates a cgroup of its own and holds
// CheckDir, OpenByID and Exists to its inode number, before and after it
// is removed.
func TestPrivilegedCgroupIdentity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (creates a cgroup, opens cgroups by handle)")
	}
	mnt, err := RootMount()
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	dir, err := os.MkdirTemp(mnt, "gpufence-cgroup-test-")
	if err != nil {
		t.Skipf("skipping: cannot create a cgroup under %s: %v", mnt, err)
	}
	removed := false
	t.Cleanup(func() {
		if !removed {
			os.Remove(dir)
		}
	})
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if err := CheckDir(dir, st.Ino); err != nil {
		t.Errorf("CheckDir(%s, %d) = %v", dir, st.Ino, err)
	}
	if err := CheckDir(dir, st.Ino+1); err == nil || !strings.Contains(err.Error(), "has cgroup id") {
		t.Errorf("CheckDir(%s, wrong id) = %v, want a wrong-id error", dir, err)
	}
	if err := CheckDir(filepath.Join(dir, "cgroup.procs"), 0); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("CheckDir(cgroup.procs) = %v, want not a directory", err)
	}
	fd, err := OpenByID(st.Ino)
	if err != nil {
		t.Fatalf("OpenByID(%d): %v", st.Ino, err)
	}
	var fst unix.Stat_t
	err = unix.Fstat(fd, &fst)
	unix.Close(fd)
	if err != nil || fst.Ino != st.Ino {
		t.Fatalf("OpenByID(%d) opened inode %d (%v)", st.Ino, fst.Ino, err)
	}
	if ok, err := Exists(st.Ino); !ok || err != nil {
		t.Errorf("Exists(%d) of a live cgroup = %v, %v", st.Ino, ok, err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	removed = true
	if ok, err := Exists(st.Ino); ok || err != nil {
		t.Errorf("Exists(%d) of a removed cgroup = %v, %v; want false, nil", st.Ino, ok, err)
	}
}
