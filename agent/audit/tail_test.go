// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestTail(t *testing.T) {
	opts := testOptions(t)
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range sampleRecords() {
		p.Emit(r)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	run := func(o TailOptions) (string, error) {
		var out, errb bytes.Buffer
		if o.N == 0 {
			o.N = 20
		}
		o.File = opts.File
		err := Tail(context.Background(), o, &out, &errb)
		return out.String() + errb.String(), err
	}
	for _, tc := range []struct {
		o         TailOptions
		lines     int
		want, not string
	}{
		{TailOptions{}, 14, "gpu_access", ""},
		{TailOptions{Denied: true}, 3, "would-deny", "allowed"},
		{TailOptions{JobID: 13}, 1, "job_without_prolog", "policy_applied"},
		{TailOptions{User: "alice"}, 5, "alice(1000)", "would-deny"},
		{TailOptions{User: "0"}, 1, "(0)", "alice"},
		{TailOptions{N: 2}, 2, "agent_stop", "agent_start"},
		{TailOptions{Format: FormatJSON, Denied: true, JobID: 12}, 2, `"decision":"denied"`, "allowed"},
	} {
		out, err := run(tc.o)
		if err != nil {
			t.Fatalf("%+v: %v: %s", tc.o, err, out)
		}
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if len(lines) != tc.lines || !strings.Contains(out, tc.want) || (tc.not != "" && strings.Contains(out, tc.not)) {
			t.Errorf("%+v: %d lines, want %d with %q and without %q:\n%s", tc.o, len(lines), tc.lines, tc.want, tc.not, out)
		}
	}
	out, _ := run(TailOptions{JobID: 12, Denied: true})
	want := "gpu_access           denied     12.0         alice(1000)      4242 python            /usr/bin/python3.11      /dev/nvidia3 gpu3    -      job 12 step 0 (alice) denied open of /dev/nvidia3"
	if !strings.Contains(out, want) {
		t.Errorf("human line:\n%s\nwant it to contain:\n%s", out, want)
	}
	out, _ = run(TailOptions{User: "0"})
	if want := "77 mknod               [exec'd since] /usr/bin/sleep"; !strings.Contains(out, want) {
		t.Errorf("human line of a process that exec'd since:\n%s\nwant it to contain %q", out, want)
	}
	for _, o := range []TailOptions{{Format: "yaml"}, {Event: "no_such_event"}, {N: -1}} {
		if _, err := run(o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	var errb bytes.Buffer
	if err := Tail(context.Background(), TailOptions{File: "/nonexistent/audit.jsonl"}, &errb, &errb); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestTailEscapes: whatever a record holds, `audit tail` prints no byte a
// terminal acts on, and the escaped text still says what it was.
func TestTailEscapes(t *testing.T) {
	opts := testOptions(t)
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	const name = "\x1b]2;pwned\x07\x1b[2J\u009b"
	p.Emit(Record{Event: EventGPUAccess, Severity: SeverityWarning, Decision: DecisionDenied, PolicyMode: ModeEnforce,
		UID: UID(1000), PID: 4242, Comm: Escape(name), ExeStatus: ExeChanged, ExeNow: Escape("/tmp/\x1b[31mx\nfake line"),
		Device: &Device{Major: 195, Minor: 2}, Access: []string{"read"}, CgroupID: 7,
		// Text no one escaped before: the pipeline makes it printable.
		Message: "denied open by " + name, Error: "raw \x1b[0m", JobID: 3, StepID: "0", User: "evil\x1b[1m"})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	recs := readRecords(t, opts.File)
	if len(recs) != 1 {
		t.Fatalf("%d records, want 1", len(recs))
	}
	if got, err := unescape(recs[0].Comm); err != nil || got != name {
		t.Errorf("record comm %q unescapes to %q, %v; want %q", recs[0].Comm, got, err, name)
	}
	for _, args := range [][]string{nil, {"--json"}, {"--denied", "--json"}, {"--job", "3"}} {
		var out, errb bytes.Buffer
		o := TailOptions{File: opts.File, N: 20}
		for _, a := range args {
			switch a {
			case "--json":
				o.Format = FormatJSON
			case "--denied":
				o.Denied = true
			case "3":
				o.JobID = 3
			}
		}
		if err := Tail(context.Background(), o, &out, &errb); err != nil {
			t.Fatalf("%v: %v: %s", args, err, errb.String())
		}
		if hasControl(strings.TrimSuffix(out.String(), "\n")) || strings.Count(out.String(), "\n") != 1 {
			t.Errorf("tail %v printed a control character or an extra line: %q", args, out.String())
		}
		shown := `\x1b]2;pwned\x07\x1b[2J\xc2\x9b`
		if len(args) > 0 && args[len(args)-1] == "--json" {
			shown = strings.ReplaceAll(shown, `\`, `\\`)
		}
		if !strings.Contains(out.String(), shown) {
			t.Errorf("tail %v: %q does not show the escaped name", args, out.String())
		}
	}
}

func TestParseTimeBound(t *testing.T) {
	now := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
	}{
		{"2026-05-04T10:00:00Z", time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)},
		{"2026-05-04T12:00:00+02:00", time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)},
		{"2026-05-04T10:00:00.5Z", time.Date(2026, 5, 4, 10, 0, 0, 5e8, time.UTC)},
		{"2026-05-01", time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)},
		{"90s", now.Add(-90 * time.Second)},
		{"30m", now.Add(-30 * time.Minute)},
		{"1h", now.Add(-time.Hour)},
		{"1h30m", now.Add(-90 * time.Minute)},
		{"2d", now.Add(-48 * time.Hour)},
		{"1d12h", now.Add(-36 * time.Hour)},
	} {
		got, err := ParseTimeBound(tc.in, now)
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "yesterday", "0", "0s", "-1h", "1x", "d", "2dd", "1.5d", "-2d", "2026-13-01", "2026-05-04 10:00:00", "2026-05-04T10:00:00"} {
		if got, err := ParseTimeBound(in, now); err == nil || !strings.Contains(err.Error(), strconv.Quote(in)) {
			t.Errorf("%q: %v, %v; want an error naming it", in, got, err)
		}
	}
}

// writeTailFile writes records with the given messages, one a minute from
// start, as gzip when gz.
func writeTailFile(t *testing.T, path string, gz bool, start time.Time, msgs ...string) {
	t.Helper()
	var b bytes.Buffer
	for i, m := range msgs {
		fmt.Fprintf(&b, `{"time":%q,"event":"config_reload","severity":"notice","message":%q}`+"\n", start.Add(time.Duration(i)*time.Minute).Format(time.RFC3339), m)
	}
	data := b.Bytes()
	if gz {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		zw.Write(data)
		must(t, zw.Close())
		data = z.Bytes()
	}
	must(t, os.WriteFile(path, data, 0o640))
}

// TestTailRotated: tail reads logrotate's rotated files (gzip'd or not,
// numbered or dated) oldest first, then the live file, with -n and the
// filters across all of them, and unpacks no more old files than -n needs.
func TestTailRotated(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "audit.jsonl")
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	hour := func(h int) time.Time { return t0.Add(time.Duration(h) * time.Hour) }
	writeTailFile(t, f+".3.gz", true, hour(0), "r3a", "r3b")
	writeTailFile(t, f+".2.gz", true, hour(1), "r2a", "r2b")
	writeTailFile(t, f+".1", false, hour(2), "r1a", "r1b")
	writeTailFile(t, f, false, hour(3), "liveA", "liveB")
	// Not rotated siblings of f: another file's, and an editor's copy.
	writeTailFile(t, filepath.Join(dir, "other.jsonl.1"), false, hour(0), "other")
	writeTailFile(t, f+".bak", false, hour(0), "bak")
	writeTailFile(t, f+".1.tmp", false, hour(0), "tmp")

	got, err := RotatedFiles(f)
	if want := []string{f + ".3.gz", f + ".2.gz", f + ".1"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("RotatedFiles: %q, %v; want %q", got, err, want)
	}
	tail := func(o TailOptions) ([]string, error) {
		o.File = f
		var out, errb bytes.Buffer
		err := Tail(context.Background(), o, &out, &errb)
		if errb.Len() > 0 {
			t.Errorf("%+v: stderr %q", o, errb.String())
		}
		var msgs []string
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if l != "" {
				msgs = append(msgs, strings.Fields(l)[len(strings.Fields(l))-1])
			}
		}
		return msgs, err
	}
	for _, tc := range []struct {
		o    TailOptions
		want []string
	}{
		{TailOptions{}, []string{"r3a", "r3b", "r2a", "r2b", "r1a", "r1b", "liveA", "liveB"}},
		{TailOptions{N: 3}, []string{"r1b", "liveA", "liveB"}},
		{TailOptions{N: 5}, []string{"r2b", "r1a", "r1b", "liveA", "liveB"}},
		{TailOptions{Since: hour(1).Add(time.Minute), Until: hour(2)}, []string{"r2b", "r1a"}},
		{TailOptions{Since: hour(2).Add(30 * time.Second), N: 2}, []string{"liveA", "liveB"}},
		{TailOptions{Until: hour(0)}, []string{"r3a"}},
		{TailOptions{Since: hour(9)}, nil},
	} {
		if tc.o.N == 0 {
			tc.o.N = 100
		}
		got, err := tail(tc.o)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%+v: %q, %v; want %q", tc.o, got, err, tc.want)
		}
	}
	// JSON: the records as written, from the gzip'd files too.
	var out bytes.Buffer
	if err := Tail(context.Background(), TailOptions{File: f, Format: FormatJSON, Until: hour(0)}, &out, &out); err != nil ||
		out.String() != `{"time":"2026-05-01T00:00:00Z","event":"config_reload","severity":"notice","message":"r3a"}`+"\n" {
		t.Errorf("json from .gz: %v %q", err, out.String())
	}

	// --file naming a rotated file reads it alone, gzip'd or not; a
	// gzip'd one cannot be followed.
	for name, want := range map[string][]string{f + ".2.gz": {"r2a", "r2b"}, f + ".1": {"r1a", "r1b"}} {
		var out, errb bytes.Buffer
		err := Tail(context.Background(), TailOptions{File: name, N: 10}, &out, &errb)
		if got := strings.Fields(out.String()); err != nil || errb.Len() > 0 || len(got) < 2 || !strings.HasSuffix(out.String(), want[1]+"\n") || strings.Count(out.String(), "\n") != 2 {
			t.Errorf("--file %s: %v %q\n%s", name, err, errb.String(), out.String())
		}
	}
	if err := Tail(context.Background(), TailOptions{File: f + ".2.gz", Follow: true}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "--follow needs the live file") {
		t.Errorf("--follow a .gz: %v", err)
	}

	// A broken oldest file is not opened while newer ones hold -n records,
	// and is an error naming it when it is needed.
	must(t, os.WriteFile(f+".4.gz", []byte("\x1f\x8bnot gzip"), 0o640))
	if got, err := tail(TailOptions{N: 8}); err != nil || len(got) != 8 {
		t.Errorf("-n 8 with a broken .4.gz: %q, %v", got, err)
	}
	if _, err := tail(TailOptions{}); err == nil || !strings.Contains(err.Error(), f+".4.gz") {
		t.Errorf("all records with a broken .4.gz: %v, want an error naming it", err)
	}
	must(t, os.Remove(f+".4.gz"))

	// dateext names, by date, gzip'd and not.
	d := t.TempDir()
	g := filepath.Join(d, "audit.jsonl")
	writeTailFile(t, g+"-20260502.gz", true, hour(0), "d1")
	writeTailFile(t, g+"-20260503", false, hour(1), "d2")
	writeTailFile(t, g, false, hour(2), "d3")
	f = g
	if got, err := tail(TailOptions{N: 10}); err != nil || !slices.Equal(got, []string{"d1", "d2", "d3"}) {
		t.Errorf("dateext: %q, %v", got, err)
	}
}

// syncBuffer is a bytes.Buffer that Tail writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestTailFollow: --follow prints what is appended to the live file,
// through the filters and after logrotate moved it, and ends with ctx.
func TestTailFollow(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "audit.jsonl")
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	writeTailFile(t, f+".1", false, t0, "rotated")
	writeTailFile(t, f, false, t0.Add(time.Hour), "first")
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Tail(ctx, TailOptions{File: f, Follow: true, N: 20, Since: t0.Add(time.Minute)}, &out, &out)
	}()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q after 10s:\n%s", want, out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("first")
	appendLine := func(path, ts, msg string) {
		fh, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o640)
		must(t, err)
		fmt.Fprintf(fh, `{"time":%q,"event":"config_reload","message":%q}`+"\n", ts, msg)
		must(t, fh.Close())
	}
	appendLine(f, "2026-05-01T00:00:00Z", "too-old") // --since drops it
	appendLine(f, "2026-05-01T02:00:00Z", "second")
	waitFor("second")
	must(t, os.Rename(f, f+".0"))
	appendLine(f, "2026-05-01T03:00:00Z", "after-rotation")
	waitFor("after-rotation")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := out.String(); strings.Contains(s, "rotated") || strings.Contains(s, "too-old") || strings.Count(s, "\n") != 3 {
		t.Errorf("printed:\n%s\nwant first, second, after-rotation", s)
	}
}
