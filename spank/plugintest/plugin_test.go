// SPDX-License-Identifier: Apache-2.0

package plugintest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/spank/internal/fakeagent"
)

var (
	fakeOnce  sync.Once
	fakeSlurm string
	fakeErr   string
)

// slurm runs the real plugin under testdata/fakeslurm.c and returns its
// output lines.
func slurm(t *testing.T, env []string, ctx string, steps []string, args ...string) []string {
	t.Helper()
	return slurmIn(t, -1, env, ctx, steps, args...)
}

// slurmIn is slurm with fakeslurm born in the cgroup open at cgroupFD (-1:
// this process's).
func slurmIn(t *testing.T, cgroupFD int, env []string, ctx string, steps []string, args ...string) []string {
	t.Helper()
	trackSources(t)
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gffake")
		if err != nil {
			fakeErr = err.Error()
			return
		}
		fakeSlurm = filepath.Join(dir, "fakeslurm")
		out, err := exec.Command("gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-rdynamic",
			"-o", fakeSlurm, "testdata/fakeslurm.c", "-ldl").CombinedOutput()
		if err != nil {
			fakeErr = err.Error() + "\n" + string(out)
		}
	})
	if fakeErr != "" {
		t.Fatalf("build fakeslurm: %s", fakeErr)
	}
	cmd := exec.Command(fakeSlurm, append([]string{filepath.Join(binDir, "spank_gpufence.so"), ctx,
		strings.Join(steps, ",")}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	if cgroupFD >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgroupFD}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("fakeslurm: %v\n%s", err, out)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func has(lines []string, want string) bool { return slices.Contains(lines, want) }

func hasPrefix(lines []string, prefix string) bool {
	return slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
}

func TestStrictArguments(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"foo=1"}, `error: gpufence: unknown option "foo=1" in plugstack.conf (known: socket, timeout, failure, spool)`},
		{[]string{"socket"}, `error: gpufence: unknown option "socket" in plugstack.conf (known: socket, timeout, failure, spool)`},
		{[]string{"timeout=0"}, `error: gpufence: option "timeout=0" in plugstack.conf: want whole seconds from 1 to 3600`},
		{[]string{"timeout=5s"}, `error: gpufence: option "timeout=5s" in plugstack.conf: want whole seconds from 1 to 3600`},
		{[]string{"socket=relative.sock"}, `error: gpufence: option "socket=relative.sock" in plugstack.conf: not an absolute path`},
		{[]string{"timeout=3", "timeout=4"}, `error: gpufence: option "timeout" given twice in plugstack.conf`},
		{[]string{"failure=maybe"}, `error: gpufence: option "failure=maybe" in plugstack.conf: want closed or open`},
		{[]string{"failure="}, `error: gpufence: option "failure=" in plugstack.conf: want closed or open`},
		{[]string{"spool=relative/failopen.jsonl"}, `error: gpufence: option "spool=relative/failopen.jsonl" in plugstack.conf: not an absolute path`},
		{[]string{"failure=open", "failure=closed"}, `error: gpufence: option "failure" given twice in plugstack.conf`},
	}
	for _, ctx := range []string{"local", "allocator", "slurmd"} {
		for _, tt := range tests {
			lines := slurm(t, nil, ctx, []string{"init", "threads"}, tt.args...)
			if !has(lines, "rc init -1") || !has(lines, tt.want) {
				t.Errorf("%s %v: want rc -1 and %q, got %q", ctx, tt.args, tt.want, lines)
			}
		}
		lines := slurm(t, nil, ctx, []string{"init", "threads"}, "socket=/x/a.sock", "timeout=3", "golib=/x/go.so",
			"failure=open", "spool=/x/failopen.jsonl")
		if !has(lines, "rc init 0") || hasPrefix(lines, "error:") {
			t.Errorf("%s with good arguments: %q", ctx, lines)
		}
		// srun, sbatch, salloc and slurmd never start a runtime.
		if !has(lines, "threads 1") {
			t.Errorf("%s started a thread: %q", ctx, lines)
		}
	}
}

func stepEnv(extra ...string) []string {
	return append([]string{"FAKE_JOB_ID=7", "FAKE_STEP_ID=2", "FAKE_UID=2001",
		"JOB_SLURM_STEP_GPUS=1,3", "JOB_CUDA_VISIBLE_DEVICES=3", "JOB_GPU_DEVICE_ORDINAL=1,3"}, extra...)
}

// As slurmstepd: fork the task, run task_post_fork in the parent, then let
// the task run task_init; then the step's end.
var stepSequence = []string{"init", "threads", "fork", "task_post_fork", "release", "exit"}

// ownCgroup is this process's cgroup v2 path, which fakeslurm's task child
// inherits: what a real agent names as the step's cgroup.
func ownCgroup(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p
		}
	}
	t.Skip("no cgroup v2 entry in /proc/self/cgroup")
	return ""
}

// One exchange per step: init registers it, post_fork checks the task is in
// the step's cgroup the agent named, with no second exchange, and the end of
// the step sends nothing (the agent sees the cgroup go). The Go client never
// runs in slurmstepd's own process.
func TestStepRegistersAndRenumbers(t *testing.T) {
	cg := ownCgroup(t)
	a := fakeagent.Start(t, func(req *pb.Request) *pb.Response {
		if req.GetStepStart() != nil {
			return &pb.Response{Gpus: []uint32{1, 3}, StepCgroup: cg}
		}
		return &pb.Response{}
	})
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket, "timeout=5")
	for _, want := range []string{"rc init 0", "threads 1", "rc task_init 0",
		"env CUDA_VISIBLE_DEVICES=1", "env GPU_DEVICE_ORDINAL=0,1", "rc task_post_fork 0", "rc exit absent"} {
		if !has(lines, want) {
			t.Errorf("missing %q in %q", want, lines)
		}
	}
	reqs := a.Requests()
	if len(reqs) != 1 {
		t.Fatalf("agent got %d requests, want init's only: %v", len(reqs), reqs)
	}
	init := &pb.StepStart{JobId: 7, StepId: 2, Uid: 2001, StepGpus: proto.String("1,3")}
	if !proto.Equal(reqs[0].GetStepStart(), init) {
		t.Errorf("init sent %v, want %v", reqs[0], init)
	}
}

// A task that is not inside the step's cgroup may not exec.
func TestTaskOutsideStepRefused(t *testing.T) {
	cg := ownCgroup(t)
	a := fakeagent.Start(t, func(req *pb.Request) *pb.Response {
		return &pb.Response{Gpus: []uint32{1}, StepCgroup: cg + "/step_elsewhere"}
	})
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket)
	want := "error: gpufence: task pid "
	if !has(lines, "rc task_init -1") || !hasPrefix(lines, want) || !hasPrefix(lines, "info: gpufence: task pid") {
		t.Errorf("task outside its step: %q", lines)
	}
	for _, l := range lines {
		if strings.HasPrefix(l, want) && !strings.Contains(l, "is in cgroup "+cg+", not in its step's cgroup "+cg+"/step_elsewhere") {
			t.Errorf("refusal does not say where: %q", l)
		}
	}
}

// A task in step_01 is not in step_0, though the name starts alike; one in
// step_0/user/task_0 is.
func TestPrivilegedTaskCgroupPrefix(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs the task in cgroups of its own")
	}
	mount := ""
	for _, m := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var fs syscall.Statfs_t
		if syscall.Statfs(m, &fs) == nil && fs.Type == 0x63677270 { // CGROUP2_SUPER_MAGIC
			mount = m
			break
		}
	}
	if mount == "" {
		t.Skip("no cgroup v2 mount")
	}
	root, err := os.MkdirTemp(mount, "gpufence-plugintest-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, d := range []string{"step_01", "step_0/user/task_0", "step_0/user", "step_0", ""} {
			os.Remove(filepath.Join(root, d))
		}
	}()
	for _, d := range []string{"step_01", "step_0/user/task_0"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	step := strings.TrimPrefix(filepath.Join(root, "step_0"), mount)
	a := fakeagent.Start(t, func(req *pb.Request) *pb.Response { return &pb.Response{Gpus: []uint32{1}, StepCgroup: step} })
	for dir, want := range map[string]string{"step_01": "rc task_init -1", "step_0/user/task_0": "rc task_init 0"} {
		fd, err := syscall.Open(filepath.Join(root, dir), syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		lines := slurmIn(t, fd, stepEnv(), "remote", stepSequence, "socket="+a.Socket)
		syscall.Close(fd)
		if !has(lines, want) {
			t.Errorf("task in %s, step %s: want %q, got %q", dir, step, want, lines)
		}
	}
}

// An agent that does not name the step's cgroup (older than the plugin)
// checks the task itself: post_fork sends the task's pid.
func TestOlderAgentChecksTask(t *testing.T) {
	a := fakeagent.Start(t, func(req *pb.Request) *pb.Response { return &pb.Response{Gpus: []uint32{1, 3}} })
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket)
	if !has(lines, "rc task_init 0") || !has(lines, "env CUDA_VISIBLE_DEVICES=1") {
		t.Errorf("step with an older agent: %q", lines)
	}
	reqs := a.Requests()
	if len(reqs) != 2 {
		t.Fatalf("agent got %d requests, want init and post_fork's: %v", len(reqs), reqs)
	}
	if s := reqs[1].GetStepStart(); s == nil || len(s.TaskPids) != 1 || s.TaskPids[0] == 0 || s.StepId != 2 {
		t.Errorf("post_fork sent %v, want StepStart with the task pid", reqs[1])
	}
}

// TestNonListValuesUntouched: the real plugin renumbers only values in the
// GPU list grammar (docs/architecture.md, "GPU lists"). What Slurm writes
// under AutoDetect=nvml (MIG and GPU UUIDs, alone or mixed with indices)
// and spellings Slurm never writes are left exactly as they are.
func TestNonListValuesUntouched(t *testing.T) {
	a := fakeagent.Start(t, func(req *pb.Request) *pb.Response {
		if req.GetStepStart() != nil {
			return &pb.Response{Gpus: []uint32{1, 3}}
		}
		return &pb.Response{}
	})
	for _, v := range []string{
		"MIG-5f1c2d3e-4444-5555-6666-777788889999",
		"MIG-GPU-8f6a1b2c-0000-1111-2222-333344445555/1/0,MIG-GPU-8f6a1b2c-0000-1111-2222-333344445555/2/0",
		"GPU-8f6a1b2c-0000-1111-2222-333344445555",
		"1,MIG-5f1c2d3e-4444-5555-6666-777788889999",
		"3,1", "1-3", "1, 3", "03",
	} {
		env := []string{"FAKE_JOB_ID=7", "FAKE_STEP_ID=2", "FAKE_UID=2001", "JOB_SLURM_STEP_GPUS=1,3",
			"JOB_CUDA_VISIBLE_DEVICES=" + v, "JOB_GPU_DEVICE_ORDINAL=" + v}
		lines := slurm(t, env, "remote", stepSequence, "socket="+a.Socket)
		if !has(lines, "rc task_init 0") || !has(lines, "env CUDA_VISIBLE_DEVICES="+v) || !has(lines, "env GPU_DEVICE_ORDINAL="+v) {
			t.Errorf("%q changed or the task failed: %q", v, lines)
		}
	}
	// The same step with Slurm's list is renumbered: the values above were
	// kept for what they are, not because nothing is renumbered.
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket)
	if !has(lines, "env CUDA_VISIBLE_DEVICES=1") {
		t.Errorf("CUDA_VISIBLE_DEVICES=3 with GPUs 1,3 not renumbered to 1: %q", lines)
	}
}

func TestSlurmLocalIndicesUntouched(t *testing.T) {
	a := fakeagent.Start(t, func(*pb.Request) *pb.Response {
		return &pb.Response{Gpus: []uint32{1, 3}, SlurmLocalIndices: true}
	})
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket)
	if !has(lines, "env CUDA_VISIBLE_DEVICES=3") || !has(lines, "env GPU_DEVICE_ORDINAL=1,3") {
		t.Errorf("variables changed although Slurm numbers them: %q", lines)
	}
}

func TestAgentAbsentRefusesStep(t *testing.T) {
	sock := fakeagent.AbsentSocket(t)
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+sock)
	if !has(lines, "rc init 0") {
		t.Errorf("init must not fail (srun would not see why): %q", lines)
	}
	want := "error: gpufence: cannot reach the gpufence agent at " + sock +
		" (connect: no such file or directory); refusing to start job 7 step 2 without GPU isolation"
	// post_fork does not fail (srun would exit 0 on a launch failure and a
	// failed batch launch drains the node): the task refuses to exec.
	if !has(lines, "rc task_post_fork 0") || !has(lines, "rc task_init -1") || !hasPrefix(lines, want) {
		t.Errorf("want post_fork 0, task_init -1 and %q, got %q", want, lines)
	}
	if has(lines, "env CUDA_VISIBLE_DEVICES=1") {
		t.Errorf("a refused task went on to renumber: %q", lines)
	}
}

// TestInitVerdictIsFinal: a refusal in init is the step's verdict; later
// callbacks do not ask again.
func TestInitVerdictIsFinal(t *testing.T) {
	a := fakeagent.Start(t, func(req *pb.Request) *pb.Response { return &pb.Response{Error: "not yet"} })
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket)
	if !has(lines, "rc task_init -1") || !hasPrefix(lines, "error: gpufence: the gpufence agent refused: not yet; refusing") {
		t.Errorf("task after a refused init: %q", lines)
	}
	if n := len(a.Requests()); n != 1 {
		t.Errorf("agent asked %d times, want once", n)
	}
}

func TestAgentRefusalReachesUser(t *testing.T) {
	a := fakeagent.Start(t, func(*pb.Request) *pb.Response {
		return &pb.Response{Error: "job 7 has no prolog record on this node"}
	})
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket)
	if !has(lines, "rc task_init -1") ||
		!hasPrefix(lines, "error: gpufence: the gpufence agent refused: job 7 has no prolog record on this node; refusing") {
		t.Errorf("refusal not reported: %q", lines)
	}
}

// The exchanges with the agent are C, in slurmstepd's own thread: a step
// starts no thread, and an old plugstack line's golib= changes nothing.
func TestStepNeedsNoGoLibrary(t *testing.T) {
	a := fakeagent.Start(t, func(req *pb.Request) *pb.Response { return &pb.Response{Gpus: []uint32{1, 3}} })
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket, "golib=/nonexistent/spank_gpufence_go.so")
	if !has(lines, "rc task_init 0") || !has(lines, "env CUDA_VISIBLE_DEVICES=1") || !has(lines, "threads 1") ||
		hasPrefix(lines, "error:") {
		t.Errorf("step with golib= set: %q", lines)
	}
	if n := len(a.Requests()); n != 2 {
		t.Errorf("agent got %d requests, want init's and post_fork's", n)
	}
}

func TestBadArgumentsInStepRefuseTasks(t *testing.T) {
	lines := slurm(t, stepEnv(), "remote", stepSequence, "bogus=1")
	if !has(lines, "rc init 0") || !has(lines, "rc task_init -1") || !has(lines, "threads 1") ||
		!hasPrefix(lines, `error: gpufence: unknown option "bogus=1" in plugstack.conf (known: socket, timeout, failure, spool); refusing`) {
		t.Errorf("bad arguments in slurmstepd: %q", lines)
	}
}

func TestExternStepHasNoTaskToGate(t *testing.T) {
	sock := fakeagent.AbsentSocket(t)
	// No fork: S_TASK_PID is unavailable, as in the extern step.
	lines := slurm(t, stepEnv(), "remote", []string{"init", "task_post_fork"}, "socket="+sock)
	if !has(lines, "rc task_post_fork 0") {
		t.Errorf("extern step post_fork: %q", lines)
	}
}

func TestJobPrologAndEpilog(t *testing.T) {
	a := fakeagent.Start(t, func(*pb.Request) *pb.Response { return &pb.Response{} })
	env := []string{"FAKE_JOB_ID=9", "FAKE_UID=2001"}
	lines := slurm(t, append(env, "SLURM_JOB_GPUS=0,2"), "job_script", []string{"job_prolog", "job_epilog"}, "socket="+a.Socket)
	lines = append(lines, slurm(t, env, "job_script", []string{"job_prolog"}, "socket="+a.Socket)...)
	if hasPrefix(lines, "error:") || !has(lines, "rc job_prolog 0") || !has(lines, "rc job_epilog 0") {
		t.Errorf("prolog/epilog: %q", lines)
	}
	want := []*pb.Request{
		{Version: 1, Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 9, Uid: 2001, JobGpus: proto.String("0,2")}}},
		{Version: 1, Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 9}}},
		{Version: 1, Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 9, Uid: 2001}}},
	}
	got := a.Requests()
	if len(got) != len(want) {
		t.Fatalf("agent got %v, want %v", got, want)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("request %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestJobPrologNeverFails(t *testing.T) {
	sock := fakeagent.AbsentSocket(t)
	lines := slurm(t, []string{"FAKE_JOB_ID=9", "FAKE_UID=2001", "SLURM_JOB_GPUS=0"}, "job_script",
		[]string{"job_prolog", "job_epilog"}, "socket="+sock)
	if !has(lines, "rc job_prolog 0") || !has(lines, "rc job_epilog 0") ||
		!hasPrefix(lines, "error: gpufence: job 9 prolog: cannot reach the gpufence agent at "+sock) {
		t.Errorf("prolog with absent agent: %q", lines)
	}
}
