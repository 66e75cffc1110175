// SPDX-License-Identifier: Apache-2.0

package handler

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/enforcer"
	"github.com/gpufence/gpufence/agent/fakenode"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/recovery"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

var (
	_ Cgroups    = (*fakenode.Node)(nil)
	_ Cgroups    = jobcgroup.Node{}
	_ Settings   = (*SettingsFile)(nil)
	_ IMEXReader = imexIn{}
)

const (
	mount = "/sys/fs/cgroup"
	scope = mount + "/system.slice/n1_slurmstepd.scope"
)

// table is a GPU table of GPUs 0..3, /dev/nvidia<i> with minor 10+i (the
// index and the minor differ, so a test that mixes them up fails).
type table struct{ untrusted string }

func (t table) Devices(gpus []int) (policy.DeviceSet, error) {
	var s policy.DeviceSet
	for _, g := range gpus {
		if g < 0 || g > 3 {
			return s, fmt.Errorf("GPU %d is not in the table", g)
		}
		s.GPUMinors = append(s.GPUMinors, uint32(10+g))
	}
	return s, nil
}

func (t table) Unknown(gpus []int) (int, bool) {
	for _, g := range gpus {
		if g < 0 || g > 3 {
			return g, true
		}
	}
	return 0, false
}

func (t table) Untrusted() string { return t.untrusted }

// ShareGPU: the table has no shard or mps devices.
func (t table) ShareGPU(string, int) (int, bool) { return 0, false }

func (t table) GPUs() []devices.GPU {
	var out []devices.GPU
	for i := range 4 {
		out = append(out, devices.GPU{GPU: slurm.GPU{Index: i, Path: fmt.Sprintf("/dev/nvidia%d", i)}, Major: 195, Minor: uint32(10 + i)})
	}
	return out
}

func minors(gpus ...int) []uint32 {
	var out []uint32
	for _, g := range gpus {
		out = append(out, uint32(10+g))
	}
	return out
}

type settings struct{ s slurm.Settings }

func (s settings) Get() (slurm.Settings, error) { return s.s, nil }

type watcher struct {
	mu    sync.Mutex
	added map[uint64]string
}

func (w *watcher) Add(dir string, id uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.added == nil {
		w.added = map[uint64]string{}
	}
	w.added[id] = dir
	return nil
}

type imexIn struct {
	ch  []uint32
	err error
}

func (i imexIn) Read(int, uint32) ([]uint32, error) { return i.ch, i.err }

// ctld is slurmctld as recovery asks it.
type ctld struct {
	mu   sync.Mutex
	jobs map[uint32]slurm.ControllerJob
	err  error
	n    int
}

func (c *ctld) Job(_ context.Context, id uint32) (slurm.ControllerJob, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.err != nil {
		return slurm.ControllerJob{}, c.err
	}
	j, ok := c.jobs[id]
	if !ok {
		return slurm.ControllerJob{}, slurm.ErrJobUnknown
	}
	return j, nil
}

// env is one node in memory: its cgroup tree, the kernel map, the records,
// the enforcer and the handler, wired as daemon wires them.
type env struct {
	t    *testing.T
	n    *fakenode.Node
	reg  *registry.Registry
	st   *fakenode.Store
	enf  *enforcer.Enforcer
	h    *Handler
	rec  *audittest.Recorder
	logs *bytes.Buffer
	w    *watcher
	ctld *ctld
	mode devfilter.Mode

	nextPID int
}

func newEnv(t *testing.T, opts ...func(*env)) *env {
	v := &env{t: t, n: fakenode.New(mount), st: fakenode.NewStore(), rec: &audittest.Recorder{}, logs: &bytes.Buffer{},
		w: &watcher{}, ctld: &ctld{jobs: map[uint32]slurm.ControllerJob{}}, mode: devfilter.ModeScope, nextPID: 100}
	log := slog.New(slog.NewTextHandler(v.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	v.n.Mkdir(scope + "/system")
	v.n.SetScope(scope, nil)
	v.reg = registry.New(v.st, log)
	v.h = &Handler{Log: log, Mount: mount, Registry: v.reg, Table: table{}, Settings: settings{}, Recorder: v.rec,
		Users: &users.Cache{}, Cgroups: v.n, Watch: v.w, Mode: NewMode(false),
		Recovery: &recovery.Recovery{Source: v.ctld, Table: table{}, Node: "n1"}}
	for _, o := range opts {
		o(v)
	}
	v.enf = enforcer.New(enforcer.Options{Log: log, Mount: mount, Node: "n1", Exempt: []string{"system"},
		Registry: v.reg, Recorder: v.rec, Cgroups: v.n, Pins: &fakenode.Pins{},
		NewFilter: func(sc string, prepare func(enforcer.Filter) error) (enforcer.Filter, error) {
			sid := sc
			if v.mode == devfilter.ModePerCgroup {
				sid = ""
			}
			f := fakenode.NewFilter(v.mode, v.n, sid)
			if err := prepare(f); err != nil {
				return nil, err
			}
			return f, nil
		}})
	v.h.Enforcer = v.enf
	return v
}

func (v *env) filter() *fakenode.Filter {
	v.t.Helper()
	f, _ := v.enf.Filter().(*fakenode.Filter)
	if f == nil {
		v.t.Fatal("no filter attached")
	}
	return f
}

// entry is the kernel entry of cgroup dir as it is now.
func (v *env) entry(dir string) (devfilter.Policy, bool) {
	v.t.Helper()
	id, err := v.n.ID(dir)
	if err != nil {
		return devfilter.Policy{}, false
	}
	return v.filter().Entry(id)
}

func stepDir(job, step uint32) string {
	return filepath.Join(scope, fmt.Sprintf("job_%d", job), "step_"+policy.StepName(step))
}

// stepd starts job.step's slurmstepd (in <step>/slurm) and returns it as
// a peer.
func (v *env) stepd(job, step uint32) peer.Peer {
	return v.proc(filepath.Join(stepDir(job, step), "slurm"))
}

// proc starts a process in dir.
func (v *env) proc(dir string) peer.Peer {
	v.nextPID++
	v.n.Run(v.nextPID, dir)
	return peer.Peer{PID: v.nextPID}
}

func (v *env) do(p peer.Peer, req *pb.Request) *pb.Response {
	v.t.Helper()
	resp := v.h.Handle(context.Background(), p, req)
	if resp == nil {
		v.t.Fatal("nil response")
	}
	return resp
}

func str(s string) *string { return &s }

func (v *env) prolog(job, uid uint32, gpus *string) {
	v.t.Helper()
	if r := v.do(peer.Peer{}, &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: job, Uid: uid, JobGpus: gpus}}}); r.Error != "" {
		v.t.Fatalf("prolog: %s", r.Error)
	}
}

func (v *env) start(p peer.Peer, job, step, uid uint32, gpus *string, pids ...uint32) *pb.Response {
	v.t.Helper()
	return v.do(p, &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: job, StepId: step, Uid: uid, StepGpus: gpus, TaskPids: pids}}})
}

func (v *env) mustStart(job, step, uid uint32, gpus *string) *pb.Response {
	v.t.Helper()
	r := v.start(v.stepd(job, step), job, step, uid, gpus)
	if r.Error != "" {
		v.t.Fatalf("step %d.%d refused: %s", job, step, r.Error)
	}
	return r
}

func gpusOf(r *pb.Response) []int {
	out := []int{}
	for _, g := range r.Gpus {
		out = append(out, int(g))
	}
	return out
}

func same(a, b []uint32) bool { return slices.Equal(a, b) }
