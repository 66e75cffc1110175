// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
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
	run := func(args ...string) (string, int) {
		var out, errb bytes.Buffer
		code := Tail(append([]string{"--file", opts.File}, args...), &out, &errb)
		return out.String() + errb.String(), code
	}
	for _, tc := range []struct {
		args      []string
		lines     int
		want, not string
	}{
		{nil, 14, "gpu_access", ""},
		{[]string{"--denied"}, 3, "would-deny", "allowed"},
		{[]string{"--job", "13"}, 1, "job_without_prolog", "policy_applied"},
		{[]string{"--user", "alice"}, 5, "alice(1000)", "would-deny"},
		{[]string{"--user", "0"}, 1, "(0)", "alice"},
		{[]string{"-n", "2"}, 2, "agent_stop", "agent_start"},
		{[]string{"--json", "--denied", "--job", "12"}, 2, `"decision":"denied"`, "allowed"},
	} {
		out, code := run(tc.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, out)
		}
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if len(lines) != tc.lines || !strings.Contains(out, tc.want) || (tc.not != "" && strings.Contains(out, tc.not)) {
			t.Errorf("%v: %d lines, want %d with %q and without %q:\n%s", tc.args, len(lines), tc.lines, tc.want, tc.not, out)
		}
	}
	out, _ := run("--job", "12", "--denied")
	want := "gpu_access           denied     12.0         alice(1000)      4242 python            /usr/bin/python3.11      /dev/nvidia3 gpu3    -      job 12 step 0 (alice) denied open of /dev/nvidia3"
	if !strings.Contains(out, want) {
		t.Errorf("human line:\n%s\nwant it to contain:\n%s", out, want)
	}
	out, _ = run("--user", "0")
	if want := "77 mknod               [exec'd since] /usr/bin/sleep"; !strings.Contains(out, want) {
		t.Errorf("human line of a process that exec'd since:\n%s\nwant it to contain %q", out, want)
	}
	if _, code := run("--bogus"); code != 2 {
		t.Errorf("unknown flag: exit %d", code)
	}
	var errb bytes.Buffer
	if code := Tail([]string{"--file", "/nonexistent/audit.jsonl"}, &errb, &errb); code != 1 {
		t.Errorf("missing file: exit %d", code)
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
		if code := Tail(append([]string{"--file", opts.File}, args...), &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
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
