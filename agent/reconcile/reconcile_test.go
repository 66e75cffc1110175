// SPDX-License-Identifier: Apache-2.0

package reconcile

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/cgwatch"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/enforcer"
	"github.com/gpufence/gpufence/agent/failopen"
	"github.com/gpufence/gpufence/agent/fakenode"
	"github.com/gpufence/gpufence/agent/handler"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/recovery"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

var (
	_ Cgroups = (*fakenode.Node)(nil)
	_ Cgroups = jobcgroup.Node{}
	_ Watcher = (*cgwatch.Watcher)(nil)
)

const (
	mount = "/sys/fs/cgroup"
	scope = mount + "/system.slice/n1_slurmstepd.scope"
)

type noTable struct{}

func (noTable) Devices(gpus []int) (policy.DeviceSet, error) {
	var s policy.DeviceSet
	for _, g := range gpus {
		s.GPUMinors = append(s.GPUMinors, uint32(g))
	}
	return s, nil
}
func (noTable) Unknown([]int) (int, bool)        { return 0, false }
func (noTable) Untrusted() string                { return "" }
func (noTable) GPUs() []devices.GPU              { return nil }
func (noTable) ShareGPU(string, int) (int, bool) { return 0, false }

// ctld says each job's state; jobs it lacks are unknown.
type ctld struct {
	mu    sync.Mutex
	state map[uint32]string
	err   error
	asked []uint32
}

func (c *ctld) Job(_ context.Context, id uint32) (slurm.ControllerJob, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, id)
	if c.err != nil {
		return slurm.ControllerJob{}, c.err
	}
	st, ok := c.state[id]
	if !ok {
		return slurm.ControllerJob{}, slurm.ErrJobUnknown
	}
	return slurm.ControllerJob{ID: id, State: st, OnNode: true}, nil
}

type watch struct {
	gone chan uint64
	made chan string
}

func (w watch) Gone() <-chan uint64 { return w.gone }
func (w watch) Made() <-chan string { return w.made }

type env struct {
	n    *fakenode.Node
	f    *fakenode.Filter
	reg  *registry.Registry
	enf  *enforcer.Enforcer
	h    *handler.Handler
	rc   *Reconciler
	ctld *ctld
	rec  *audittest.Recorder
	logs *bytes.Buffer
}

func newEnv(t *testing.T) *env {
	v := &env{n: fakenode.New(mount), ctld: &ctld{state: map[uint32]string{}}, rec: &audittest.Recorder{}, logs: &bytes.Buffer{}}
	log := slog.New(slog.NewTextHandler(v.logs, nil))
	v.n.Mkdir(scope)
	v.n.SetScope(scope, nil)
	v.reg = registry.New(nil, log)
	v.enf = enforcer.New(enforcer.Options{Log: log, Mount: mount, Registry: v.reg, Recorder: v.rec, Cgroups: v.n, Pins: &fakenode.Pins{},
		NewFilter: func(sc string, prepare func(enforcer.Filter) error) (enforcer.Filter, error) {
			v.f = fakenode.NewFilter(devfilter.ModeScope, v.n, sc)
			return v.f, prepare(v.f)
		}})
	if err := v.enf.Ensure(scope); err != nil {
		t.Fatal(err)
	}
	rcv := &recovery.Recovery{Source: v.ctld, Table: noTable{}, Node: "n1"}
	v.h = &handler.Handler{Log: log, Mount: mount, Registry: v.reg, Enforcer: v.enf, Table: noTable{}, Recorder: v.rec,
		Users: &users.Cache{}, Cgroups: v.n, Recovery: rcv}
	v.rc = &Reconciler{Log: log, Registry: v.reg, Enforcer: v.enf, Handler: v.h, Recovery: rcv, Cgroups: v.n,
		Spool: &failopen.Spool{Path: filepath.Join(t.TempDir(), "spool"), Log: log, Recorder: v.rec, Users: &users.Cache{}}}
	return v
}

// step registers job.step on a new cgroup with an entry, as a StepStart
// would.
func (v *env) step(job, step uint32) cgroup.Cgroup {
	d := filepath.Join(scope, fmt.Sprintf("job_%d/step_%d", job, step))
	cg := cgroup.Cgroup{ID: v.n.Mkdir(d), Path: d}
	v.reg.AddStep(registry.Step{JobID: job, StepID: step, UID: 1000, Cgroup: cg, GPUs: []int{1}}, filepath.Dir(d))
	v.enf.Set(cg, devfilter.Policy{GPUMinors: []uint32{1}})
	return cg
}

// A pass releases each step whose cgroup is gone, or made again at the same
// path (another cgroup now, not the step's), and leaves the rest.
func TestPassReleasesVanishedSteps(t *testing.T) {
	v := newEnv(t)
	live, gone, remade := v.step(1, 0), v.step(1, 1), v.step(2, 0)
	v.n.Rmdir(gone.Path)
	v.n.Recreate(remade.Path)
	v.rc.Pass()
	for _, tc := range []struct {
		cg   cgroup.Cgroup
		kept bool
	}{{live, true}, {gone, false}, {remade, false}} {
		if _, ok := v.f.Entry(tc.cg.ID); ok != tc.kept {
			t.Errorf("%s: entry kept %v, want %v", tc.cg.Path, ok, tc.kept)
		}
		if v.reg.Owned(tc.cg.ID) != tc.kept {
			t.Errorf("%s: record kept %v, want %v", tc.cg.Path, !tc.kept, tc.kept)
		}
	}
	if got := v.rec.Records(audit.EventPolicyReleased); len(got) != 2 || got[0].Reason != "step cgroup vanished" {
		t.Errorf("release audits %+v", got)
	}
}

// A job with no step left is dropped only on slurmctld's word that it
// ended; while it runs (a user can end every step of their own job, the
// extern step included) it is kept and asked about less and less often.
func TestDropEnded(t *testing.T) {
	v := newEnv(t)
	v.ctld.state[2], v.ctld.state[3] = "RUNNING", "RUNNING"
	now := time.Now()
	for _, id := range []uint32{1, 2, 3, 4} {
		cg := v.step(id, 0)
		v.reg.RemoveCgroup(cg.ID)
		v.n.Rmdir(filepath.Dir(cg.Path)) // the job's cgroup is gone
	}
	v.reg.Prolog(registry.Job{ID: 5, UID: 1000, Created: now}) // no step yet, no dir
	v.reg.SetCheck(4, now.Add(time.Hour), time.Minute)         // not due
	v.rc.dropEnded(now)
	if _, ok := v.reg.Job(1); ok {
		t.Error("a job slurmctld no longer knows is kept")
	}
	j2, ok := v.reg.Job(2)
	if !ok || j2.CheckEvery != EndCheckFirst {
		t.Fatalf("running job: %+v %v", j2, ok)
	}
	if _, ok := v.reg.Job(4); !ok {
		t.Error("a job not due was dropped")
	}
	if _, ok := v.reg.Job(5); !ok {
		t.Error("a fresh prolog with no step was dropped")
	}
	if strings.Contains(fmt.Sprint(v.ctld.asked), "4") || strings.Contains(fmt.Sprint(v.ctld.asked), "5") {
		t.Errorf("asked about jobs not due: %v", v.ctld.asked)
	}
	// Asked again: the interval doubles, up to EndCheckMax.
	v.reg.SetCheck(2, time.Time{}, 10*time.Minute)
	v.rc.dropEnded(now)
	if j, _ := v.reg.Job(2); j.CheckEvery != EndCheckMax {
		t.Errorf("interval %v, want %v", j.CheckEvery, EndCheckMax)
	}
	// slurmctld cannot say: kept, and said so.
	delete(v.ctld.state, 3)
	v.ctld.err = &slurm.UnreachableError{Msg: "down"}
	v.reg.SetCheck(3, time.Time{}, 0)
	v.rc.dropEnded(now)
	if _, ok := v.reg.Job(3); !ok {
		t.Error("a job was dropped while slurmctld could not be asked")
	}
	if !strings.Contains(v.logs.String(), "could not say whether it ended") {
		t.Error("the outage is not logged")
	}
	// A record restored with no dir is asked about once EndCheckFirst passed.
	v.ctld.err = nil
	v.reg.Restore([]registry.Job{{ID: 6, Created: now.Add(-EndCheckFirst - time.Second)}}, nil)
	v.rc.dropEnded(now)
	if _, ok := v.reg.Job(6); ok {
		t.Error("an old restored record slurmctld does not know is kept")
	}
	v.rc.Recovery = nil
	v.rc.dropEnded(now) // without slurmctld: records go at their epilog only
}

// Run releases a step the watcher reports gone at once, refreshes slurmd's
// cgroup when told it was made, passes on the ticker, and stops with ctx.
func TestRun(t *testing.T) {
	v := newEnv(t)
	w := watch{gone: make(chan uint64), made: make(chan string)}
	v.rc.Watcher = w
	cg := v.step(1, 0)
	// The attach's own refresh of slurmd's cgroup runs in the background:
	// counted before Run starts.
	for deadline := time.Now().Add(5 * time.Second); v.n.Finds() < 1 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	base := v.n.Finds()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { v.rc.Run(ctx, time.Hour); close(done) }()
	w.gone <- cg.ID
	w.made <- "/run/slurmd.pid"
	close(w.gone)
	close(w.made)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop with its context")
	}
	if _, ok := v.f.Entry(cg.ID); ok {
		t.Error("the step the watcher reported gone keeps its entry")
	}
	if got := v.rec.Records(audit.EventPolicyReleased); len(got) != 1 || got[0].Reason != "step cgroup removed" {
		t.Errorf("release audits %+v", got)
	}
	if v.n.Finds() <= base {
		t.Errorf("slurmd's cgroup not refreshed (%d scope finds, %d before Run)", v.n.Finds(), base)
	}
	// The periodic pass alone, with no watcher.
	v2 := newEnv(t)
	cg2 := v2.step(1, 0)
	v2.n.Rmdir(cg2.Path)
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan struct{})
	go func() { v2.rc.Run(ctx2, time.Millisecond); close(done2) }()
	deadline := time.Now().Add(5 * time.Second)
	for v2.reg.Owned(cg2.ID) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel2()
	<-done2
	if v2.reg.Owned(cg2.ID) {
		t.Error("the periodic pass did not release a vanished step")
	}
}

// kicks counts the GPU table's late asks, by whether slurmd was seen up.
type kicks struct {
	mu     sync.Mutex
	up, on int
}

func (k *kicks) Kick(up bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if up {
		k.up++
	} else {
		k.on++
	}
}

// A table made without slurmd's answer is asked for at each pass, and at
// once (slurmd is up) when slurmd's pid file is written.
func TestTableKicked(t *testing.T) {
	v := newEnv(t)
	k := &kicks{}
	v.rc.Table = k
	v.rc.Pass()
	w := watch{gone: make(chan uint64), made: make(chan string)}
	v.rc.Watcher = w
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { v.rc.Run(ctx, time.Hour); close(done) }()
	w.made <- "/run/slurmd.pid"
	w.made <- "/run/slurmd.pid" // sync: the first was handled
	cancel()
	<-done
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.on != 1 || k.up < 1 {
		t.Errorf("kicks: %d at passes (want 1), %d for slurmd up (want ≥ 1)", k.on, k.up)
	}
}
