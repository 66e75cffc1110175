package daemon

import (
	"errors"
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
	"github.com/gpufence/gpufence/agent/config"
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

// TestAccessRecordEscapes: a comm the process set to an ESC sequence is
// recorded escaped, in comm and in the message, and unescapes to what the
// kernel reported.
func TestAccessRecordEscapes(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{"slurm.conf": "TaskPlugin=task/cgroup\n", "gres.conf": "Name=gpu File=/nonexistent/nvidia[0-1]\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := config.Default()
	cfg.SlurmConf = filepath.Join(dir, "slurm.conf")
	cfg.Scope = "/sys/fs/cgroup/none-such-scope"
	cfg.PinDir, cfg.StateFile, cfg.FailOpenSpool = "", "", ""
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(string) (Filter, error) {
		return nil, errors.New("no filter in this test")
	}, 195, nil)
	if err != nil {
		t.Fatal(err)
	}
	const comm = "\x1b[2J\x1b]0;x\x07\u009b"
	r := d.accessRecord(devfilter.Event{Major: 195, Minor: 1, Decision: devfilter.DecisionDenied, Comm: comm}, owner{}, false, 0)
	if back, err := audit.Unescape(r.Comm); err != nil || back != comm {
		t.Errorf("record comm %q unescapes to %q, %v; want %q", r.Comm, back, err, comm)
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

// countsFilter is a Filter that only reports the kernel's counters.
type countsFilter struct {
	Filter // nil: any other method panics
	supp   map[devfilter.RateKey]uint64
	lost   uint64
	full   map[devfilter.Decision]uint64
}

func (f *countsFilter) Suppressed() (map[devfilter.RateKey]uint64, error) { return f.supp, nil }
func (f *countsFilter) Lost() (uint64, error)                             { return f.lost, nil }
func (f *countsFilter) RateFull() (map[devfilter.Decision]uint64, error)  { return f.full, nil }

// TestFlushReportsRateFull: what the kernel counted over a full rate table
// reaches the recorder once, as deltas by decision, on the path that never
// drops (not as a record the full queue could drop).
func TestFlushReportsRateFull(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{"slurm.conf": "TaskPlugin=task/cgroup\n", "gres.conf": "Name=gpu File=/nonexistent/nvidia[0-1]\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := config.Default()
	cfg.SlurmConf = filepath.Join(dir, "slurm.conf")
	cfg.Scope = "/sys/fs/cgroup/none-such-scope"
	cfg.PinDir, cfg.StateFile, cfg.FailOpenSpool = "", "", ""
	rec := &memRecorder{}
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(string) (Filter, error) {
		return nil, errors.New("no filter in this test")
	}, 195, rec)
	if err != nil {
		t.Fatal(err)
	}
	f := &countsFilter{full: map[devfilter.Decision]uint64{devfilter.DecisionDenied: 100, devfilter.DecisionAllowed: 3}, lost: 2}
	d.flushAudit(f)
	f.full[devfilter.DecisionDenied] = 150
	f.full[devfilter.DecisionWouldDeny] = 4
	d.flushAudit(f)
	d.flushAudit(f)
	if rec.rateFull != 100+3+50+4 || rec.lost != 2 {
		t.Errorf("recorder got rate_full %d and lost %d, want 157 and 2", rec.rateFull, rec.lost)
	}
	if n := len(rec.records(audit.EventAccessSuppressed)); n != 0 {
		t.Errorf("%d access_suppressed records, want none (no key had a count)", n)
	}
}
