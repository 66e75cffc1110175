// SPDX-License-Identifier: Apache-2.0

package cgwatch

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/jobcgroup"
)

func TestPrivilegedCgroupRemoved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes and removes cgroups")
	}
	mount, err := jobcgroup.Mountpoint()
	if err != nil {
		t.Skipf("no cgroup v2: %v", err)
	}
	dir, err := os.MkdirTemp(mount, "gpufence-cgwatch-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(dir)
	id, err := jobcgroup.ID(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Add(dir, id); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(dir, id+1); err == nil {
		t.Error("Add with the wrong cgroup id: no error")
	}
	if w.Len() != 1 {
		t.Errorf("Len() = %d, want 1", w.Len())
	}
	if err := unix.Rmdir(dir); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-w.Gone():
		if got != id {
			t.Errorf("Gone() = %d, want %d", got, id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event for the removed cgroup")
	}
	if w.Len() != 0 {
		t.Errorf("Len() = %d after removal, want 0", w.Len())
	}
	// A removed watch sends nothing.
	dir2, _ := os.MkdirTemp(mount, "gpufence-cgwatch-test-")
	id2, _ := jobcgroup.ID(dir2)
	if err := w.Add(dir2, id2); err != nil {
		t.Fatal(err)
	}
	w.Remove(id2)
	unix.Rmdir(dir2)
	select {
	case got := <-w.Gone():
		t.Errorf("event %d for an unwatched cgroup", got)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestWatchMade: a directory made at the watched path is told, one made
// beside it is not (it would arrive first), and each making again is told
// again.
func TestWatchMade(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	parent := t.TempDir()
	want := filepath.Join(parent, "slurmd.service")
	if err := w.WatchMade(want); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		if err := os.Mkdir(filepath.Join(parent, fmt.Sprintf("other%d.service", round)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(want, 0o755); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-w.Made():
			if got != want {
				t.Fatalf("round %d: Made() = %s, want %s", round, got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: %s made, nothing told", round, want)
		}
		if err := os.Remove(want); err != nil {
			t.Fatal(err)
		}
	}
}
