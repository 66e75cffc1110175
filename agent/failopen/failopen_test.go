// SPDX-License-Identifier: Apache-2.0

package failopen

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/users"
)

func TestIngestFailOpen(t *testing.T) {
	dir := t.TempDir()
	spool := filepath.Join(dir, "failopen.jsonl")
	lines := `{"time":"2026-11-29T09:00:00Z","job_id":7,"step_id":"0","uid":0,"node":"n1","reason":"connect: no such file or directory"}
{"time":"2026-11-29T09:00:01Z","job_id":8,"step_id":"batch","uid":0,"node":"n1","reason":"no answer within 10s"}
`
	os.WriteFile(spool, []byte(lines), 0o600)
	rec := &audittest.Recorder{}
	d := &Spool{Path: spool, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Recorder: rec, Users: &users.Cache{}}
	d.Ingest()
	got := rec.Records(audit.EventStepUnfiltered)
	if len(got) != 2 || got[0].JobID != 7 || got[1].StepID != "batch" || got[0].Reason == "" || !strings.Contains(got[0].Message, "WITHOUT GPU isolation") {
		t.Fatalf("records %+v", got)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("spool not consumed: %v", left)
	}
	d.Ingest() // nothing twice
	if n := len(rec.Records(audit.EventStepUnfiltered)); n != 2 {
		t.Errorf("%d records after a second pass", n)
	}
	// A bad line keeps the file for a person to look at.
	os.WriteFile(spool, []byte("not json\n"), 0o600)
	d.Ingest()
	if left, _ := filepath.Glob(filepath.Join(dir, "*.bad")); len(left) != 1 {
		t.Errorf("bad spool not kept: %v", left)
	} else {
		os.Remove(left[0])
	}

	// A spool that is not the plugin's is not read: a link, a file others
	// may write, a file of another user.
	other := filepath.Join(dir, "elsewhere.jsonl")
	os.WriteFile(other, []byte(lines), 0o600)
	untrusted := map[string]func(){
		"symlink":        func() { os.Symlink(other, spool) },
		"group-writable": func() { os.WriteFile(spool, []byte(lines), 0o600); os.Chmod(spool, 0o620) },
	}
	if os.Geteuid() == 0 {
		untrusted["owned by nobody"] = func() { os.WriteFile(spool, []byte(lines), 0o600); os.Chown(spool, 65534, 65534) }
	}
	for name, make := range untrusted {
		os.Remove(spool)
		make()
		before := len(rec.Records(audit.EventStepUnfiltered))
		d.Ingest()
		if n := len(rec.Records(audit.EventStepUnfiltered)); n != before {
			t.Errorf("%s spool: %d records written from it", name, n-before)
		}
		if _, err := os.Lstat(spool); err != nil {
			t.Errorf("%s spool was taken: %v", name, err)
		}
	}
}

// TestIngestWaitsForWriters: a writer that holds its shared lock on the
// spool (the plugin between its lock and its write) keeps Ingest from
// reading the taken file; the next Ingest reads it, line included, before
// it takes the spool again.
func TestIngestWaitsForWriters(t *testing.T) {
	dir := t.TempDir()
	spool := filepath.Join(dir, "failopen.jsonl")
	first := `{"time":"t","job_id":7,"step_id":"0","uid":0,"node":"n1","reason":"r"}` + "\n"
	if err := os.WriteFile(spool, []byte(first), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(spool, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := syscall.Flock(int(w.Fd()), syscall.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	rec := &audittest.Recorder{}
	d := &Spool{Path: spool, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Recorder: rec, Users: &users.Cache{}}
	defer func(old time.Duration) { lockWait = old }(lockWait)
	lockWait = 100 * time.Millisecond
	d.Ingest()
	if n := len(rec.Records(audit.EventStepUnfiltered)); n != 0 {
		t.Fatalf("%d records read while a writer held its lock", n)
	}
	// A new spool appears meanwhile; the writer finishes its line into
	// the taken one and lets go.
	if err := os.WriteFile(spool, []byte(strings.Replace(first, `"job_id":7`, `"job_id":9`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString(strings.Replace(first, `"job_id":7`, `"job_id":8`, 1)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	d.Ingest()
	var jobs []uint32
	for _, r := range rec.Records(audit.EventStepUnfiltered) {
		jobs = append(jobs, r.JobID)
	}
	if fmt.Sprint(jobs) != "[7 8]" {
		t.Fatalf("first pass after the writer let go recorded jobs %v, want [7 8] (the taken file only)", jobs)
	}
	d.Ingest()
	jobs = jobs[:0]
	for _, r := range rec.Records(audit.EventStepUnfiltered) {
		jobs = append(jobs, r.JobID)
	}
	if fmt.Sprint(jobs) != "[7 8 9]" {
		t.Fatalf("jobs %v, want [7 8 9]", jobs)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}
