// SPDX-License-Identifier: Apache-2.0

package crash

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/proto/agentclient"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// A worker is this test binary run again as a separate process that stands
// in for slurmstepd: the agent places a step by its peer's
// /proc/<pid>/cgroup, so the process that sends a StepStart must be in
// that step's cgroup, as slurmstepd is. A worker moves itself into the
// cgroup a task names (writing its pid to cgroup.procs moves all its
// threads), then sends the request over the real socket with the real
// protobuf client, or opens the fake GPUs as a task of that step would.
const workerEnv = "GPUFENCE_CRASH_WORKER"

// callTimeout bounds one exchange with the agent, as the plugin's timeout
// does.
const callTimeout = 5 * time.Second

func init() {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(runWorker(os.Stdin, os.Stdout))
	}
}

// task is one thing a worker does, read as a JSON line.
type task struct {
	Op     string   `json:"op"` // "step", "probe" or "park"
	Dir    string   `json:"dir"`
	Socket string   `json:"socket,omitempty"`
	Job    uint32   `json:"job,omitempty"`
	Step   uint32   `json:"step,omitempty"`
	UID    uint32   `json:"uid,omitempty"`
	GPUs   *string  `json:"gpus,omitempty"`
	Paths  []string `json:"paths,omitempty"`
}

// answer is what came of a task, written as a JSON line.
type answer struct {
	// Unreached: the agent did not answer (killed, not listening).
	Unreached string `json:"unreached,omitempty"`
	// Refused is the agent's own error.
	Refused string   `json:"refused,omitempty"`
	GPUs    []uint32 `json:"gpus,omitempty"`
	// Open is the errno name of each probe path ("OK" when it opened).
	Open []string `json:"open,omitempty"`
	// Local is an error of the worker itself (a cgroup move failed).
	Local string `json:"local,omitempty"`
}

func runWorker(in io.Reader, out io.Writer) int {
	sc := bufio.NewScanner(in)
	enc := json.NewEncoder(out)
	for sc.Scan() {
		var tk task
		if err := json.Unmarshal(sc.Bytes(), &tk); err != nil {
			enc.Encode(answer{Local: err.Error()})
			continue
		}
		enc.Encode(tk.run())
	}
	return 0
}

func (tk task) run() answer {
	if err := os.WriteFile(filepath.Join(tk.Dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return answer{Local: fmt.Sprintf("move into %s: %v", tk.Dir, err)}
	}
	switch tk.Op {
	case "park":
		return answer{}
	case "step":
		// What the plugin sends from slurmstepd (spank/plugin/client.c gf_client_step_start).
		req := &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: tk.Job, StepId: tk.Step, Uid: tk.UID, StepGpus: tk.GPUs}}}
		resp, err := agentclient.Call(tk.Socket, req, callTimeout)
		switch {
		case errors.Is(err, agentclient.ErrAgent):
			return answer{Refused: resp.GetError()}
		case err != nil:
			return answer{Unreached: err.Error()}
		}
		return answer{GPUs: resp.GetGpus()}
	case "probe":
		var a answer
		for _, p := range tk.Paths {
			fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				var errno unix.Errno
				if errors.As(err, &errno) {
					a.Open = append(a.Open, unix.ErrnoName(errno))
				} else {
					a.Open = append(a.Open, err.Error())
				}
				continue
			}
			unix.Close(fd)
			a.Open = append(a.Open, "OK")
		}
		return a
	}
	return answer{Local: "unknown op " + strconv.Quote(tk.Op)}
}

// pool hands tasks to the worker processes; do may be called from many
// goroutines at once.
type pool struct {
	reqs chan poolReq
	// own are each worker's own queue (park reaches every one).
	own []chan poolReq
	wg  sync.WaitGroup
}

type poolReq struct {
	tk  task
	out chan answer
}

type workerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startPool starts size workers, born in the idle cgroup, outside Slurm's
// scope.
func startPool(t *testing.T, n *node, size int) *pool {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &pool{reqs: make(chan poolReq)}
	var procs []*workerProc
	for range size {
		fd, err := unix.Open(n.idle, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"=1")
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		in, err1 := cmd.StdinPipe()
		out, err2 := cmd.StdoutPipe()
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		err = cmd.Start()
		unix.Close(fd)
		if err != nil {
			t.Fatalf("start a worker: %v", err)
		}
		w := &workerProc{cmd: cmd, in: in, out: bufio.NewScanner(out)}
		procs = append(procs, w)
		own := make(chan poolReq)
		p.own = append(p.own, own)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			enc := json.NewEncoder(w.in)
			for {
				var r poolReq
				var ok bool
				select {
				case r, ok = <-p.reqs:
				case r, ok = <-own:
				}
				if !ok {
					return
				}
				var a answer
				if err := enc.Encode(r.tk); err != nil {
					a.Local = "send to worker: " + err.Error()
				} else if !w.out.Scan() {
					a.Local = fmt.Sprintf("worker pid %d gave no answer: %v", w.cmd.Process.Pid, w.out.Err())
				} else if err := json.Unmarshal(w.out.Bytes(), &a); err != nil {
					a.Local = "worker answer: " + err.Error()
				}
				r.out <- a
			}
		}()
	}
	t.Cleanup(func() {
		close(p.reqs)
		for _, c := range p.own {
			close(c)
		}
		p.wg.Wait()
		for _, w := range procs {
			w.in.Close()
			done := make(chan struct{})
			go func() { w.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				w.cmd.Process.Kill()
				<-done
			}
		}
	})
	return p
}

func (p *pool) do(tk task) answer {
	out := make(chan answer, 1)
	p.reqs <- poolReq{tk: tk, out: out}
	return <-out
}

// park moves every worker back to the idle cgroup, so that step cgroups
// can be removed.
func (p *pool) park(t *testing.T, idle string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]string, len(p.own))
	for i, c := range p.own {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make(chan answer, 1)
			c <- poolReq{tk: task{Op: "park", Dir: idle}, out: out}
			errs[i] = (<-out).Local
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			t.Fatal(e)
		}
	}
}
