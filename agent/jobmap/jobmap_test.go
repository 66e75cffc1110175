// SPDX-License-Identifier: Apache-2.0

package jobmap

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// files returns the directory's regular files and their content.
func files(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestSync(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "job-mapping")
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Left by an earlier run or by hand: stale GPU files go, a file whose
	// name dcgm-exporter would not read as a GPU number stays, and so does
	// a directory.
	for name, content := range map[string]string{"3": "7\n", "01": "7\n", "1.4": "7\n", "README": "mine\n", "1.x": "mine\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "5"), 0o755); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		jobs map[Key][]uint32
		want map[string]string
	}{
		{"two jobs, one GPU shared", map[Key][]uint32{{GPU: 0}: {12}, {GPU: 2}: {13, 12, 13}},
			map[string]string{"0": "12\n", "2": "12\n13\n", "README": "mine\n", "1.x": "mine\n"}},
		{"two jobs on two MIG slices of GPU 1", map[Key][]uint32{{GPU: 1}: {14, 15}, {GPU: 1, MIG: true, GI: 3}: {14}, {GPU: 1, MIG: true, GI: 13}: {15}},
			map[string]string{"1": "14\n15\n", "1.3": "14\n", "1.13": "15\n", "README": "mine\n", "1.x": "mine\n"}},
		{"job 15 ends", map[Key][]uint32{{GPU: 1}: {14}, {GPU: 1, MIG: true, GI: 3}: {14}},
			map[string]string{"1": "14\n", "1.3": "14\n", "README": "mine\n", "1.x": "mine\n"}},
		{"no job", nil,
			map[string]string{"README": "mine\n", "1.x": "mine\n"}},
	}
	for _, s := range steps {
		if err := d.Sync(s.jobs); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := files(t, dir); !equal(got, s.want) {
			t.Errorf("%s: directory holds %q, want %q", s.name, got, s.want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "5")); err != nil || !fi.IsDir() {
		t.Errorf("a directory named 5 was touched: %v", err)
	}
}

// An unchanged file is not rewritten: dcgm-exporter reads the directory on
// every scrape, and a rename each time would be churn for nothing.
func TestSyncKeepsUnchangedFiles(t *testing.T) {
	dir := t.TempDir()
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	inode := func() uint64 {
		fi, err := os.Stat(filepath.Join(dir, "1"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	if err := d.Sync(map[Key][]uint32{{GPU: 1}: {40}}); err != nil {
		t.Fatal(err)
	}
	before := inode()
	if err := d.Sync(map[Key][]uint32{{GPU: 1}: {40}}); err != nil {
		t.Fatal(err)
	}
	if inode() != before {
		t.Error("an unchanged mapping file was replaced")
	}
	if err := d.Sync(map[Key][]uint32{{GPU: 1}: {41}}); err != nil {
		t.Fatal(err)
	}
	if inode() == before {
		t.Error("a changed mapping file was not replaced by rename")
	}
	names := slices.Sorted(maps.Keys(files(t, dir)))
	if !slices.Equal(names, []string{"1"}) {
		t.Errorf("files left: %v, want only 1 (no temporary file)", names)
	}
}

func TestNewRefusesRelative(t *testing.T) {
	if _, err := New("run/map"); err == nil {
		t.Error("relative directory accepted")
	}
}

func TestSyncNegativeGPU(t *testing.T) {
	d, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(map[Key][]uint32{{GPU: -1}: {3}}); err == nil {
		t.Error("GPU -1 accepted")
	}
}
