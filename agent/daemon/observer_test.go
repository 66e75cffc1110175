// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// lastAllocations keeps what the registry published last.
type lastAllocations struct {
	mu    sync.Mutex
	calls int
	last  []registry.Job
	d     *Daemon
}

func (l *lastAllocations) observe(jobs []registry.Job) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	l.last = jobs
}

// summary is one line per job and GPU of a usable trusted list.
func (l *lastAllocations) summary() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, j := range l.last {
		if j.Broken != "" || j.NoProlog {
			continue
		}
		for _, idx := range j.GPUs {
			g, _ := l.d.table.GPU(idx)
			out = append(out, fmtAlloc(j.ID, j.UID, g.Index, g.Minor))
		}
	}
	return out
}

func fmtAlloc(job, uid uint32, idx int, minor uint32) string {
	return fmt.Sprintf("job %d uid %d gpu %d minor %d", job, uid, idx, minor)
}

// TestPrivilegedObserverFollowsJobs: the observer (metrics, dcgm job
// mapping) sees each job's trusted GPUs from its prolog to its epilog, never
// a CPU-only job's, and a restarted daemon hands it the restored jobs.
func TestPrivilegedObserverFollowsJobs(t *testing.T) {
	tr := newTree(t)
	mode, _ := devfilter.Probe()
	cfg := config.Default()
	cfg.SlurmdGPUTable = config.SlurmdGPUTableOff // gres.conf alone: slurmd_test.go runs slurmd -G
	cfg.SlurmConf = filepath.Join(tr.gres, "slurm.conf")
	cfg.Scope = tr.scope
	cfg.PinDir = ""
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	cfg.FailOpenSpool = ""
	cfg.RecoverFromSlurmctld = false
	start := func() *Daemon {
		d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), NewKernelFilter(devfilter.Options{Mode: mode, NvidiaMajor: 195, AuditAllowed: devfilter.AuditAllowedNone}), 195, tr.rec)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := start()
	obs := &lastAllocations{d: d}
	d.reg.SetObserver(obs.observe)
	if obs.calls != 1 || len(obs.summary()) != 0 {
		t.Fatalf("at SetObserver: %d calls, %v", obs.calls, obs.summary())
	}
	call(d, 0, &pb.JobProlog{JobId: 7, Uid: 1001, JobGpus: ptr("1,3")})
	call(d, 0, &pb.JobProlog{JobId: 8, Uid: 1002})
	want := []string{fmtAlloc(7, 1001, 1, 1), fmtAlloc(7, 1001, 3, 3)}
	if got := obs.summary(); !slices.Equal(got, want) {
		t.Errorf("after the prologs: %v, want %v (job 8 is CPU-only)", got, want)
	}
	if c := d.Counts(); c.Jobs != 2 || c.Steps != 0 || !c.FilterAttached || c.Exempt != 2 {
		t.Errorf("counts %+v", c)
	}
	d.Close()

	d = start()
	defer d.Close()
	again := &lastAllocations{d: d}
	d.reg.SetObserver(again.observe)
	if got := again.summary(); !slices.Equal(got, want) {
		t.Errorf("restored: %v, want %v", got, want)
	}
	call(d, 0, &pb.JobEpilog{JobId: 7})
	if got := again.summary(); len(got) != 0 {
		t.Errorf("after job 7's epilog: %v", got)
	}
}
