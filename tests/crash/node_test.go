// SPDX-License-Identifier: Apache-2.0

package crash

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// nGPUs fake GPUs, /dev/nvidia0..7 as device nodes 195:0..7: an allowed
// open gives ENXIO (no driver), a denied one EPERM.
const nGPUs = 8

// node is one test node: a Slurm-shaped cgroup tree of the test's own,
// fake GPUs, a bpffs mount, state directory and socket of its own, and the
// real agent binary running on them as a separate process. Nothing of the
// host's (/sys/fs/bpf/gpufence, /var/lib/gpufence, /run/gpufence) is used.
type node struct {
	t    *testing.T
	mode string // "scope" or "per-cgroup"
	bin  string
	dir  string

	mount, root, scope, idle string
	bpffs, pinDir, stateDir  string
	stateFile, sock, cfg     string
	devs                     []string // /dev/nvidiaN, by index
	ctl                      string

	// exempt are the scope's own cgroups (system, slurmd) by cgroup id.
	exempt map[uint64]string

	agent  *proc
	starts int
	// startTook is how long the last start took until ready.
	startTook time.Duration
}

type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func newNode(t *testing.T, mode string) *node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs the agent, creates cgroups, device nodes and a bpffs mount")
	}
	mount, err := jobcgroup.Mountpoint()
	if err != nil {
		t.Skipf("no cgroup v2 mount: %v", err)
	}
	probed, err := devfilter.Probe()
	if err != nil {
		t.Skipf("kernel lacks the device filter's features: %v", err)
	}
	if mode == "scope" && probed != devfilter.ModeScope {
		t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", probed)
	}
	n := &node{t: t, mode: mode, bin: agentBinary(t), dir: t.TempDir(), mount: mount, exempt: map[uint64]string{}}

	root, err := os.MkdirTemp(mount, "gpufence-crash-test-")
	if err != nil {
		t.Fatal(err)
	}
	n.root = root
	t.Cleanup(n.removeCgroups)
	// A scope name of its own: an agent that searches for Slurm's scope
	// by node name never takes this one for its own.
	n.scope = filepath.Join(root, "system.slice", "gfcrash_slurmstepd.scope")
	n.idle = filepath.Join(root, "idle")
	for _, d := range []string{filepath.Join(n.scope, "system"), filepath.Join(n.scope, "slurmd"), n.idle} {
		mustMkdir(t, d)
	}
	for _, name := range []string{"system", "slurmd"} {
		id, err := jobcgroup.ID(filepath.Join(n.scope, name))
		if err != nil {
			t.Fatal(err)
		}
		n.exempt[id] = name
	}

	dev := filepath.Join(n.dir, "dev")
	mustMkdir(t, dev)
	for i := range nGPUs {
		p := filepath.Join(dev, fmt.Sprintf("nvidia%d", i))
		mknod(t, p, 195, uint32(i))
		n.devs = append(n.devs, p)
	}
	n.ctl = filepath.Join(dev, "nvidiactl")
	mknod(t, n.ctl, 195, 255)

	etc := filepath.Join(n.dir, "etc")
	mustMkdir(t, etc)
	writeFile(t, filepath.Join(etc, "slurm.conf"), "TaskPlugin=task/affinity,task/cgroup\n")
	writeFile(t, filepath.Join(etc, "gres.conf"), fmt.Sprintf("Name=gpu File=%s/nvidia[0-%d]\n", dev, nGPUs-1))

	n.bpffs = filepath.Join(n.dir, "bpffs")
	mustMkdir(t, n.bpffs)
	if err := unix.Mount("gpufence-crash", n.bpffs, "bpf", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
		t.Fatalf("mount a bpffs of the test's own: %v", err)
	}
	// Dropping the pins detaches the filter; the agent is stopped first
	// (cleanups run last registered first).
	t.Cleanup(func() {
		if err := unix.Unmount(n.bpffs, 0); err != nil {
			t.Errorf("umount %s: %v", n.bpffs, err)
		}
	})
	n.pinDir = filepath.Join(n.bpffs, "gpufence")
	n.stateDir = filepath.Join(n.dir, "state")
	n.stateFile = filepath.Join(n.stateDir, "state.json")
	n.sock = filepath.Join(n.dir, "run", "agent.sock")
	mustMkdir(t, filepath.Join(n.dir, "logs"))

	n.cfg = filepath.Join(etc, "agent.yaml")
	writeFile(t, n.cfg, fmt.Sprintf(`socket: %s
slurm_conf: %s
node_name: gfcrash
scope: %s
mode: %s
nvidia_major: 195
pin_dir: %s
state_file: %s
# No slurmctld here: a lost prolog record stays lost, and the test sees it.
recover_from_slurmctld: false
# A job found running with no record is adopted with no GPU: a lost
# record fails closed, and the test sees it as a refused step.
adopt_unconfirmed: deny
failopen_spool: ""
nvml: "off"
metrics:
  listen: ""
audit:
  file: %s
  journald: "off"
`, n.sock, filepath.Join(etc, "slurm.conf"), n.scope, mode, n.pinDir, n.stateFile, filepath.Join(n.dir, "logs", "audit.jsonl")))
	t.Cleanup(n.stop)
	return n
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mknod(t *testing.T, path string, major, minor uint32) {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatal(err)
	}
}

// removeCgroups removes the test's cgroup tree, deepest first.
func (n *node) removeCgroups() {
	var dirs []string
	filepath.WalkDir(n.root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := os.Remove(d); err != nil {
			n.t.Errorf("cleanup: %v", err)
		}
	}
}

// removeTree removes dir and the cgroups below it (no process may be in
// them).
func (n *node) removeTree(dir string) error {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	var errs []error
	for _, d := range dirs {
		errs = append(errs, os.Remove(d))
	}
	return errors.Join(errs...)
}

// start starts the agent; ready waits until it serves.
func (n *node) start() {
	n.t.Helper()
	n.starts++
	log := n.logPath(n.starts)
	f, err := os.Create(log)
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(n.bin, "agent", "--config", n.cfg)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("start the agent: %v", err)
	}
	p := &proc{cmd: cmd, log: log, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	n.agent = p
}

// ready waits until the agent says it serves (it logs "gpufence agent
// ready" once the filter is attached and the records restored), or fails
// the test with its log when it exits or takes too long.
func (n *node) ready(started time.Time) {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, _ := os.ReadFile(n.agent.log); bytes.Contains(b, []byte(`msg="gpufence agent ready"`)) {
			n.startTook = time.Since(started)
			return
		}
		select {
		case <-n.agent.done:
			n.t.Fatalf("the agent did not start (start %d exited: %v):\n%s", n.starts, n.agent.err, n.logTail(40))
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the agent is not ready after 20s (start %d):\n%s", n.starts, n.logTail(40))
		}
	}
}

// logPath is the log of the agent's start number i (from 1).
func (n *node) logPath(i int) string {
	return filepath.Join(n.dir, "logs", fmt.Sprintf("agent-%d.log", i))
}

// isReady reports whether the running (or killed) agent had said ready.
func (n *node) isReady() bool {
	b, _ := os.ReadFile(n.agent.log)
	return bytes.Contains(b, []byte(`msg="gpufence agent ready"`))
}

// kill is kill -9 of the agent; it returns once the process is reaped.
func (n *node) kill() {
	if err := syscall.Kill(n.agent.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		n.t.Errorf("kill -9 the agent: %v", err)
	}
	<-n.agent.done
}

// stop stops the agent as its unit does (SIGTERM) and waits for it.
func (n *node) stop() {
	if n.agent == nil {
		return
	}
	select {
	case <-n.agent.done:
		return
	default:
	}
	n.agent.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.agent.done:
	case <-time.After(15 * time.Second):
		n.t.Errorf("the agent did not stop in 15s after SIGTERM; killing it:\n%s", n.logTail(20))
		n.kill()
	}
}

func (n *node) logTail(lines int) string {
	b, _ := os.ReadFile(n.agent.log)
	l := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return n.agent.log + ":\n" + strings.Join(l, "\n")
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildDir  string
)

// agentBinary is the gpufence binary under test: $GPUFENCE_BIN, else built
// from this tree (as make builds it) once per test binary.
func agentBinary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("GPUFENCE_BIN"); b != "" {
		return b
	}
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, err = os.MkdirTemp("", "gpufence-crash-bin-"); err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(buildDir, "gpufence")
		cmd := exec.Command("go", "build", "-trimpath", "-o", builtBin, "./agent/cmd/gpufence")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./agent/cmd/gpufence: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}
