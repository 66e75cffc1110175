// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/audit"
)

// TestAuditVerifyCommand: gpufence audit verify reaches the checker through
// the command line, with its exit statuses.
func TestAuditVerifyCommand(t *testing.T) {
	file := filepath.Join(t.TempDir(), "audit.jsonl")
	p, err := audit.New(audit.Options{File: file, Journald: "off", BootID: "9663521c-8306-485f-8bae-9f1dc2d1b46b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		p.Emit(audit.Record{Event: audit.EventConfigReload, Message: "reload"})
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if rc := run([]string{"audit", "verify", file}, &out, &errb); rc != 0 || !strings.Contains(out.String(), "ok: 3 chained records in 1 runs") {
		t.Fatalf("clean file: rc %d, %q %q", rc, out.String(), errb.String())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	if err := os.WriteFile(file, []byte(lines[0]+lines[2]), 0o640); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if rc := run([]string{"audit", "verify", file}, &out, &errb); rc != 1 || !strings.Contains(out.String(), "audit.jsonl:2 (run "+p.RunID()+" seq 3): the record before it is missing") {
		t.Fatalf("deleted record: rc %d, %q", rc, out.String())
	}
	if rc := run([]string{"audit", "verify"}, &out, &errb); rc != 2 {
		t.Fatalf("no file: rc %d", rc)
	}
}

// TestAuditTailCommand: the flags of gpufence audit tail reach the reader:
// rotated .gz files, --since/--until, --json as --format json; a file that
// cannot be read is exit 1 and one line.
func TestAuditTailCommand(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "audit.jsonl")
	rec := func(ts, msg string) string {
		return `{"time":"` + ts + `","event":"config_reload","severity":"notice","message":"` + msg + `"}` + "\n"
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write([]byte(rec("2026-05-01T00:00:00Z", "old") + rec("2026-05-01T01:00:00Z", "older-kept")))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file+".2.gz", z.Bytes(), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file+".1", []byte(rec("2026-05-01T02:00:00Z", "kept")), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(rec("2026-05-01T03:00:00Z", "new")), 0o640); err != nil {
		t.Fatal(err)
	}
	base := []string{"audit", "tail", "--file", file, "--since", "2026-05-01T01:00:00Z", "--until", "2026-05-01T02:00:00Z", "-n", "0"}
	code, js, errs := cli(append(base, "--json")...)
	if want := rec("2026-05-01T01:00:00Z", "older-kept") + rec("2026-05-01T02:00:00Z", "kept"); code != 0 || js != want || errs != "" {
		t.Errorf("--json: exit %d, stdout %q, stderr %q; want %q", code, js, errs, want)
	}
	if code, out, _ := cli(append(base, "--format", "json")...); code != 0 || out != js {
		t.Errorf("--format json: exit %d, %q; want what --json prints", code, out)
	}
	if code, out, _ := cli(append(base, "--format", "json", "--json")...); code != 0 || out != js {
		t.Errorf("--format json --json: exit %d, %q", code, out)
	}
	code, out, _ := cli(append(base, "--format", "text")...)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "2026-05-01T01:00:00.000Z config_reload") || !strings.HasSuffix(lines[1], " kept") {
		t.Errorf("--format text: exit %d:\n%s", code, out)
	}
	if code, out, _ := cli("audit", "tail", "--file", file, "--since", "2026-05-01T03:00:00Z", "-n", "5"); code != 0 || !strings.HasSuffix(strings.TrimSpace(out), " new") || strings.Count(out, "\n") != 1 {
		t.Errorf("--since the live file's record: exit %d:\n%s", code, out)
	}
	missing := filepath.Join(dir, "none.jsonl")
	if code, out, errs := cli("audit", "tail", "--file", missing); code != 1 || out != "" || errs != "gpufence audit tail: open "+missing+": no such file or directory\n" {
		t.Errorf("missing file: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}
