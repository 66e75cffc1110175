// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAppendFailOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool", "failopen.jsonl")
	for _, step := range []string{"0", "batch"} {
		if err := appendFailOpen(path, newFailOpen(7, step, 2001, "connect: connection refused")); err != nil {
			t.Fatalf("appendFailOpen: %v", err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("spool has %d lines, want 2: %q", len(lines), data)
	}
	var got map[string]any
	dec := json.NewDecoder(bytes.NewReader(lines[1]))
	dec.UseNumber()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("line %q: %v", lines[1], err)
	}
	host, _ := os.Hostname()
	want := map[string]any{"job_id": json.Number("7"), "step_id": "batch", "uid": json.Number("2001"),
		"node": host, "reason": "connect: connection refused"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %#v, want %#v", k, got[k], v)
		}
	}
	if ts, ok := got["time"].(string); !ok {
		t.Errorf("time = %#v", got["time"])
	} else if when, err := time.Parse(time.RFC3339, ts); err != nil || time.Since(when) > time.Minute {
		t.Errorf("time %q: %v", ts, err)
	}
	if len(got) != len(want)+1 {
		t.Errorf("fields %v, want exactly time and %v", got, want)
	}
	assertMode(t, filepath.Dir(path), 0o700)
	assertMode(t, path, 0o600)
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != want {
		t.Errorf("%s: mode %#o, want %#o", path, fi.Mode().Perm(), want)
	}
}

func TestAppendFailOpenRefuses(t *testing.T) {
	rec := newFailOpen(7, "0", 2001, "x")
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	linkDir := t.TempDir()
	target := filepath.Join(linkDir, "target")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(linkDir, "failopen.jsonl")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, want string
	}{
		{"relative", "spool/failopen.jsonl", "not an absolute path"},
		{"folder writable by others", filepath.Join(open, "failopen.jsonl"), "writable by others"},
		{"symlink", link, "too many levels of symbolic links"},
		{"folder is a file", filepath.Join(target, "failopen.jsonl"), "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := appendFailOpen(tt.path, rec)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("appendFailOpen(%s) = %v, want an error with %q", tt.path, err, tt.want)
			}
		})
	}
	if data, _ := os.ReadFile(target); len(data) != 0 {
		t.Errorf("wrote through a symlink: %q", data)
	}
}
