// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
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
