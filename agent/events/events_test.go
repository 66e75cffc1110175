// SPDX-License-Identifier: Apache-2.0

package events

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// startSleep runs sleep and returns its pid and resolved path; the test
// stops it.
func startSleep(t *testing.T) (*exec.Cmd, string) {
	t.Helper()
	path, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("skipping: no sleep in PATH: %v", err)
	}
	if path, err = filepath.EvalSymlinks(path); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// Until exec is done, /proc/<pid>/exe is the test binary.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if exe, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "exe")); exe == path {
			return cmd, path
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleep (pid %d) did not start", cmd.Process.Pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCheckExe drives checkExe against real processes: /proc/<pid>/exe is
// only called the program of the access when it is the same file in the
// same process.
func TestCheckExe(t *testing.T) {
	cmd, path := startSleep(t)
	pid := uint32(cmd.Process.Pid)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	ticks, ok := procStart(filepath.Join("/proc", strconv.Itoa(int(pid))))
	if !ok {
		t.Fatal("no start time of the child")
	}
	id := devfilter.ExeID{Ino: st.Ino, Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev)}
	start := time.Duration(ticks) * (time.Second / userHZ)
	other := id
	other.Ino++
	for _, tc := range []struct {
		name string
		ev   devfilter.Event
		want exeCheck
	}{
		{"same file, same process", devfilter.Event{TGID: pid, Exe: id, Start: start}, exeCheck{exe: path, status: audit.ExeVerified}},
		{"start unknown", devfilter.Event{TGID: pid, Exe: id}, exeCheck{exe: path, status: audit.ExeVerified}},
		{"another file: exec'd since", devfilter.Event{TGID: pid, Exe: other, Start: start}, exeCheck{now: path, status: audit.ExeChanged}},
		{"another process with that pid", devfilter.Event{TGID: pid, Exe: id, Start: start + time.Second}, exeCheck{status: audit.ExeExited}},
		{"no identity from the kernel", devfilter.Event{TGID: pid, Start: start}, exeCheck{now: path, status: audit.ExeUnverified}},
	} {
		if got := checkExe("/proc", tc.ev); got != tc.want {
			t.Errorf("%s: checkExe = %+v, want %+v", tc.name, got, tc.want)
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	if got := checkExe("/proc", devfilter.Event{TGID: pid, Exe: id, Start: start}); got.status != audit.ExeExited || got.exe != "" || got.now != "" {
		t.Errorf("after the process exited: checkExe = %+v, want exited with no path", got)
	}
}

type noTable struct{}

func (noTable) Of(uint32, uint32, []int) (devices.GPU, string, bool) { return devices.GPU{}, "", false }
func (noTable) UUID(int) (string, bool)                              { return "", false }

func newStage(rec *audittest.Recorder) *Events {
	return New(Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Recorder: rec,
		Owners: registry.New(nil, slog.New(slog.NewTextHandler(io.Discard, nil))), Table: noTable{}, Users: &users.Cache{}})
}

// TestAccessRecordEscapes: a comm the process set to an ESC sequence is
// recorded escaped, in comm and in the message, and unescapes to what the
// kernel reported.
func TestAccessRecordEscapes(t *testing.T) {
	e := newStage(&audittest.Recorder{})
	defer e.Close()
	const comm = "\x1b[2J\x1b]0;x\x07\u009b"
	r := e.accessRecord(devfilter.Event{Major: 195, Minor: 1, Decision: devfilter.DecisionDenied, Comm: comm}, registry.Owner{}, false, 0)
	if want := audit.Escape(comm); r.Comm != want {
		t.Errorf("record comm %q, want %q (audit.Escape of what the kernel reported)", r.Comm, want)
	}
	for what, s := range map[string]string{"comm": r.Comm, "message": r.Message} {
		if strings.ContainsAny(s, "\x1b\x07\u009b") {
			t.Errorf("record %s %q holds a control character", what, s)
		}
	}
	if !strings.Contains(r.Message, audit.Escape(comm)) {
		t.Errorf("message %q does not name the escaped comm %q", r.Message, audit.Escape(comm))
	}
}

// countsFilter only reports the kernel's counters.
type countsFilter struct {
	supp map[devfilter.RateKey]uint64
	lost uint64
	full map[devfilter.Decision]uint64
}

func (f *countsFilter) Suppressed() (map[devfilter.RateKey]uint64, error) { return f.supp, nil }
func (f *countsFilter) Lost() (uint64, error)                             { return f.lost, nil }
func (f *countsFilter) RateFull() (map[devfilter.Decision]uint64, error)  { return f.full, nil }
func (f *countsFilter) ForgetRate(uint64) error                           { return nil }

// TestFlushReportsRateFull: what the kernel counted over a full rate table
// reaches the recorder once, as deltas by decision, on the path that never
// drops (not as a record the full queue could drop).
func TestFlushReportsRateFull(t *testing.T) {
	rec := &audittest.Recorder{}
	e := newStage(rec)
	defer e.Close()
	f := &countsFilter{full: map[devfilter.Decision]uint64{devfilter.DecisionDenied: 100, devfilter.DecisionAllowed: 3}, lost: 2}
	e.Flush(f)
	f.full[devfilter.DecisionDenied] = 150
	f.full[devfilter.DecisionWouldDeny] = 4
	e.Flush(f)
	e.Flush(f)
	if rec.RateFull() != 100+3+50+4 || rec.Lost() != 2 {
		t.Errorf("recorder got rate_full %d and lost %d, want 157 and 2", rec.RateFull(), rec.Lost())
	}
	if n := len(rec.Records(audit.EventAccessSuppressed)); n != 0 {
		t.Errorf("%d access_suppressed records, want none (no key had a count)", n)
	}
}

// An adopted filter's counters were reported by the agent before: they
// are the baseline, never reported again.
func TestAdoptedCountersBaseline(t *testing.T) {
	rec := &audittest.Recorder{}
	e := newStage(rec)
	defer e.Close()
	key := devfilter.RateKey{CgroupID: 7, Major: 195, Minor: 1, Decision: devfilter.DecisionDenied}
	f := &countsFilter{supp: map[devfilter.RateKey]uint64{key: 40}, lost: 5, full: map[devfilter.Decision]uint64{devfilter.DecisionDenied: 9}}
	e.Read(closedSource{}, f, true)
	e.Flush(f)
	if rec.Lost() != 0 || rec.RateFull() != 0 || len(rec.Records(audit.EventAccessSuppressed)) != 0 {
		t.Fatalf("adopted totals reported again: lost %d, rate_full %d, %d summaries", rec.Lost(), rec.RateFull(), len(rec.Records(audit.EventAccessSuppressed)))
	}
	f.supp[key], f.lost, f.full[devfilter.DecisionDenied] = 43, 6, 10
	e.Flush(f)
	s := rec.Records(audit.EventAccessSuppressed)
	if rec.Lost() != 1 || rec.RateFull() != 1 || len(s) != 1 || s[0].Suppressed != 3 {
		t.Errorf("after the baseline: lost %d, rate_full %d, summaries %+v; want 1, 1 and one of 3", rec.Lost(), rec.RateFull(), s)
	}
}

type closedSource struct{}

func (closedSource) ReadEvent() (devfilter.Event, error) {
	return devfilter.Event{}, devfilter.ErrClosed
}
