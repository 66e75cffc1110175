// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestRunIDUniqueAcrossRestarts(t *testing.T) {
	opts := testOptions(t)
	seen := map[string]bool{}
	var runs []string
	for i := 0; i < 2; i++ {
		p, err := New(opts, nil)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, p.RunID())
		for _, r := range sampleRecords()[:3] {
			p.Emit(r)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if runs[0] == runs[1] {
		t.Fatalf("two agent runs got the same run id %s", runs[0])
	}
	recs := readRecords(t, opts.File) // validates each against the schema
	if len(recs) != 6 {
		t.Fatalf("%d records, want 6", len(recs))
	}
	for i, r := range recs {
		if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(r.RunID) || r.RunID != runs[i/3] {
			t.Errorf("record %d: run_id %q, want %q", i, r.RunID, runs[i/3])
		}
		id := fmt.Sprintf("%s:%d", r.RunID, r.Seq)
		if seen[id] {
			t.Errorf("record id %s repeats", id)
		}
		seen[id] = true
		if r.Hash == "" || r.PrevHash == "" {
			t.Errorf("record %d has no hash chain: prev %q hash %q", i, r.PrevHash, r.Hash)
		}
	}
	if recs[0].Seq != 1 || recs[3].Seq != 1 {
		t.Errorf("seq does not restart per run: %d, %d", recs[0].Seq, recs[3].Seq)
	}
	if _, err := New(Options{RunID: "not-hex", Journald: "off", BootID: testBootID}, nil); err == nil || !strings.Contains(err.Error(), "32 lower-case hex") {
		t.Errorf("bad run id: %v", err)
	}
}

// chainFiles writes, through real pipelines: run 1 with 4 records, rotated
// (logrotate's rename, delaycompress: .1 then .2.gz) twice while it runs,
// then run 2 appended to the current file. It returns the files, oldest first.
func chainFiles(t *testing.T) []string {
	t.Helper()
	opts := testOptions(t)
	opts.RunID = "00000000000000000000000000000001"
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	emit := func(p *Pipeline, n int) {
		want := p.Stats().Sinks["file"].Written + uint64(n)
		for _, r := range sampleRecords()[:n] {
			p.Emit(r)
		}
		waitFor(t, "records written", func() bool { return p.Stats().Sinks["file"].Written == want })
	}
	f := opts.File
	emit(p, 4)
	must(t, os.Rename(f, f+".1"))
	must(t, p.Reopen())
	emit(p, 3)
	must(t, os.Rename(f+".1", f+".2"))
	gz(t, f+".2")
	must(t, os.Rename(f, f+".1"))
	must(t, p.Reopen())
	emit(p, 2)
	must(t, p.Close())
	opts.RunID = "00000000000000000000000000000002"
	p, err = New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	emit(p, 4)
	must(t, p.Close())
	return []string{f + ".2.gz", f + ".1", f}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func gz(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	must(t, w.Close())
	must(t, os.WriteFile(path+".gz", buf.Bytes(), 0o640))
	must(t, os.Remove(path))
}

func runVerify(t *testing.T, files ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	rc, err := Verify(files, &out)
	if err != nil {
		out.WriteString(err.Error())
	}
	return rc, out.String()
}

// editLines rewrites the current (uncompressed) file with f applied to its lines.
func editLines(t *testing.T, path string, f func([]string) []string) {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	lines := strings.SplitAfter(string(b), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	must(t, os.WriteFile(path, []byte(strings.Join(f(lines), "")), 0o640))
}

func TestVerifyCleanChainAcrossRotationAndRuns(t *testing.T) {
	files := chainFiles(t)
	// Given in the shell's order (base, .1, .2.gz), not oldest first.
	rc, out := runVerify(t, files[2], files[1], files[0])
	if rc != VerifyOK || !strings.Contains(out, "ok: 13 chained records in 2 runs") {
		t.Fatalf("clean files: rc %d, %q", rc, out)
	}
	for _, f := range files[1:] {
		for _, r := range readRecords(t, f) {
			if r.Hash == "" {
				t.Fatalf("%s: record without hash", f)
			}
		}
	}
	// Only the newest file: run 1 began before it, run 2 starts in it.
	rc, out = runVerify(t, files[2])
	if rc != VerifyOK || !strings.Contains(out, "run 00000000000000000000000000000001 began before the oldest file given") {
		t.Fatalf("newest file alone: rc %d, %q", rc, out)
	}
	// Without the middle file, run 1 misses records.
	rc, out = runVerify(t, files[0], files[2])
	if rc != VerifyBroken || !strings.Contains(out, "audit.jsonl:1 (run 00000000000000000000000000000001 seq 8): the record before it is missing") {
		t.Fatalf("middle file left out: rc %d, %q", rc, out)
	}
}

func TestVerifyDetectsTampering(t *testing.T) {
	run1 := "run 00000000000000000000000000000001"
	run2 := "run 00000000000000000000000000000002"
	for _, tc := range []struct {
		name string
		edit func([]string) []string
		want string
	}{
		{"edited", func(l []string) []string {
			l[3] = strings.Replace(l[3], `"job_id":12`, `"job_id":13`, 1)
			return l
		}, "audit.jsonl:4 (" + run2 + " seq 2): edited: the record's hash does not match its contents"},
		{"edited, hash recomputed", func(l []string) []string {
			body, _, ok := splitHash([]byte(strings.TrimSuffix(l[3], "\n")))
			if !ok {
				panic("no hash")
			}
			body = bytes.Replace(body, []byte(`"job_id":12`), []byte(`"job_id":13`), 1)
			l[3] = string(body[:len(body)-1]) + `,"hash":"` + hashOf(body) + `"}` + "\n"
			return l
		}, "audit.jsonl:5 (" + run2 + " seq 3): the record before it is missing or was altered"},
		{"deleted", func(l []string) []string {
			return append(l[:3:3], l[4:]...)
		}, "audit.jsonl:4 (" + run2 + " seq 3): the record before it is missing or was altered"},
		{"deleted run start", func(l []string) []string {
			return append(l[:2:2], l[3:]...)
		}, "audit.jsonl:3 (" + run2 + " seq 2): the record before it is missing or was altered: the first record of " + run2},
		{"reordered", func(l []string) []string {
			l[3], l[4] = l[4], l[3]
			return l
		}, "audit.jsonl:4 (" + run2 + " seq 3): out of order"},
		{"duplicated", func(l []string) []string {
			return append(l[:4:4], l[3:]...)
		}, "audit.jsonl:5 (" + run2 + " seq 2): the same record as"},
		{"truncated", func(l []string) []string {
			l[len(l)-1] = l[len(l)-1][:40]
			return l
		}, "audit.jsonl:6: cut short"},
		{"hash stripped", func(l []string) []string {
			l[1] = l[1][:strings.LastIndex(l[1], `,"hash"`)] + "}\n"
			return l
		}, "audit.jsonl:2: record of " + run1 + " seq 9 has no hash"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := chainFiles(t)
			editLines(t, files[2], tc.edit)
			rc, out := runVerify(t, files...)
			if rc != VerifyBroken || !strings.Contains(out, "BROKEN: ") || !strings.Contains(out, tc.want) {
				t.Fatalf("rc %d, output %q; want 1 and %q", rc, out, tc.want)
			}
		})
	}
}

// TestVerifyUnreadable: a file that cannot be read is VerifyUsage, and
// earlier unchained records are no break. (No file, --bogus and --help:
// TestAuditVerifyCommand and TestCommandTree in agent/cmd/gpufence.)
func TestVerifyUnreadable(t *testing.T) {
	if rc, out := runVerify(t, filepath.Join(t.TempDir(), "none.jsonl")); rc != VerifyUsage || !strings.Contains(out, "no such file") {
		t.Errorf("missing file: rc %d %q", rc, out)
	}
	// An older agent's records (no run_id, no hash) before the chain are
	// counted, not a break.
	f := filepath.Join(t.TempDir(), "audit.jsonl")
	old := `{"schema_version":"1","seq":1,"boot_id":"` + testBootID + `","event":"agent_start"}` + "\n"
	must(t, os.WriteFile(f, []byte(old), 0o640))
	if rc, out := runVerify(t, f); rc != VerifyOK || !strings.Contains(out, "1 earlier records without a chain") {
		t.Errorf("legacy records: rc %d %q", rc, out)
	}
}

func TestAccessTimeWrittenUTC(t *testing.T) {
	opts := testOptions(t)
	p, err := New(opts, nil)
	must(t, err)
	p.Emit(sampleRecords()[3])
	must(t, p.Close())
	b, err := os.ReadFile(opts.File)
	must(t, err)
	if !bytes.Contains(b, []byte(`"access_time":"2026-11-29T07:00:00.000000005Z"`)) {
		t.Fatalf("access_time not in UTC with nanoseconds: %s", b)
	}
	readRecords(t, opts.File) // the schema accepts it
}
