// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/recovery"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// The open helper: the test binary re-executed inside a cgroup opens each
// path in GPUFENCE_TEST_OPEN and prints "path errno" lines.
func init() {
	paths := os.Getenv("GPUFENCE_TEST_OPEN")
	if paths == "" {
		return
	}
	for _, p := range strings.Split(paths, ",") {
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		res := "OK"
		if err != nil {
			res = unix.ErrnoName(err.(unix.Errno))
		} else {
			unix.Close(fd)
		}
		fmt.Printf("%s %s\n", filepath.Base(p), res)
	}
	os.Exit(0)
}

type tree struct {
	rec               *audittest.Recorder
	ctld              *fakeCtld
	t                 *testing.T
	root, scope, gres string
	dev               string
}

// newTree builds a Slurm-shaped cgroup tree of the test's own under the
// cgroup2 mount, and fake GPUs (195:0..3) plus nvidiactl in a temp folder.
func newTree(t *testing.T) *tree {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates cgroups, device nodes and BPF programs")
	}
	mount, err := jobcgroup.Mountpoint()
	if err != nil {
		t.Skipf("no cgroup v2: %v", err)
	}
	if _, err := devfilter.Probe(); err != nil {
		t.Skipf("kernel lacks the device filter's features: %v", err)
	}
	root, err := os.MkdirTemp(mount, "gpufence-daemon-test-")
	if err != nil {
		t.Fatal(err)
	}
	tr := &tree{t: t, rec: &audittest.Recorder{}, ctld: &fakeCtld{}, root: root, scope: filepath.Join(root, "system.slice", "tn_slurmstepd.scope"), dev: t.TempDir()}
	t.Cleanup(tr.remove)
	for _, d := range []string{"system", "slurmd"} {
		tr.mkdir(d)
	}
	for i := 0; i < 4; i++ {
		tr.mknod(fmt.Sprintf("nvidia%d", i), 195, uint32(i))
	}
	tr.mknod("nvidiactl", 195, 255)
	slurmDir := t.TempDir()
	os.WriteFile(filepath.Join(slurmDir, "slurm.conf"), []byte("TaskPlugin=task/affinity,task/cgroup\n"), 0o644)
	os.WriteFile(filepath.Join(slurmDir, "gres.conf"), []byte("Name=gpu File="+tr.dev+"/nvidia[0-3]\n"), 0o644)
	tr.gres = slurmDir
	return tr
}

func (tr *tree) mkdir(rel string) string {
	p := filepath.Join(tr.scope, rel)
	if err := os.MkdirAll(p, 0o755); err != nil {
		tr.t.Fatal(err)
	}
	return p
}

func (tr *tree) mknod(name string, major, minor uint32) {
	if err := unix.Mknod(filepath.Join(tr.dev, name), unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) remove() {
	var dirs []string
	filepath.Walk(tr.root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := os.Remove(d); err != nil {
			tr.t.Errorf("cleanup: %v", err)
		}
	}
}

// inCgroup runs fn (which starts cmd) with cmd set to be born in cgroup dir.
func (tr *tree) inCgroup(dir string, cmd *exec.Cmd, fn func() error) error {
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		tr.t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	return fn()
}

// sleeper is a process standing in for slurmstepd inside a step cgroup.
func (tr *tree) sleeper(dir string) int {
	cmd := exec.Command("sleep", "60")
	if err := tr.inCgroup(dir, cmd, cmd.Start); err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

// open reports what each fake device gives a process in cgroup dir.
func (tr *tree) open(dir string) map[string]string {
	tr.t.Helper()
	return tr.openNames(dir, "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl")
}

func (tr *tree) expect(dir string, allowed ...int) {
	tr.t.Helper()
	got := tr.open(dir)
	for i := 0; i < 4; i++ {
		want := "EPERM"
		if slices.Contains(allowed, i) {
			want = "ENXIO"
		}
		if n := fmt.Sprintf("nvidia%d", i); got[n] != want {
			tr.t.Errorf("%s: %s = %s, want %s", filepath.Base(filepath.Dir(dir)), n, got[n], want)
		}
	}
	if got["nvidiactl"] != "ENXIO" {
		tr.t.Errorf("nvidiactl = %s, want ENXIO", got["nvidiactl"])
	}
}

func (tr *tree) daemon(mode devfilter.Mode) (*Daemon, *logBuffer) {
	return tr.daemonWith(mode, nil)
}

// daemonWith starts a daemon on the tree, with edit applied to its
// configuration; tr.ctld answers for slurmctld from the start.
func (tr *tree) daemonWith(mode devfilter.Mode, edit func(*config.Config)) (*Daemon, *logBuffer) {
	return tr.daemonWithRecorder(mode, edit, tr.rec)
}

// daemonWithRecorder is daemonWith handing records to rec.
func (tr *tree) daemonWithRecorder(mode devfilter.Mode, edit func(*config.Config), rec Recorder) (*Daemon, *logBuffer) {
	cfg := config.Default()
	cfg.SlurmConf = filepath.Join(tr.gres, "slurm.conf")
	// The tree's slurm.conf is no node's: gres.conf alone (slurmd_test.go
	// tests slurmd -G).
	cfg.SlurmdGPUTable = config.SlurmdGPUTableOff
	cfg.Scope = tr.scope
	cfg.PinDir = ""
	cfg.StateFile = filepath.Join(tr.t.TempDir(), "state.json")
	cfg.FailOpenSpool = ""
	if edit != nil {
		edit(&cfg)
	}
	buf := &logBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(buf, testWriter{tr.t}), nil))
	jobSource = func(config.Config) recovery.JobSource { return tr.ctld }
	d, err := New(cfg, log, NewKernelFilter(devfilter.Options{Mode: mode, NvidiaMajor: 195, Logger: log, AuditAllowed: devfilter.AuditAllowedNone}), 195, rec)
	if err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { d.Close() })
	return d, buf
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

type logBuffer struct{ strings.Builder }

func call(d *Daemon, pid int, msg any) *pb.Response {
	req := &pb.Request{Version: pb.ProtocolVersion_PROTOCOL_VERSION_1}
	switch m := msg.(type) {
	case *pb.JobProlog:
		req.Msg = &pb.Request_JobProlog{JobProlog: m}
	case *pb.StepStart:
		req.Msg = &pb.Request_StepStart{StepStart: m}
	case *pb.StepEnd:
		req.Msg = &pb.Request_StepEnd{StepEnd: m}
	case *pb.JobEpilog:
		req.Msg = &pb.Request_JobEpilog{JobEpilog: m}
	}
	return d.h.Handle(nil, peer.Peer{PID: pid}, req)
}

func ptr(s string) *string { return &s }

func TestPrivilegedDaemonScope(t *testing.T)     { testDaemon(t, devfilter.ModeScope) }
func TestPrivilegedDaemonPerCgroup(t *testing.T) { testDaemon(t, devfilter.ModePerCgroup) }

func testDaemon(t *testing.T, mode devfilter.Mode) {
	tr := newTree(t)
	if mode == devfilter.ModeScope {
		if m, _ := devfilter.Probe(); m != devfilter.ModeScope {
			t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", m)
		}
	}
	d, _ := tr.daemon(mode)

	// Job 1 holds GPU 2 and runs a GPU step; job 2 holds GPUs 0,1 with a
	// batch step and an srun step narrowed to GPU 1; job 3 is CPU-only.
	step1 := tr.mkdir("job_1/step_0")
	task1 := tr.mkdir("job_1/step_0/user/task_0")
	stepd1 := tr.sleeper(tr.mkdir("job_1/step_0/slurm"))
	batch2 := tr.mkdir("job_2/step_batch/user/task_0")
	stepdB := tr.sleeper(tr.mkdir("job_2/step_batch/slurm"))
	step2 := tr.mkdir("job_2/step_0/user/task_0")
	stepd2 := tr.sleeper(tr.mkdir("job_2/step_0/slurm"))
	cpu3 := tr.mkdir("job_3/step_0/user/task_0")
	stepd3 := tr.sleeper(tr.mkdir("job_3/step_0/slurm"))
	unregistered := tr.mkdir("job_4/step_0/user/task_0")

	for _, m := range []*pb.JobProlog{{JobId: 1, Uid: 1000, JobGpus: ptr("2")}, {JobId: 2, Uid: 1001, JobGpus: ptr("0,1")}, {JobId: 3, Uid: 1000}} {
		if r := call(d, 0, m); r.Error != "" {
			t.Fatalf("prolog %d: %s", m.JobId, r.Error)
		}
	}
	r := call(d, stepd1, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("2")})
	if r.Error != "" || !slices.Equal(r.Gpus, []uint32{2}) || r.SlurmLocalIndices {
		t.Fatalf("step 1.0: %+v", r)
	}
	// The forged SLURM_STEP_GPUS of a batch step is ignored.
	if r := call(d, stepdB, &pb.StepStart{JobId: 2, StepId: policy.BatchStep, Uid: 1001, StepGpus: ptr("0,1,2,3")}); r.Error != "" || !slices.Equal(r.Gpus, []uint32{0, 1}) {
		t.Fatalf("step 2.batch: %+v", r)
	}
	if r := call(d, stepd2, &pb.StepStart{JobId: 2, StepId: 0, Uid: 1001, StepGpus: ptr("1")}); r.Error != "" {
		t.Fatalf("step 2.0: %+v", r)
	}
	if r := call(d, stepd3, &pb.StepStart{JobId: 3, StepId: 0, Uid: 1000}); r.Error != "" || len(r.Gpus) != 0 {
		t.Fatalf("step 3.0: %+v", r)
	}

	opened := time.Now()
	tr.expect(task1, 2)
	d.flush()
	deadline := time.Now().Add(5 * time.Second)
	var denied []audit.Record
	for time.Now().Before(deadline) {
		denied = nil
		for _, r := range tr.rec.Records(audit.EventGPUAccess) {
			if r.JobID == 1 && r.Decision == audit.DecisionDenied {
				denied = append(denied, r)
			}
		}
		if len(denied) == 3 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	found := time.Now()
	if len(denied) != 3 {
		t.Fatalf("job 1: %d denied records, want 3 (GPUs 0, 1, 3): %+v", len(denied), denied)
	}
	for _, r := range denied {
		if r.StepID != "0" || r.GPU == nil || r.GPU.Index == 2 || r.Device.Path != filepath.Join(tr.dev, fmt.Sprintf("nvidia%d", r.GPU.Index)) ||
			r.Comm != "daemon.test" || r.PID == 0 || *r.UID != 0 || r.User != "root" || r.PolicyMode != audit.ModeEnforce {
			t.Errorf("badly attributed record: %+v", r)
		}
		// The kernel's time of the open, converted to wall clock: after
		// the opens began, before the test saw the records.
		const skew = 5 * time.Millisecond
		if r.AccessTime.Before(opened.Add(-skew)) || r.AccessTime.After(found.Add(skew)) {
			t.Errorf("access_time %s not between the opens (%s) and the records seen (%s)", r.AccessTime, opened, found)
		}
	}
	if n := len(tr.rec.Records(audit.EventPolicyApplied)); n != 4 {
		t.Errorf("%d policy_applied records, want 4", n)
	}
	tr.expect(batch2, 0, 1)
	tr.expect(step2, 1)
	tr.expect(cpu3)
	if mode == devfilter.ModeScope {
		tr.expect(unregistered) // fail closed in the kernel
		tr.expect(filepath.Join(tr.scope, "slurmd"), 0, 1, 2, 3)
	}

	// A task pid outside its step is refused.
	if r := call(d, stepd1, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("2"), TaskPids: []uint32{uint32(stepd2)}}); !strings.Contains(r.Error, "not in its step's cgroup") {
		t.Errorf("foreign task pid: %q", r.Error)
	}
	// The wrong uid is refused.
	if r := call(d, stepd1, &pb.StepStart{JobId: 1, StepId: 0, Uid: 0, StepGpus: ptr("2")}); !strings.Contains(r.Error, "uid") {
		t.Errorf("wrong uid: %q", r.Error)
	}
	// A GPU step of a job without prolog is refused with a reason.
	stepd5 := tr.sleeper(tr.mkdir("job_5/step_0/slurm"))
	if r := call(d, stepd5, &pb.StepStart{JobId: 5, StepId: 0, Uid: 1000, StepGpus: ptr("0")}); !strings.Contains(r.Error, "no trusted GPU list") {
		t.Errorf("no prolog: %q", r.Error)
	}
	// A prolog naming a GPU the node does not have poisons the job.
	call(d, 0, &pb.JobProlog{JobId: 6, Uid: 1000, JobGpus: ptr("7")})
	stepd6 := tr.sleeper(tr.mkdir("job_6/step_0/slurm"))
	if r := call(d, stepd6, &pb.StepStart{JobId: 6, StepId: 0, Uid: 1000, StepGpus: ptr("7")}); !strings.Contains(r.Error, "not in this node's GPU table") {
		t.Errorf("unknown GPU: %q", r.Error)
	}

	// Step end removes the entry: the step's cgroup fails closed again
	// (scope mode: no entry; per-cgroup mode: a deny-all entry while the
	// cgroup lives, for a task that outlives its step).
	call(d, 0, &pb.StepEnd{JobId: 1, StepId: 0})
	tr.expect(task1)
	call(d, 0, &pb.JobEpilog{JobId: 2})
	call(d, 0, &pb.JobEpilog{JobId: 3})
	call(d, 0, &pb.JobEpilog{JobId: 1})
	steps, exempt := d.owned()
	jobs := len(d.reg.Jobs())
	if n := len(tr.rec.Records(audit.EventPolicyReleased)); n != 4 {
		t.Errorf("%d policy_released records, want 4", n)
	}
	if n := len(tr.rec.Records(audit.EventLookupFailed)); n != 1 {
		t.Errorf("%d lookup_failed records, want 1 (the foreign task pid)", n)
	}
	if steps != 0 || jobs != 1 {
		t.Errorf("after epilogs: %d steps (want none, beside the %d exempt cgroups), %d jobs (want job 6 only: its epilog never came)", steps, exempt, jobs)
	}
	_ = step1
}

// TestPrivilegedReconcileRemovesVanishedStep: a step whose cgroup disappears
// without a step end (slurmstepd killed) loses its entry at the next pass;
// the job's record goes only once slurmctld says the job has ended.
func TestPrivilegedReconcileRemovesVanishedStep(t *testing.T) {
	tr := newTree(t)
	d, _ := tr.daemon(devfilter.ModeAuto)
	call(d, 0, &pb.JobProlog{JobId: 1, Uid: 1000, JobGpus: ptr("0")})
	dir := tr.mkdir("job_1/step_0/slurm")
	cmd := exec.Command("sleep", "60")
	if err := tr.inCgroup(dir, cmd, cmd.Start); err != nil {
		t.Fatal(err)
	}
	if r := call(d, cmd.Process.Pid, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("0")}); r.Error != "" {
		t.Fatal(r.Error)
	}
	cmd.Process.Kill()
	cmd.Wait()
	for _, p := range []string{"job_1/step_0/slurm", "job_1/step_0", "job_1"} {
		if err := os.Remove(filepath.Join(tr.scope, p)); err != nil {
			t.Fatal(err)
		}
	}
	tr.ctld.set(1, slurm.ControllerJob{ID: 1, UID: 1000, State: "RUNNING", OnNode: true, GPUs: []int{0}}, nil)
	d.rc.Pass()
	j, js, ok := d.job(1)
	if !ok || len(js) != 0 {
		t.Fatalf("job record after its step and cgroup vanished while slurmctld says it runs: %+v %v, want kept with no step", j, js)
	}
	if steps, _ := d.owned(); steps != 0 {
		t.Errorf("%d steps left, want none", steps)
	}
	// The job ended without its epilog reaching the agent.
	tr.ctld.set(1, slurm.ControllerJob{}, slurm.ErrJobUnknown)
	d.reg.SetCheck(1, time.Time{}, 0)
	d.rc.Pass()
	if _, _, ok := d.job(1); ok {
		t.Errorf("job record left after slurmctld said the job is gone")
	}
	if n := tr.ctld.calls(1); n != 2 {
		t.Errorf("slurmctld asked %d times about job 1, want 2", n)
	}
}

func TestStepRefusedOutsideSlurm(t *testing.T) {
	if _, err := jobcgroup.Mountpoint(); err != nil {
		t.Skip("no cgroup v2")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "slurm.conf"), []byte("TaskPlugin=task/cgroup\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "gres.conf"), []byte("Name=gpu File=/dev/nvidia[0-1]\n"), 0o644)
	cfg := config.Default()
	cfg.SlurmdGPUTable = config.SlurmdGPUTableOff // gres.conf alone: slurmd_test.go runs slurmd -G
	cfg.SlurmConf = filepath.Join(dir, "slurm.conf")
	cfg.Scope = "/sys/fs/cgroup/none-such-scope"
	cfg.PinDir, cfg.StateFile, cfg.FailOpenSpool = "", "", ""
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(string, func(Filter) error) (Filter, error) {
		return nil, errors.New("no filter in this test")
	}, 195, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := call(d, os.Getpid(), &pb.StepStart{JobId: 1, Uid: 1})
	if !strings.Contains(r.Error, "cannot place slurmstepd") || !strings.Contains(r.Error, "cgroup/v2") {
		t.Errorf("step outside Slurm's tree: %q", r.Error)
	}
	if r := call(d, 0, &pb.JobProlog{JobId: 1, JobGpus: ptr("0,x")}); r.Error != "" {
		t.Errorf("a bad prolog list is recorded as broken, not refused: %q", r.Error)
	}
	if j, _, _ := d.job(1); !strings.Contains(j.Broken, "SLURM_JOB_GPUS") {
		t.Errorf("broken = %q", j.Broken)
	}
	_ = time.Second
}
