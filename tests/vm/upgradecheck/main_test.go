// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The books: a record counts 1 + suppressed, a summary its suppressed, and
// one access the trail does not carry fails the check.
func TestCheckBooks(t *testing.T) {
	dir := t.TempDir()
	audit := strings.Join([]string{
		`{"seq":1,"event":"agent_start","agent_version":"v1","time":"2026-01-01T00:00:00Z"}`,
		`{"seq":2,"event":"gpu_access","decision":"allowed","job_id":7,"step_id":"batch","device":{"major":195,"minor":0},"time":"2026-01-01T00:00:00Z"}`,
		`{"seq":3,"event":"gpu_access","decision":"denied","job_id":7,"step_id":"batch","device":{"major":195,"minor":1},"time":"2026-01-01T00:00:00Z"}`,
		`{"seq":4,"event":"gpu_access","decision":"denied","job_id":7,"step_id":"batch","suppressed":2,"device":{"major":195,"minor":1},"time":"2026-01-01T00:00:00Z"}`,
		`{"seq":5,"event":"access_suppressed","decision":"denied","job_id":7,"step_id":"batch","suppressed":3,"device":{"major":195,"minor":1},"time":"2026-01-01T00:00:00Z"}`,
		`{"seq":6,"event":"access_suppressed","decision":"allowed","job_id":7,"step_id":"batch","suppressed":1,"device":{"major":195,"minor":0},"time":"2026-01-01T00:00:00Z"}`,
	}, "\n") + "\n"
	write(t, dir, "audit.jsonl", audit)
	var probe strings.Builder
	for i := 0; i < 7; i++ { // 1 + (1+2) + 3
		probe.WriteString("1767225600000000001 /dev/nvidia1 EPERM\n")
	}
	probe.WriteString("1767225600000000002 /dev/nvidia0 ENXIO\n1767225600000000003 /dev/nvidia0 ENXIO\n")
	write(t, dir, "probe.out", probe.String())
	args := []string{"-audit", filepath.Join(dir, "audit.jsonl"), "-probe", filepath.Join(dir, "probe.out"),
		"-probe-job", "7", "-probe-gpus", "0"}
	var out bytes.Buffer
	if rc := check(args, &out); rc != 0 {
		t.Fatalf("rc %d, want 0:\n%s", rc, out.String())
	}
	// One denied attempt more than the trail carries: a lost record.
	write(t, dir, "probe.out", probe.String()+"1767225600000000004 /dev/nvidia1 EPERM\n")
	out.Reset()
	if rc := check(args, &out); rc != 1 || !strings.Contains(out.String(), "probe denied: 8 attempts, 7 accounted") {
		t.Fatalf("rc %d, want 1 with the denied books off by one:\n%s", rc, out.String())
	}
	// The own GPU denied once.
	write(t, dir, "probe.out", probe.String()+"1767225600000000004 /dev/nvidia0 EPERM\n")
	out.Reset()
	if rc := check(args, &out); rc != 1 || !strings.Contains(out.String(), "FAIL EPERM on the probe's own GPU: 1") {
		t.Fatalf("rc %d, want 1 for an EPERM on the own GPU:\n%s", rc, out.String())
	}
}

// A burst: a failed step, a step that opened a foreign GPU, or a missing
// step fails.
func TestCheckBurst(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "audit.jsonl", strings.Join([]string{
		`{"seq":1,"event":"gpu_access","decision":"allowed","job_id":9,"step_id":"0","device":{"major":195,"minor":1},"time":"2026-01-01T00:00:00Z"}`,
		`{"seq":2,"event":"gpu_access","decision":"denied","job_id":9,"step_id":"0","device":{"major":195,"minor":0},"time":"2026-01-01T00:00:00Z"}`,
		`{"seq":3,"event":"gpu_access","decision":"denied","job_id":9,"step_id":"1","device":{"major":195,"minor":0},"time":"2026-01-01T00:00:00Z"}`,
		`{"seq":4,"event":"gpu_access","decision":"denied","job_id":9,"step_id":"1","device":{"major":195,"minor":1},"time":"2026-01-01T00:00:00Z"}`,
	}, "\n")+"\n")
	b := filepath.Join(dir, "burst")
	os.Mkdir(b, 0o755)
	write(t, b, "gpu-1.out", "env SLURM_STEP_ID=0\n/dev/nvidia0 EPERM\n/dev/nvidia1 ENXIO\n")
	write(t, b, "gpu-1.rc", "0 10.0 11.5\n")
	write(t, b, "cpu-2.out", "env SLURM_STEP_ID=1\n/dev/nvidia0 EPERM\n/dev/nvidia1 EPERM\n")
	write(t, b, "cpu-2.rc", "0 10.1 10.6\n")
	args := []string{"-audit", filepath.Join(dir, "audit.jsonl"), "-probe-gpus", "0", "-burst-job", "9",
		"-burst-gpus", "1", "-burst-n", "2", "-burst", b}
	var out bytes.Buffer
	if rc := check(args, &out); rc != 0 {
		t.Fatalf("rc %d, want 0:\n%s", rc, out.String())
	}
	if !strings.Contains(out.String(), "max 1.50 s") {
		t.Errorf("no max latency in:\n%s", out.String())
	}
	write(t, b, "cpu-2.rc", "1 10.1 10.6\n")
	out.Reset()
	if rc := check(args, &out); rc != 1 || !strings.Contains(out.String(), "FAIL burst failed steps: 1 of 2") {
		t.Fatalf("rc %d, want 1 for a failed step:\n%s", rc, out.String())
	}
	write(t, b, "cpu-2.rc", "0 10.1 10.6\n")
	write(t, b, "cpu-2.out", "env SLURM_STEP_ID=1\n/dev/nvidia0 ENXIO\n/dev/nvidia1 EPERM\n")
	out.Reset()
	if rc := check(args, &out); rc != 1 || !strings.Contains(out.String(), "FAIL burst foreign GPU opens: 1") {
		t.Fatalf("rc %d, want 1 for a foreign open:\n%s", rc, out.String())
	}
	os.Remove(filepath.Join(b, "cpu-2.rc"))
	out.Reset()
	if _, err := readBurst(b); err == nil || !strings.Contains(err.Error(), "never ended") {
		t.Fatalf("a step without an exit code: %v", err)
	}
}

func TestParseIndices(t *testing.T) {
	for in, want := range map[string]string{"0": "[0]", "1-2": "[1 2]", "0,2-3": "[0 2 3]"} {
		if got, err := parseIndices(in); err != nil || fmt.Sprint(got) != want {
			t.Errorf("parseIndices(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"x", "3-1", "1-"} {
		if _, err := parseIndices(in); err == nil {
			t.Errorf("parseIndices(%q): no error", in)
		}
	}
}

func write(t *testing.T, dir, name, s string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A record missing from the file (a seq gap) fails; a loss of the journald
// copy alone is shown, not judged; any other audit_loss fails.
func TestCheckLosses(t *testing.T) {
	dir := t.TempDir()
	base := []string{
		`{"seq":1,"event":"agent_start","time":"2026-01-01T00:00:00Z"}`,
		`{"seq":2,"event":"audit_loss","loss":{"sink_failed":{"journald":40},"sink":"journald"},"time":"2026-01-01T00:00:00Z"}`,
		`{"seq":1,"event":"agent_start","time":"2026-01-01T00:00:00Z"}`,
		`{"seq":2,"event":"policy_released","time":"2026-01-01T00:00:00Z"}`,
	}
	args := []string{"-audit", filepath.Join(dir, "audit.jsonl"), "-probe-gpus", "0"}
	run := func(lines ...string) (int, string) {
		write(t, dir, "audit.jsonl", strings.Join(lines, "\n")+"\n")
		var out bytes.Buffer
		return check(args, &out), out.String()
	}
	if rc, out := run(base...); rc != 0 || !strings.Contains(out, "WARN the journald copy lost 40") || !strings.Contains(out, "over 2 agent runs") {
		t.Fatalf("rc %d, want 0 with the journald loss shown and 2 runs:\n%s", rc, out)
	}
	if rc, out := run(append(base, `{"seq":4,"event":"policy_released","time":"2026-01-01T00:00:00Z"}`)...); rc != 1 || !strings.Contains(out, "FAIL seq gaps in the audit file: 1") {
		t.Fatalf("rc %d, want 1 for a seq gap:\n%s", rc, out)
	}
	if rc, out := run(append(base, `{"seq":3,"event":"audit_loss","loss":{"ringbuf_lost":2},"time":"2026-01-01T00:00:00Z"}`)...); rc != 1 || !strings.Contains(out, "FAIL audit_loss records") {
		t.Fatalf("rc %d, want 1 for a ring buffer loss:\n%s", rc, out)
	}
}
