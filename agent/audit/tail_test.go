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
	want := "gpu_access           denied     12.0         alice(1000)      4242 python            /dev/nvidia3 gpu3    -      job 12 step 0 (alice) denied open of /dev/nvidia3"
	if !strings.Contains(out, want) {
		t.Errorf("human line:\n%s\nwant it to contain:\n%s", out, want)
	}
	if _, code := run("--bogus"); code != 2 {
		t.Errorf("unknown flag: exit %d", code)
	}
	var errb bytes.Buffer
	if code := Tail([]string{"--file", "/nonexistent/audit.jsonl"}, &errb, &errb); code != 1 {
		t.Errorf("missing file: exit %d", code)
	}
}
