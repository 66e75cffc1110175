// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/verify"
)

// verifyRun runs `gpufence verify` against the suite's agent, with its
// configuration file, and returns its report (--json), exit status and
// wall time, process start included.
func (st *suite) verifyRun(t *testing.T, args ...string) (verify.Report, int, time.Duration) {
	t.Helper()
	cfg := filepath.Join(st.c.Root(), "etc", fmt.Sprintf("agent-%d.yaml", st.starts))
	cmd := exec.CommandContext(st.ctx, st.gpufence, append([]string{"verify", "--json", "--config", cfg, "--socket", st.sock, "--scope", st.c.ScopeDir()}, args...)...)
	start := time.Now()
	out, err := cmd.Output()
	took := time.Since(start)
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var r verify.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("gpufence verify --json (exit %d): %v\n%s", code, err, out)
	}
	for _, c := range r.Checks {
		t.Logf("  ok=%v skipped=%v %s: %s", c.OK, c.Skipped, c.Name, c.Detail)
	}
	t.Logf("gpufence verify: exit %d, failed %q, %d µs inside, %v wall", code, r.Failed, r.TookUS, took.Round(100*time.Microsecond))
	return r, code, took
}

// leftovers is what a self-test must leave as it found it: the filter's
// entries on the scope and the scope's children.
func (st *suite) leftovers(t *testing.T) (int, []string) {
	t.Helper()
	n, err := policyEntries(st.c.ScopeDir())
	if err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(st.c.ScopeDir())
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range ents {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	return n, dirs
}

func verifyRecords(t *testing.T, st *suite) []audit.Record {
	var out []audit.Record
	for _, r := range readAudit(t, st.auditFiles[len(st.auditFiles)-1]) {
		if r.Event == audit.EventVerify {
			out = append(out, r)
		}
	}
	return out
}

// TestPrivilegedVerifyE2E: `gpufence verify` against the suite's agent and
// Slurm's real scope passes on the healthy node, leaves nothing behind and
// is audited; with the agent's filter detached from the scope it exits 1
// naming the check, and passes again once the agent re-attached.
func TestPrivilegedVerifyE2E(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	entries, dirs := st.leftovers(t)
	nrec := len(verifyRecords(t, st))

	var times []time.Duration
	for i := 0; i < 5; i++ {
		r, code, took := st.verifyRun(t)
		times = append(times, took)
		if code != 0 || !r.OK || r.Mode != "scope" || r.GPU == nil || *r.GPU != 0 {
			t.Fatalf("healthy node: exit %d, %+v", code, r)
		}
		for _, id := range []string{"agent", "filter", "enforcing", "gpu0", "gpu1", "gpu2", "gpu3", "unregistered", "entry", "cleanup"} {
			if !slices.ContainsFunc(r.Checks, func(c verify.Check) bool { return c.ID == id && c.OK }) {
				t.Errorf("check %s missing or failed", id)
			}
		}
	}
	slices.Sort(times)
	t.Logf("gpufence verify wall time over 5 runs: min %v, median %v, max %v", times[0], times[2], times[4])
	if n, d := st.leftovers(t); n != entries || !slices.Equal(d, dirs) {
		t.Errorf("left behind: %d entries %v, before %d %v", n, d, entries, dirs)
	}
	recs := verifyRecords(t, st)
	if len(recs) != nrec+5 {
		t.Fatalf("%d verify records, want %d", len(recs), nrec+5)
	}
	if r := recs[len(recs)-1]; r.Severity != audit.SeverityInfo || !slices.Equal(r.GPUs, []int{0}) || r.CgroupID == 0 || !strings.Contains(r.Cgroup, "gpufence-verify-") {
		t.Errorf("verify record %+v", r)
	}

	// Text output names the result on its last line.
	cfg := filepath.Join(st.c.Root(), "etc", fmt.Sprintf("agent-%d.yaml", st.starts))
	out, err := exec.Command(st.gpufence, "verify", "--config", cfg, "--socket", st.sock, "--scope", st.c.ScopeDir(), "--gpu", "3").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok   GPU 3 opened in its own cgroup") || !strings.Contains(string(out), "gpufence verify: passed in") {
		t.Errorf("gpufence verify --gpu 3: %v\n%s", err, out)
	}
	if r, code, _ := st.verifyRun(t, "--gpu", "7"); code != 1 || r.OK || len(r.Failed) != 1 || r.Failed[0] != "agent refused the verify cgroup" {
		t.Errorf("--gpu 7 (not in the table): exit %d, failed %q", code, r.Failed)
	}
	if out, err := exec.Command(st.gpufence, "verify", "extra").CombinedOutput(); exitCode(err) != 2 {
		t.Errorf("gpufence verify extra: %v, want exit 2\n%s", err, out)
	}
	if r, code, _ := st.verifyRun(t, "--socket", filepath.Join(st.c.Root(), "run", "no-agent.sock")); code != 1 || !slices.Equal(r.Failed, []string{"agent unreachable"}) {
		t.Errorf("no agent: exit %d, failed %q", code, r.Failed)
	}

	// The filter detached from Slurm's scope; the agent re-attaches at
	// its next reconcile (2 s), so a self-test in between must fail.
	failedOnce := false
	for try := 0; try < 5 && !failedOnce; try++ {
		detachScopeLink(t, st.c.ScopeDir())
		r, code, _ := st.verifyRun(t)
		if r.OK {
			t.Logf("try %d: the agent re-attached before the self-test ran", try)
			continue
		}
		failedOnce = true
		if code != 1 || !slices.Contains(r.Failed, "filter not attached to the live scope") || !slices.Contains(r.Failed, "GPU 1 opened though not given") {
			t.Errorf("filter detached: exit %d, failed %q", code, r.Failed)
		}
		recs := verifyRecords(t, st)
		if last := recs[len(recs)-1]; last.Severity != audit.SeverityError || !strings.Contains(last.Error, "GPU 1 opened though not given") {
			t.Errorf("verify record of the failed self-test: %+v", last)
		}
	}
	if !failedOnce {
		t.Fatal("gpufence verify never failed with the filter detached")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, code, _ := st.verifyRun(t)
		if code == 0 && r.OK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gpufence verify still fails 20 s after the filter was detached: %q", r.Failed)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if n, d := st.leftovers(t); n != entries || !slices.Equal(d, dirs) {
		t.Errorf("left behind after the detached runs: %d entries %v, before %d %v", n, d, entries, dirs)
	}
	rep, r := st.srun(t, nil, "--gres=gpu:1")
	mustOK(t, r)
	st.expectGPUs(t, rep, st.allocatedOf(t, rep))
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// detachScopeLink detaches the device filter's link on the suite's scope
// (found by the scope's cgroup id among the kernel's links), as a stray
// bpftool or an unrelated tool might.
func detachScopeLink(t *testing.T, scope string) {
	t.Helper()
	id, err := jobcgroup.ID(scope)
	if err != nil {
		t.Fatal(err)
	}
	it := new(link.Iterator)
	found := 0
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil || info.Type != link.CgroupType {
			continue
		}
		if c := info.Cgroup(); c != nil && c.CgroupId == id && ebpf.AttachType(c.AttachType) == ebpf.AttachCGroupDevice {
			if err := it.Link.Detach(); err != nil {
				t.Fatal(err)
			}
			found++
		}
	}
	if err := it.Err(); err != nil || found != 1 {
		t.Fatalf("detach the scope's device filter link: %d found, %v", found, err)
	}
}
