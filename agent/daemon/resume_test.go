// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// TestPrivilegedAuditBooksAcrossRestart: denied opens of a step before,
// between and after two agents on the same pins are all in the audit
// trail (records + suppressed), none twice: what the kernel counted while
// no agent ran is reported by the next one.
func TestPrivilegedAuditBooksAcrossRestart(t *testing.T) {
	tr := newTree(t)
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
		t.Skipf("cannot mount a bpffs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(bpffs, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs %s: %v", bpffs, err)
		}
	})
	cfg := config.Default()
	cfg.SlurmdGPUTable = config.SlurmdGPUTableOff
	cfg.SlurmConf = filepath.Join(tr.gres, "slurm.conf")
	cfg.Scope = tr.scope
	cfg.PinDir = filepath.Join(bpffs, "gpufence")
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	cfg.FailOpenSpool = ""
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func() *Daemon {
		t.Helper()
		d, err := New(cfg, log, NewKernelFilter(devfilter.Options{Mode: devfilter.ModeAuto, NvidiaMajor: 195, Logger: log,
			AuditAllowed: devfilter.AuditAllowedNone, PinDir: cfg.PinDir}), 195, tr.rec)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	task := tr.mkdir("job_1/step_0/user/task_0")
	stepd := tr.sleeper(tr.mkdir("job_1/step_0/slurm"))
	deny := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if got := tr.openNames(task, "nvidia1")["nvidia1"]; got != "EPERM" {
				t.Fatalf("nvidia1 = %s, want EPERM", got)
			}
		}
	}

	a := start()
	if r := call(a, 0, &pb.JobProlog{JobId: 1, Uid: 1000, JobGpus: ptr("0")}); r.Error != "" {
		t.Fatal(r.Error)
	}
	if r := call(a, stepd, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("0")}); r.Error != "" {
		t.Fatal(r.Error)
	}
	deny(12) // over the rate burst (5 a second): most are counted, not events
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	counts := filepath.Join(filepath.Dir(cfg.StateFile), "audit-counts.json")
	if _, err := os.Stat(counts); err != nil {
		t.Fatalf("the stopping agent left no counts: %v", err)
	}
	deny(9) // no agent: the pinned program denies and counts
	b := start()
	if _, err := os.Stat(counts); !os.IsNotExist(err) {
		t.Errorf("the next agent left %s (a crash after it would report its counts twice): %v", counts, err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	var accounted uint64
	for _, ev := range []audit.Event{audit.EventGPUAccess, audit.EventAccessSuppressed} {
		for _, r := range tr.rec.Records(ev) {
			if r.Device == nil || r.Device.Minor != 1 || r.JobID != 1 || r.Decision != "denied" {
				continue
			}
			accounted += r.Suppressed
			if ev == audit.EventGPUAccess {
				accounted++
			}
		}
	}
	if accounted != 21 || tr.rec.Lost() != 0 {
		t.Errorf("denied opens of nvidia1 in the audit trail: %d (lost %d), want 21 (12 with the first agent, 9 with none)", accounted, tr.rec.Lost())
	}
}
