// SPDX-License-Identifier: Apache-2.0

package plugintest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/spank/internal/fakeagent"
)

// The agent drops init's first request; the retry inside the same callback
// registers the step, and nobody hears of the hiccup.
func TestRetryWithinCallback(t *testing.T) {
	var n atomic.Int32
	a := fakeagent.Start(t, func(req *pb.Request) *pb.Response {
		if n.Add(1) == 1 {
			return fakeagent.HangUp
		}
		return &pb.Response{Gpus: []uint32{1, 3}}
	})
	lines := slurm(t, stepEnv(), "remote", []string{"init", "threads"}, "socket="+a.Socket)
	if !has(lines, "rc init 0") || hasPrefix(lines, "error:") || !has(lines, "threads 1") {
		t.Errorf("init with one dropped request: %q", lines)
	}
	reqs := a.Requests()
	if len(reqs) != 2 || reqs[0].GetStepStart() == nil || reqs[1].GetStepStart() == nil {
		t.Errorf("agent saw %v, want StepStart twice", reqs)
	}
}

// A silent agent costs the step two tries: its timeout, then one short
// try (within 1.5×timeout in all).
func TestRetryBudgetPerCallback(t *testing.T) {
	silent := fakeagent.Start(t, func(*pb.Request) *pb.Response { return nil })
	start := time.Now()
	lines := slurm(t, stepEnv(), "remote", []string{"init"}, "socket="+silent.Socket, "timeout=1")
	elapsed := time.Since(start)
	if !has(lines, "rc init 0") ||
		!hasPrefix(lines, "error: gpufence: job 7 step 2: cannot reach the gpufence agent at "+silent.Socket+" (no answer within 1s)") {
		t.Errorf("init with a silent agent: %q", lines)
	}
	if got := len(silent.Requests()); got != 2 {
		t.Errorf("agent saw %d requests, want 2", got)
	}
	if elapsed < 1250*time.Millisecond-100*time.Millisecond || elapsed > 1500*time.Millisecond+time.Second {
		t.Errorf("init took %v, want about 1.25s (timeout, then a 250ms try)", elapsed)
	}
}

// A job with a hung agent fails fast as a whole: the prolog (one process)
// waits its timeout, the extern step and the step (others) one short try
// each, and a failure=open step among them still runs and is recorded.
func TestHungAgentFailsFastAcrossProcesses(t *testing.T) {
	silent := fakeagent.Start(t, func(*pb.Request) *pb.Response { return nil })
	spool := filepath.Join(t.TempDir(), "failopen.jsonl")
	args := []string{"socket=" + silent.Socket, "timeout=2"}
	start := time.Now()
	lines := slurm(t, stepEnv(), "job_script", []string{"job_prolog"}, args...)
	prolog := time.Since(start)
	if !hasPrefix(lines, "error: gpufence: job 7 prolog: cannot reach the gpufence agent at "+silent.Socket+" (no answer within 2s)") {
		t.Errorf("prolog: %q", lines)
	}
	var steps []time.Duration
	for _, step := range []string{"0xfffffffc", "0"} { // extern, then step 0
		start = time.Now()
		lines = slurm(t, stepEnv("FAKE_STEP_ID="+step), "remote", stepSequence, append(args, "failure=open", "spool="+spool)...)
		steps = append(steps, time.Since(start))
		if !has(lines, "rc task_init 0") || !hasPrefix(lines, "error: gpufence: agent unreachable; failure=open lets job 7 step") ||
			!hasPrefix(lines, "error: gpufence: job 7 step") || !strings.Contains(strings.Join(lines, "\n"), "no answer within 250ms; an exchange on this node had none within 2s less than 30s ago") {
			t.Errorf("step %s after the prolog's timeout: %q", step, lines)
		}
	}
	total := prolog + steps[0] + steps[1]
	t.Logf("prolog %v, extern step %v, step %v: %v in all", prolog.Round(time.Millisecond), steps[0].Round(time.Millisecond), steps[1].Round(time.Millisecond), total.Round(time.Millisecond))
	if limit := 3*time.Second + time.Second; total > limit {
		t.Errorf("the job's three exchanges took %v, want within 1.5 × timeout + 1s = %v", total, limit)
	}
	if got := spoolLines(t, spool); len(got) != 2 {
		t.Errorf("spool %q, want a line for each step", got)
	}
}

func spoolLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

func TestFailOpenAgentAbsent(t *testing.T) {
	for _, tt := range []struct{ stepID, name string }{{"2", "2"}, {"0xfffffffb", "batch"}} {
		t.Run(tt.name, func(t *testing.T) {
			sock := fakeagent.AbsentSocket(t)
			spool := filepath.Join(t.TempDir(), "spool", "failopen.jsonl")
			lines := slurm(t, stepEnv("FAKE_STEP_ID="+tt.stepID), "remote", stepSequence,
				"socket="+sock, "failure=open", "spool="+spool)
			if !has(lines, "rc task_post_fork 0") || !has(lines, "rc task_init 0") {
				t.Errorf("failure=open did not let the task run: %q", lines)
			}
			want := "error: gpufence: agent unreachable; failure=open lets job 7 step " + tt.name +
				" run WITHOUT GPU isolation: cannot reach the gpufence agent at " + sock + " (connect: no such file or directory)"
			// Once in slurmstepd's log (post_fork), once on the task's output.
			if n := count(lines, want); n != 2 {
				t.Errorf("%d lines %q, want 2, in %q", n, want, lines)
			}
			if hasPrefix(lines, "error: gpufence: cannot record") || hasPrefix(lines, "info: gpufence:") {
				t.Errorf("unexpected lines: %q", lines)
			}
			// No filter: Slurm's own numbering stays.
			if !has(lines, "env CUDA_VISIBLE_DEVICES=3") || !has(lines, "env GPU_DEVICE_ORDINAL=1,3") {
				t.Errorf("variables renumbered for an unfiltered step: %q", lines)
			}
			got := spoolLines(t, spool)
			if len(got) != 1 {
				t.Fatalf("spool has %d lines, want 1: %q", len(got), got)
			}
			var rec struct {
				Time   string `json:"time"`
				JobID  uint32 `json:"job_id"`
				StepID string `json:"step_id"`
				UID    uint32 `json:"uid"`
				Node   string `json:"node"`
				Reason string `json:"reason"`
			}
			dec := json.NewDecoder(strings.NewReader(got[0]))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&rec); err != nil {
				t.Fatalf("spool line %q: %v", got[0], err)
			}
			host, _ := os.Hostname()
			if rec.JobID != 7 || rec.StepID != tt.name || rec.UID != 2001 || rec.Node != host ||
				rec.Reason != "connect: no such file or directory" {
				t.Errorf("spool record %+v", rec)
			}
			if _, err := time.Parse(time.RFC3339, rec.Time); err != nil {
				t.Errorf("spool time: %v", err)
			}
			assertMode(t, filepath.Dir(spool), 0o700)
			assertMode(t, spool, 0o600)
		})
	}
}

func count(lines []string, want string) int {
	n := 0
	for _, l := range lines {
		if l == want {
			n++
		}
	}
	return n
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

// A refusal is the agent's decision: failure=open does not override it.
func TestFailOpenStillRefuses(t *testing.T) {
	a := fakeagent.Start(t, func(*pb.Request) *pb.Response {
		return &pb.Response{Error: "job 7 has no prolog record on this node"}
	})
	spool := filepath.Join(t.TempDir(), "spool", "failopen.jsonl")
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket, "failure=open", "spool="+spool)
	if !has(lines, "rc task_init -1") ||
		!hasPrefix(lines, "error: gpufence: the gpufence agent refused: job 7 has no prolog record on this node; refusing") {
		t.Errorf("refusal under failure=open: %q", lines)
	}
	if hasPrefix(lines, "error: gpufence: agent unreachable") {
		t.Errorf("a refusal was reported as fail-open: %q", lines)
	}
	if _, err := os.Stat(filepath.Dir(spool)); !os.IsNotExist(err) {
		t.Errorf("spool folder for a refused step: %v", err)
	}
}

// golib=, which named the Go library of older versions, is ignored: a
// plugstack line that still has it loads, and the plugin writes the spool
// itself, in slurmstepd's process, starting no thread.
func TestFailOpenWritesSpoolItself(t *testing.T) {
	spool := filepath.Join(t.TempDir(), "failopen.jsonl")
	seq := []string{"init", "fork", "task_post_fork", "threads", "release", "exit"}
	lines := slurm(t, stepEnv(), "remote", seq, "socket="+fakeagent.AbsentSocket(t),
		"golib=/nonexistent/spank_gpufence_go.so", "failure=open", "spool="+spool)
	if !has(lines, "rc task_post_fork 0") || !has(lines, "rc task_init 0") || !has(lines, "threads 1") ||
		hasPrefix(lines, "error: gpufence: job 7 step 2: cannot record") {
		t.Errorf("failure=open with golib= set: %q", lines)
	}
	if got := spoolLines(t, spool); len(got) != 1 || !strings.Contains(got[0], `"job_id":7,"step_id":"2","uid":2001,`) {
		t.Errorf("spooled %q, want one line for job 7 step 2", got)
	}
}

// A spool that cannot be written does not stop the step; the log says so.
func TestFailOpenSpoolUnwritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	spool := filepath.Join(file, "failopen.jsonl")
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+fakeagent.AbsentSocket(t),
		"failure=open", "spool="+spool)
	if !has(lines, "rc task_init 0") ||
		!hasPrefix(lines, "error: gpufence: job 7 step 2: cannot record the step that runs WITHOUT GPU isolation in "+spool) {
		t.Errorf("unwritable spool: %q", lines)
	}
}

// failure=closed is the default and the same as saying it.
func TestFailClosedExplicit(t *testing.T) {
	spool := filepath.Join(t.TempDir(), "failopen.jsonl")
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+fakeagent.AbsentSocket(t),
		"failure=closed", "spool="+spool)
	if !has(lines, "rc task_init -1") || hasPrefix(lines, "error: gpufence: agent unreachable") {
		t.Errorf("failure=closed: %q", lines)
	}
	if got := spoolLines(t, spool); got != nil {
		t.Errorf("spooled %q", got)
	}
}

// The exchanges run inside slurmstepd and the prolog process: whatever the
// agent does, the plugin leaves no descriptor open behind it (each would
// also be inherited by nothing, CLOEXEC, but would stay for the process's
// life).
func TestExchangesLeaveNoDescriptor(t *testing.T) {
	answering := fakeagent.Start(t, func(*pb.Request) *pb.Response { return &pb.Response{Gpus: []uint32{1}} })
	refusing := fakeagent.Start(t, func(*pb.Request) *pb.Response { return &pb.Response{Error: "no"} })
	hangingUp := fakeagent.Start(t, func(*pb.Request) *pb.Response { return fakeagent.HangUp })
	silent := fakeagent.Start(t, func(*pb.Request) *pb.Response { return nil })
	for _, tt := range []struct {
		name, socket string
	}{
		{"answering", answering.Socket},
		{"refusing", refusing.Socket},
		{"hanging up (two tries)", hangingUp.Socket},
		{"silent (two tries, timeout)", silent.Socket},
		{"absent (two tries)", fakeagent.AbsentSocket(t)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for ctx, steps := range map[string][]string{
				"remote":     {"fds", "init", "fds"},
				"job_script": {"fds", "job_prolog", "job_epilog", "fds"},
			} {
				env := stepEnv()
				if ctx == "job_script" {
					env = []string{"FAKE_JOB_ID=9", "FAKE_UID=2001", "SLURM_JOB_GPUS=0,2"}
				}
				lines := slurm(t, env, ctx, steps, "socket="+tt.socket, "timeout=1")
				var fds []string
				for _, l := range lines {
					if strings.HasPrefix(l, "fds ") {
						fds = append(fds, l)
					}
				}
				if len(fds) != 2 || fds[0] != fds[1] || fds[0] == "fds -1" {
					t.Errorf("%s: descriptors before and after the exchanges: %q (all: %q)", ctx, fds, lines)
				}
			}
		})
	}
}
