package plugintest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
		{[]string{"foo=1"}, `error: gpufence: unknown option "foo=1" in plugstack.conf (known: socket, timeout, golib, failure, spool)`},
		{[]string{"socket"}, `error: gpufence: unknown option "socket" in plugstack.conf (known: socket, timeout, golib, failure, spool)`},
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
			lines := slurm(t, nil, ctx, []string{"init", "maps"}, tt.args...)
			if !has(lines, "rc init -1") || !has(lines, tt.want) {
				t.Errorf("%s %v: want rc -1 and %q, got %q", ctx, tt.args, tt.want, lines)
			}
		}
		lines := slurm(t, nil, ctx, []string{"init", "exit", "maps"}, "socket=/x/a.sock", "timeout=3", "golib=/x/go.so",
			"failure=open", "spool=/x/failopen.jsonl")
		if !has(lines, "rc init 0") || !has(lines, "rc exit 0") || hasPrefix(lines, "error:") {
			t.Errorf("%s with good arguments: %q", ctx, lines)
		}
		// srun, sbatch, salloc and slurmd never start a Go runtime.
		if !has(lines, "golib mapped 0") {
			t.Errorf("%s loaded the Go library: %q", ctx, lines)
		}
	}
}

func stepEnv(extra ...string) []string {
	return append([]string{"FAKE_JOB_ID=7", "FAKE_STEP_ID=2", "FAKE_UID=2001",
		"JOB_SLURM_STEP_GPUS=1,3", "JOB_CUDA_VISIBLE_DEVICES=3", "JOB_GPU_DEVICE_ORDINAL=1,3"}, extra...)
}

// As slurmstepd: fork the task, run task_post_fork in the parent, then let
// the task run task_init.
var stepSequence = []string{"init", "maps", "fork", "task_post_fork", "release", "exit"}

func TestStepRegistersAndRenumbers(t *testing.T) {
	a := fakeagent.Start(t, func(req *pb.Request) *pb.Response {
		if req.GetStepStart() != nil {
			return &pb.Response{Gpus: []uint32{1, 3}}
		}
		return &pb.Response{}
	})
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket, "timeout=5")
	for _, want := range []string{"rc init 0", "golib mapped 1", "rc task_init 0",
		"env CUDA_VISIBLE_DEVICES=1", "env GPU_DEVICE_ORDINAL=0,1", "rc task_post_fork 0", "rc exit 0"} {
		if !has(lines, want) {
			t.Errorf("missing %q in %q", want, lines)
		}
	}
	reqs := a.Requests()
	if len(reqs) != 3 {
		t.Fatalf("agent got %d requests, want init, post_fork and exit: %v", len(reqs), reqs)
	}
	init := &pb.StepStart{JobId: 7, StepId: 2, Uid: 2001, StepGpus: proto.String("1,3")}
	if !proto.Equal(reqs[0].GetStepStart(), init) {
		t.Errorf("init sent %v, want %v", reqs[0], init)
	}
	if s := reqs[1].GetStepStart(); s == nil || len(s.TaskPids) != 1 || s.TaskPids[0] == 0 || s.StepId != 2 {
		t.Errorf("post_fork sent %v, want StepStart with the task pid", reqs[1])
	}
	if !proto.Equal(reqs[2].GetStepEnd(), &pb.StepEnd{JobId: 7, StepId: 2}) {
		t.Errorf("exit sent %v, want StepEnd", reqs[2])
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

// TestPostForkAnswerReachesTask: init could not register, post_fork could;
// the task runs and numbers its GPUs from post_fork's answer.
func TestPostForkAnswerReachesTask(t *testing.T) {
	var n atomic.Int32
	a := fakeagent.Start(t, func(req *pb.Request) *pb.Response {
		if req.GetStepStart() != nil && n.Add(1) == 1 {
			return &pb.Response{Error: "not yet"}
		}
		return &pb.Response{Gpus: []uint32{3}}
	})
	lines := slurm(t, stepEnv(), "remote", stepSequence, "socket="+a.Socket)
	if !has(lines, "rc task_init 0") || !has(lines, "env CUDA_VISIBLE_DEVICES=0") || !has(lines, "env GPU_DEVICE_ORDINAL=0") {
		t.Errorf("task after a late confirmation: %q", lines)
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

func TestMissingGoLibraryRefusesStep(t *testing.T) {
	lines := slurm(t, stepEnv(), "remote", stepSequence, "golib=/nonexistent/spank_gpufence_go.so")
	if !has(lines, "rc task_init -1") ||
		!hasPrefix(lines, "error: gpufence: cannot load the gpufence client library /nonexistent/spank_gpufence_go.so (/nonexistent/spank_gpufence_go.so: cannot open shared object file") {
		t.Errorf("load failure not reported: %q", lines)
	}
}

func TestBadArgumentsInStepRefuseTasks(t *testing.T) {
	lines := slurm(t, stepEnv(), "remote", stepSequence, "bogus=1")
	if !has(lines, "rc init 0") || !has(lines, "rc task_init -1") || !has(lines, "golib mapped 0") ||
		!hasPrefix(lines, `error: gpufence: unknown option "bogus=1" in plugstack.conf (known: socket, timeout, golib, failure, spool); refusing`) {
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
