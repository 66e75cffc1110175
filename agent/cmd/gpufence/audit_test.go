// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
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
