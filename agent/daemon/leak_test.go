// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"github.com/gpufence/gpufence/agent/statefile"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/server"
	"github.com/gpufence/gpufence/bpf/devfilter"
	"github.com/gpufence/gpufence/proto/agentclient"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

var leakCycles = flag.Int("daemon.cycles", 10000, "step start/stop cycles of TestPrivilegedStepCycles (after 200 warm-up cycles)")

const (
	leakWarmup  = 200
	leakRSSMax  = 20 << 10 // KiB of RSS growth allowed over the cycles
	leakHelperE = "GPUFENCE_TEST_STEPD"
)

// The stepd helper: the test binary re-executed with GPUFENCE_TEST_STEPD set
// to the agent's socket. It stands in for slurmstepd (the test moves it from
// step cgroup to step cgroup) and answers one line per command on stdin:
//
//	start <job>  StepStart{job, step 0, uid 1000, SLURM_STEP_GPUS=0} over the
//	             socket: "ok <gpus>" or "err <message>"
//	open <path>  open(path, O_RDWR): "OK" or the errno name
func init() {
	sock := os.Getenv(leakHelperE)
	if sock == "" {
		return
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "start":
			job, _ := strconv.ParseUint(f[1], 10, 32)
			req := &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: uint32(job), StepId: 0, Uid: 1000, StepGpus: ptr("0")}}}
			resp, err := agentclient.Call(sock, req, 10*time.Second)
			if err != nil {
				fmt.Printf("err %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			fmt.Printf("ok %v\n", resp.Gpus)
		case len(f) == 2 && f[0] == "open":
			fd, err := unix.Open(f[1], unix.O_RDWR, 0)
			if err != nil {
				fmt.Println(unix.ErrnoName(err.(unix.Errno)))
				continue
			}
			unix.Close(fd)
			fmt.Println("OK")
		default:
			fmt.Printf("err unknown command %q\n", sc.Text())
		}
	}
	os.Exit(0)
}

// stepdHelper is the running helper process.
type stepdHelper struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func (h *stepdHelper) do(cmd string) (string, error) {
	if _, err := fmt.Fprintln(h.in, cmd); err != nil {
		return "", err
	}
	l, err := h.out.ReadString('\n')
	return strings.TrimSpace(l), err
}

// countRecorder counts audit records by event and decision; it keeps none,
// so that the test's own memory does not grow with the cycles.
type countRecorder struct {
	mu   sync.Mutex
	n    map[string]int
	lost uint64
	// rateFull sums ReportRateFull.
	rateFull uint64
}

func (c *countRecorder) Emit(r audit.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	k := string(r.Event)
	if r.Decision != "" {
		k += "/" + r.Decision
	}
	c.n[k]++
}

func (c *countRecorder) ReportLoss(n uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lost += n
}

func (c *countRecorder) ReportRateFull(byDecision map[string]uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range byDecision {
		c.rateFull += n
	}
}

func (c *countRecorder) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// errorLog discards the daemon's log (formatted at debug level, so the
// logging work is part of the cycle) but keeps the first ERROR lines.
type errorLog struct {
	mu    sync.Mutex
	count int
	first []string
}

func (e *errorLog) Write(p []byte) (int, error) {
	if strings.Contains(string(p), "level=ERROR") {
		e.mu.Lock()
		e.count++
		if len(e.first) < 5 {
			e.first = append(e.first, strings.TrimSpace(string(p)))
		}
		e.mu.Unlock()
	}
	return len(p), nil
}

// leakSnap is what must come back to its baseline.
type leakSnap struct {
	policies, pins, fds, goroutines int
	rssKiB                          int64
	rate                            int
	jobs, owners, exempts           int
	suppReported, suppForget        int
	stateJobs                       int
}

func (s leakSnap) String() string {
	return fmt.Sprintf("policies=%d pins=%d fds=%d goroutines=%d rss=%dKiB rate=%d jobs=%d owners=%d exempts=%d supp.reported=%d supp.forget=%d state_jobs=%d",
		s.policies, s.pins, s.fds, s.goroutines, s.rssKiB, s.rate, s.jobs, s.owners, s.exempts, s.suppReported, s.suppForget, s.stateJobs)
}

func countDir(t *testing.T, dir string) int {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

func vmRSS(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// settledGoroutines waits until the goroutine count stops moving (server
// goroutines of the last exchanges finishing) and returns it.
func settledGoroutines() int {
	n, stable := runtime.NumGoroutine(), 0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && stable < 5; {
		time.Sleep(20 * time.Millisecond)
		if m := runtime.NumGoroutine(); m == n {
			stable++
		} else {
			n, stable = m, 0
		}
	}
	return n
}

func snapshot(t *testing.T, d *Daemon, f *devfilter.Filter, pinDir, stateFile string) leakSnap {
	t.Helper()
	var s leakSnap
	pols, err := f.Policies()
	if err != nil {
		t.Fatal(err)
	}
	s.policies = len(pols)
	rate, err := f.Suppressed()
	if err != nil {
		t.Fatal(err)
	}
	s.rate = len(rate)
	s.pins = countDir(t, pinDir)
	c := d.reg.Counts()
	s.jobs, s.owners, s.exempts = c.Jobs, c.Steps+c.Exempt, c.Exempt
	s.suppReported, s.suppForget = d.ev.Tracked()
	// The state file is written off the request path: wait for it to show
	// what the registry holds.
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, _, err := statefile.Read(stateFile)
		if err != nil {
			t.Fatal(err)
		}
		if st != nil {
			s.stateJobs = len(st.Jobs)
		}
		if s.stateJobs == s.jobs || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.goroutines = settledGoroutines()
	runtime.GC()
	debug.FreeOSMemory()
	s.rssKiB = vmRSS(t)
	s.fds = countDir(t, "/proc/self/fd")
	return s
}

// TestPrivilegedStepCycles runs the agent in process (kernel filter in scope
// mode, pinned on a bpffs of its own, the real socket server) through
// warm-up plus -daemon.cycles job/step start/stop cycles, and checks that
// kernel entries, pins, fds, goroutines, the daemon's maps and RSS come back
// to their baseline.
func TestPrivilegedStepCycles(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the step cycle leak test runs 10,000 cycles against the kernel filter (about a minute)")
	}
	tr := newTree(t) // skips unless root, cgroup v2 and devfilter.Probe ok
	if m, _ := devfilter.Probe(); m != devfilter.ModeScope {
		t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", m)
	}

	// A bpffs of the test's own; unmounted after the daemon closed (cleanups
	// run last-registered first).
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
		t.Skipf("cannot mount a bpffs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(bpffs, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs %s: %v", bpffs, err)
		}
	})
	pinDir := filepath.Join(bpffs, "gpufence")

	elog := &errorLog{}
	log := slog.New(slog.NewTextHandler(elog, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rec := &countRecorder{}
	cfg := config.Default()
	cfg.SlurmdGPUTable = config.SlurmdGPUTableOff // gres.conf alone: slurmd_test.go runs slurmd -G
	cfg.SlurmConf = filepath.Join(tr.gres, "slurm.conf")
	cfg.Scope = tr.scope
	cfg.PinDir = pinDir
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.ReconcileInterval.Duration = time.Second
	cfg.Audit.FlushInterval.Duration = 100 * time.Millisecond
	d, err := New(cfg, log, NewKernelFilter(devfilter.Options{Mode: devfilter.ModeScope, NvidiaMajor: 195, Logger: log,
		AuditAllowed: devfilter.AuditAllowedNone, PinDir: pinDir}), 195, rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- d.Run(ctx) }()

	ln, err := server.Listen(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(ln, d.Handler(), log, 5*time.Second)
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-serveDone; err != nil {
			t.Errorf("serve: %v", err)
		}
		if err := <-runDone; err != nil {
			t.Errorf("run: %v", err)
		}
	})

	// One helper for all cycles, born in a parking cgroup outside the scope.
	park := filepath.Join(tr.root, "park")
	if err := os.Mkdir(park, 0o755); err != nil {
		t.Fatal(err)
	}
	h := &stepdHelper{cmd: exec.Command(os.Args[0])}
	h.cmd.Env = append(os.Environ(), leakHelperE+"="+cfg.Socket)
	h.cmd.Stderr = os.Stderr
	if h.in, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.out = bufio.NewReader(stdout)
	if err := tr.inCgroup(park, h.cmd, h.cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.cmd.Process.Kill()
		h.cmd.Wait()
	})
	pid := []byte(strconv.Itoa(h.cmd.Process.Pid))
	moveTo := func(dir string) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
			t.Fatalf("move the helper into %s: %v", dir, err)
		}
	}
	agent := func(msg any) {
		req := &pb.Request{}
		switch m := msg.(type) {
		case *pb.JobProlog:
			req.Msg = &pb.Request_JobProlog{JobProlog: m}
		case *pb.StepEnd:
			req.Msg = &pb.Request_StepEnd{StepEnd: m}
		case *pb.JobEpilog:
			req.Msg = &pb.Request_JobEpilog{JobEpilog: m}
		}
		if _, err := agentclient.Call(cfg.Socket, req, 10*time.Second); err != nil {
			t.Fatalf("%T: %v", msg, err)
		}
	}
	foreign := filepath.Join(tr.dev, "nvidia1")

	cycle := func(i int) {
		job := uint32(1000 + i)
		agent(&pb.JobProlog{JobId: job, Uid: 1000, JobGpus: ptr("0")})
		jobDir := filepath.Join(tr.scope, fmt.Sprintf("job_%d", job))
		stepDir := filepath.Join(jobDir, "step_0")
		slurmDir := filepath.Join(stepDir, "slurm")
		if err := os.MkdirAll(slurmDir, 0o755); err != nil {
			t.Fatal(err)
		}
		moveTo(slurmDir)
		if got, err := h.do(fmt.Sprintf("start %d", job)); err != nil || got != "ok [0]" {
			t.Fatalf("cycle %d: step start from the helper: %q, %v", i, got, err)
		}
		if got, err := h.do("open " + foreign); err != nil || got != "EPERM" {
			t.Fatalf("cycle %d: open of a foreign GPU: %q, %v (want EPERM)", i, got, err)
		}
		agent(&pb.StepEnd{JobId: job, StepId: 0})
		agent(&pb.JobEpilog{JobId: job})
		moveTo(park)
		for _, dir := range []string{slurmDir, stepDir, jobDir} {
			if err := os.Remove(dir); err != nil {
				t.Fatalf("cycle %d: %v", i, err)
			}
		}
	}
	// settle makes the asynchronous paths catch up: the event reader has
	// recorded every denial, then one flush forgets the ended steps' rate
	// entries, and a reconcile pass runs.
	settle := func(cycles int) {
		deadline := time.Now().Add(10 * time.Second)
		for rec.get(string(audit.EventGPUAccess)+"/"+audit.DecisionDenied) < cycles && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		d.rc.Pass()
		d.flush()
	}

	for i := 0; i < leakWarmup; i++ {
		cycle(i)
	}
	settle(leakWarmup)
	kf, ok := d.filter().(*devfilter.Filter)
	if !ok {
		t.Fatalf("filter is %T, want *devfilter.Filter", d.filter())
	}
	base := snapshot(t, d, kf, pinDir, cfg.StateFile)

	n := *leakCycles
	start := time.Now()
	for i := leakWarmup; i < leakWarmup+n; i++ {
		cycle(i)
	}
	wall := time.Since(start)
	settle(leakWarmup + n)
	after := snapshot(t, d, kf, pinDir, cfg.StateFile)

	denied := rec.get(string(audit.EventGPUAccess) + "/" + audit.DecisionDenied)
	t.Logf("%d step cycles in %s (%.2f ms/cycle): %s → %s; rss %+d KiB; denied records %d/%d, ring buffer lost %d, applied %d, released %d, agent errors %d",
		n, wall.Round(time.Millisecond), float64(wall.Microseconds())/1000/float64(max(n, 1)), base, after, after.rssKiB-base.rssKiB,
		denied, leakWarmup+n, rec.lost, rec.get(string(audit.EventPolicyApplied)), rec.get(string(audit.EventPolicyReleased)), elog.count)

	if after.policies != base.policies || after.pins != base.pins || after.fds != base.fds || after.rate != base.rate ||
		after.jobs != base.jobs || after.owners != base.owners || after.exempts != base.exempts ||
		after.suppReported != base.suppReported || after.suppForget != base.suppForget || after.stateJobs != base.stateJobs {
		t.Errorf("leak over %d cycles:\nbaseline %s\nafter    %s", n, base, after)
	}
	if dg := after.goroutines - base.goroutines; dg > 2 || dg < -2 {
		t.Errorf("goroutines %d → %d over %d cycles", base.goroutines, after.goroutines, n)
	}
	if g := after.rssKiB - base.rssKiB; g > leakRSSMax {
		t.Errorf("RSS grew by %d KiB over %d cycles (bound %d KiB)", g, n, leakRSSMax)
	}
	if want := leakWarmup + n; denied+int(rec.lost) < want {
		t.Errorf("%d denied records (+%d lost) for %d foreign opens: the audit path dropped some", denied, rec.lost, want)
	}
	if elog.count > 0 {
		t.Errorf("the agent logged %d errors, first: %s", elog.count, strings.Join(elog.first, "\n"))
	}
}
