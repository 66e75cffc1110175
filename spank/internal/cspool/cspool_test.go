// SPDX-License-Identifier: Apache-2.0

package cspool

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/failopen"
	"github.com/gpufence/gpufence/agent/users"
)

// decoded is what a JSON reader must get back for s: C sees s up to its
// first NUL, and each byte of invalid UTF-8 becomes U+FFFD.
func decoded(s string) string {
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	return string([]rune(s))
}

// parse decodes line as the agent's reader and encoding/json see it: one
// object, one newline at its end, no other.
func parse(t testing.TB, line string) map[string]any {
	t.Helper()
	if len(line) > LineMax {
		t.Fatalf("line of %d bytes, over %d", len(line), LineMax)
	}
	if !strings.HasSuffix(line, "\n") || strings.Count(line, "\n") != 1 || strings.ContainsAny(line[:len(line)-1], "\r") {
		t.Fatalf("line %q is not one line", line)
	}
	if !utf8.ValidString(line) {
		t.Fatalf("line %q is not UTF-8", line)
	}
	var got map[string]any
	dec := json.NewDecoder(strings.NewReader(line))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("line %q: %v", line, err)
	}
	if dec.More() {
		t.Fatalf("line %q: more than one value", line)
	}
	return got
}

var hostile = []string{
	`"}, "job_id": 1, "x": "`,
	`\`, `\\"`, `\u0000`, "a\nb\r\nc", "\x01\x02\x1f\x7f\t\b\f",
	"\xff\xfe", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "ok\xe2\x82", "\xf0\x9f\x98",
	"\u2028\u2029", "ünïcødé 😀 \ufffd", "</script>", strings.Repeat(`"\`, 12),
}

func TestLineHostileFields(t *testing.T) {
	for _, s := range hostile {
		rec := Rec{Time: s, JobID: 4294967295, Step: s, UID: 4294967294, Node: s, Reason: s}
		line := Line(rec)
		got := parse(t, line)
		want := map[string]any{"time": decoded(s), "job_id": json.Number("4294967295"), "step_id": decoded(s),
			"uid": json.Number("4294967294"), "node": decoded(s), "reason": decoded(s)}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%q:\n\tline %q\n\tgot  %q\n\twant %q", s, line, got, want)
		}
		if strings.ContainsAny(line, "\u2028\u2029") {
			t.Errorf("%q: line %q holds a raw U+2028/U+2029", s, line)
		}
	}
}

// TestLineHuge: fields far over the line's room are cut at a character,
// and the line stays one JSON object within LineMax.
func TestLineHuge(t *testing.T) {
	for _, unit := range []string{"x", `"`, "\x01", "é", "😀", "\xff", "\u2028"} {
		big := strings.Repeat(unit, 1<<20)
		line := Line(Rec{Time: big, JobID: 7, Step: big, UID: 1, Node: big, Reason: big})
		got := parse(t, line)
		for _, k := range []string{"time", "step_id", "node", "reason"} {
			v, _ := got[k].(string)
			if v == "" || !strings.HasPrefix(decoded(big), v) {
				t.Errorf("unit %q: %s = %.40q..., not a prefix of the field", unit, k, v)
			}
		}
		if r := got["reason"].(string); len(line) < LineMax-16 || r == "" {
			t.Errorf("unit %q: line of %d bytes, reason of %d: the room is not used", unit, len(line), len(r))
		}
		if got["job_id"] != json.Number("7") {
			t.Errorf("unit %q: job_id %v", unit, got["job_id"])
		}
	}
}

// FuzzLine holds the line to its contract for any field: one JSON object of
// at most LineMax bytes whose strings are the fields, whole or cut at a
// character (whole when short: 10 bytes, each escaped to at most 6, fit).
func FuzzLine(f *testing.F) {
	for _, s := range hostile {
		f.Add(s, s, uint32(7))
	}
	f.Fuzz(func(t *testing.T, step, reason string, job uint32) {
		got := parse(t, Line(Rec{Time: "2026-01-01T00:00:00Z", JobID: job, Step: step, UID: 1, Node: reason, Reason: reason}))
		for k, s := range map[string]string{"step_id": step, "node": reason, "reason": reason} {
			if v, _ := got[k].(string); !strings.HasPrefix(decoded(s), v) || (len(s) <= 10 && v != decoded(s)) {
				t.Fatalf("%s = %q for %q", k, v, s)
			}
		}
		if got["job_id"] != json.Number(fmt.Sprint(job)) {
			t.Fatalf("job_id %v, want %d", got["job_id"], job)
		}
	})
}

func ingest(t *testing.T, spool string) (*failopen.Spool, *audittest.Recorder) {
	rec := &audittest.Recorder{}
	return &failopen.Spool{Path: spool, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Recorder: rec, Users: &users.Cache{}}, rec
}

// TestAppendReadByAgent: the C writer's lines, hostile fields included,
// are what the agent's reader records, every field intact.
func TestAppendReadByAgent(t *testing.T) {
	spool := filepath.Join(t.TempDir(), "spool", "failopen.jsonl")
	for i, s := range append([]string{"connect: connection refused"}, hostile...) {
		if err := Append(spool, uint32(100+i), s, 2001, s); err != nil {
			t.Fatalf("Append(%q): %v", s, err)
		}
	}
	data, err := os.ReadFile(spool)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	lines = lines[:len(lines)-1]
	if len(lines) != len(hostile)+1 {
		t.Fatalf("spool has %d lines, want %d: %q", len(lines), len(hostile)+1, data)
	}
	host, _ := os.Hostname()
	got := parse(t, lines[0])
	want := map[string]any{"job_id": json.Number("100"), "step_id": "connect: connection refused", "uid": json.Number("2001"),
		"node": host, "reason": "connect: connection refused"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %#v, want %#v", k, got[k], v)
		}
	}
	if ts, ok := got["time"].(string); !ok {
		t.Errorf("time = %#v", got["time"])
	} else if when, err := time.Parse(time.RFC3339, ts); err != nil || time.Since(when) > time.Minute || time.Since(when) < -time.Second {
		t.Errorf("time %q: %v", ts, err)
	}
	if len(got) != len(want)+1 {
		t.Errorf("fields %v, want exactly time and %v", got, want)
	}
	assertMode(t, filepath.Dir(spool), 0o700)
	assertMode(t, spool, 0o600)

	d, rec := ingest(t, spool)
	d.Ingest()
	recs := rec.Records(audit.EventStepUnfiltered)
	if len(recs) != len(lines) {
		t.Fatalf("the agent recorded %d of %d lines", len(recs), len(lines))
	}
	for i, r := range recs {
		s := "connect: connection refused"
		if i > 0 {
			s = hostile[i-1]
		}
		// step_id has 64 bytes of the line: the longest is cut.
		if r.JobID != uint32(100+i) || r.StepID == "" || !strings.HasPrefix(decoded(s), r.StepID) || r.Reason != decoded(s) || r.UID == nil || *r.UID != 2001 {
			t.Errorf("record %d: job %d step %q reason %q uid %d, want job %d step and reason %q", i, r.JobID, r.StepID, r.Reason, r.UID, 100+i, decoded(s))
		}
	}
	if _, err := os.Lstat(spool); err == nil {
		t.Error("spool not consumed")
	}
}

// TestHostileLinesReadByAgent: lines with every field hostile (the node
// and time too, which Append takes from the system) reach the agent's
// reader as one record each.
func TestHostileLinesReadByAgent(t *testing.T) {
	spool := filepath.Join(t.TempDir(), "failopen.jsonl")
	var b bytes.Buffer
	for i, s := range hostile {
		b.WriteString(Line(Rec{Time: s, JobID: uint32(i + 1), Step: s, UID: 5, Node: s, Reason: s + strings.Repeat(s, 1<<14)}))
	}
	if err := os.WriteFile(spool, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	d, rec := ingest(t, spool)
	d.Ingest()
	recs := rec.Records(audit.EventStepUnfiltered)
	if len(recs) != len(hostile) {
		t.Fatalf("the agent recorded %d of %d lines", len(recs), len(hostile))
	}
	for i, r := range recs {
		// step_id has 64 bytes of the line: the longest is cut.
		if r.JobID != uint32(i+1) || r.StepID == "" || !strings.HasPrefix(decoded(hostile[i]), r.StepID) || !strings.HasPrefix(r.Reason, decoded(hostile[i])) {
			t.Errorf("record %d: job %d step %q reason %.80q", i, r.JobID, r.StepID, r.Reason)
		}
	}
	if left, _ := filepath.Glob(spool + "*"); len(left) != 0 {
		t.Errorf("a line was refused, the file kept: %v", left)
	}
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

func TestAppendRefuses(t *testing.T) {
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
	shared := filepath.Join(linkDir, "shared.jsonl")
	if err := os.WriteFile(shared, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o622); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(linkDir, "fifo.jsonl")
	if err := syscallMkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, want string
	}{
		{"relative", "spool/failopen.jsonl", "not an absolute path"},
		{"folder writable by others", filepath.Join(open, "failopen.jsonl"), "writable by others"},
		{"symlink", link, "too many levels of symbolic links"},
		{"folder is a file", filepath.Join(target, "failopen.jsonl"), "not a folder"},
		{"file writable by others", shared, "writable by others"},
		// Refused at once: O_NONBLOCK, no reader (ENXIO).
		{"a FIFO", fifo, "fifo.jsonl: no such device or address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Append(tt.path, 7, "0", 2001, "x")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Append(%s) = %v, want an error with %q", tt.path, err, tt.want)
			}
		})
	}
	if data, _ := os.ReadFile(target); len(data) != 0 {
		t.Errorf("wrote through a symlink: %q", data)
	}
}

// TestConcurrentAppendIngest: many writers append with the C writer while
// the agent ingests again and again; every line arrives exactly once.
func TestConcurrentAppendIngest(t *testing.T) {
	spool := filepath.Join(t.TempDir(), "failopen.jsonl")
	const writers, each = 16, 300
	d, rec := ingest(t, spool)
	// Writers stall up to 3 ms between open, lock and write, longer than a
	// pass of the agent takes: without the lock, lines would be lost.
	SetStall(3000)
	defer SetStall(0)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				// A reason of varying length: lines of many sizes.
				if err := Append(spool, uint32(w+1), fmt.Sprint(i), uint32(w), strings.Repeat("r", i%97)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	passes := 0
	for running := true; running; passes++ {
		select {
		case <-done:
			running = false
		default:
		}
		d.Ingest()
	}
	d.Ingest()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range rec.Records(audit.EventStepUnfiltered) {
		seen[fmt.Sprintf("%d/%s", r.JobID, r.StepID)]++
		if len(r.Reason) >= 97 || strings.Trim(r.Reason, "r") != "" {
			t.Errorf("record %d/%s: reason %q", r.JobID, r.StepID, r.Reason)
		}
	}
	lost, twice := 0, 0
	for w := 1; w <= writers; w++ {
		for i := 0; i < each; i++ {
			switch seen[fmt.Sprintf("%d/%d", w, i)] {
			case 0:
				lost++
			case 1:
			default:
				twice++
			}
		}
	}
	t.Logf("%d lines by %d writers, %d ingest passes: %d records, %d lost, %d read twice", writers*each, writers, passes, len(rec.Records(audit.EventStepUnfiltered)), lost, twice)
	if lost != 0 || twice != 0 || len(seen) != writers*each {
		t.Errorf("%d lines lost, %d read more than once, %d distinct of %d", lost, twice, len(seen), writers*each)
	}
	if left, _ := filepath.Glob(spool + "*"); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

func syscallMkfifo(path string) error { return syscall.Mkfifo(path, 0o600) }
