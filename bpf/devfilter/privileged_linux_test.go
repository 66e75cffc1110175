// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/gpufence/gpufence/agent/cgroup"
	"golang.org/x/sys/unix"
)

// childEnv makes the test binary a child that opens the device nodes in the
// directory it names and prints one "name errno" line per node.
const childEnv = "GPUFENCE_DEVFILTER_TEST_CHILD_DEVDIR"

// repeatEnv makes the child open every node that many times before the
// reported round, to flood the ring buffer.
const repeatEnv = "GPUFENCE_DEVFILTER_TEST_CHILD_REPEAT"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		os.Exit(childOpenAll(dir))
	}
	if spec := os.Getenv(stormEnv); spec != "" {
		os.Exit(childStorm(spec))
	}
	if dir := os.Getenv(loopEnv); dir != "" {
		os.Exit(childLoop(dir))
	}
	if node := os.Getenv(execEnv); node != "" {
		os.Exit(childExec(node))
	}
	os.Exit(m.Run())
}

func childOpenAll(dir string) int {
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for _, line := range strings.Split(string(cg), "\n") {
		if strings.HasPrefix(line, "0::") {
			fmt.Println("cgroup", strings.TrimPrefix(line, "0::"))
		}
	}
	repeat, _ := strconv.Atoi(os.Getenv(repeatEnv))
	for range repeat {
		for _, n := range testNodes {
			if fd, err := unix.Open(filepath.Join(dir, n.name), unix.O_RDWR|unix.O_CLOEXEC, 0); err == nil {
				unix.Close(fd)
			}
		}
	}
	for _, name := range slices.Concat(nodeNames(testNodes), capsNodeNames(), fabricNodeNames()) {
		fd, err := unix.Open(filepath.Join(dir, name), unix.O_RDWR|unix.O_CLOEXEC, 0)
		var errno unix.Errno
		if err == nil {
			unix.Close(fd)
		} else if !errors.As(err, &errno) {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Println(name, int(errno))
	}
	return 0
}

func nodeNames(nodes []testNode) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.name)
	}
	return out
}

type testNode struct {
	name         string
	major, minor uint32
	// gpu: narrowed by the filter; otherwise always allowed.
	gpu bool
}

// uvmMajor is unused on the test host, like nvidia-uvm's dynamic major.
const uvmMajor = 240

var testNodes = []testNode{
	{"nvidia0", 195, 0, true},
	{"nvidia1", 195, 1, true},
	{"nvidia2", 195, 2, true},
	{"nvidia3", 195, 3, true},
	{"nvidiactl", 195, 255, false},
	{"nvidia-modeset", 195, 254, false},
	{"nvidia-uvm", uvmMajor, 0, false},
	{"null", 1, 3, false},
}

// allowedErrno is what opening a node gives when the cgroup allows it: no
// driver behind the fake NVIDIA majors, /dev/null opens.
func allowedErrno(n testNode) unix.Errno {
	if n.major == 1 {
		return 0
	}
	return unix.ENXIO
}

type fixture struct {
	mnt    string
	root   string
	scope  string
	devDir string
	// capsMajor is the fake nvidia-caps major of the nodes under
	// devDir/nvidia-caps (capsTestMinors).
	capsMajor uint32
	// nvswitchMajor and nvlinkMajor are the fake majors of fabricNodes.
	nvswitchMajor, nvlinkMajor uint32
}

func requirePrivileges(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (loads BPF programs, creates cgroups and device nodes)")
	}
	mnt, err := cgroup.RootMount()
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	return mnt
}

func requireMode(t *testing.T, mode Mode) {
	t.Helper()
	best, err := Probe()
	if err != nil {
		t.Skipf("skipping: kernel lacks a device filter feature: %v", err)
	}
	if mode == ModeScope && best != ModeScope {
		t.Skipf("skipping: kernel supports only %s mode (no bpf_get_current_ancestor_cgroup_id for CGROUP_DEVICE)", best)
	}
}

// newFixture builds <mnt>/gpufence-devfilter-test-<rand>/slice/scope with
// Slurm's layout below it, and the fake device nodes.
func newFixture(t *testing.T) *fixture {
	mnt := requirePrivileges(t)
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	fx := &fixture{mnt: mnt, root: filepath.Join(mnt, "gpufence-devfilter-test-"+hex.EncodeToString(rnd[:]))}
	fx.scope = filepath.Join(fx.root, "slice", "test_slurmstepd.scope")
	t.Cleanup(func() { removeTree(t, fx.root) })
	for _, d := range []string{
		"job_1/step_0/user/task_0", "job_1/step_0/slurm",
		"job_2/step_0/user/task_0",
		"job_3/step_0/user/task_0",
		"system",
	} {
		if err := os.MkdirAll(filepath.Join(fx.scope, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fx.devDir = t.TempDir()
	for _, n := range testNodes {
		dev := unix.Mkdev(n.major, n.minor)
		if err := unix.Mknod(filepath.Join(fx.devDir, n.name), unix.S_IFCHR|0o666, int(dev)); err != nil {
			t.Fatalf("mknod %s: %v", n.name, err)
		}
	}
	majors := fakeMajors(t, 3)
	fx.capsMajor, fx.nvswitchMajor, fx.nvlinkMajor = majors[0], majors[1], majors[2]
	for _, n := range fabricNodes {
		dev := unix.Mkdev(fx.fabricMajor(n), n.minor)
		if err := unix.Mknod(filepath.Join(fx.devDir, n.name), unix.S_IFCHR|0o666, int(dev)); err != nil {
			t.Fatalf("mknod %s: %v", n.name, err)
		}
	}
	if err := os.Mkdir(filepath.Join(fx.devDir, "nvidia-caps"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, name := range capsNodeNames() {
		dev := unix.Mkdev(fx.capsMajor, capsTestMinors[i])
		if err := unix.Mknod(filepath.Join(fx.devDir, name), unix.S_IFCHR|0o666, int(dev)); err != nil {
			t.Fatalf("mknod %s: %v", name, err)
		}
	}
	return fx
}

// removeTree removes the cgroup dirs below and including root, deepest first.
func removeTree(t *testing.T, root string) {
	var dirs []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, d := range dirs {
		var err error
		for range 50 {
			if err = unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) || !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			t.Errorf("remove test cgroup %s: %v", d, err)
		}
	}
}

func (fx *fixture) path(rel string) string { return filepath.Join(fx.scope, rel) }

func (fx *fixture) cgroup(t *testing.T, rel string) cgroup.Cgroup {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(fx.path(rel), &st); err != nil {
		t.Fatal(err)
	}
	return cgroup.Cgroup{ID: st.Ino, Path: fx.path(rel)}
}

// openAll runs a child in the cgroup rel and returns its pid and the errno of
// opening each node.
func (fx *fixture) openAll(t *testing.T, rel string) (int, map[string]unix.Errno) {
	t.Helper()
	return fx.openAllEnv(t, rel)
}

// openAllEnv is openAll with env added to the child's environment.
func (fx *fixture) openAllEnv(t *testing.T, rel string, env ...string) (int, map[string]unix.Errno) {
	t.Helper()
	fd, err := unix.Open(fx.path(rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), childEnv+"="+fx.devDir), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child in %s: %v", rel, err)
	}
	got := map[string]unix.Errno{}
	wantCgroup := strings.TrimPrefix(fx.path(rel), fx.mnt)
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		name, val, _ := strings.Cut(sc.Text(), " ")
		if name == "cgroup" {
			if val != wantCgroup {
				t.Fatalf("child ran in cgroup %s, want %s", val, wantCgroup)
			}
			continue
		}
		n, err := strconv.Atoi(val)
		if err != nil {
			t.Fatalf("child output %q: %v", sc.Text(), err)
		}
		got[name] = unix.Errno(n)
	}
	if want := len(testNodes) + len(capsTestMinors) + len(fabricNodes); len(got) != want {
		t.Fatalf("child output %q: want %d nodes", out, want)
	}
	return cmd.Process.Pid, got
}

// expectGPUs checks that exactly the GPUs in allowed open from rel (and the
// non-GPU nodes always do). It returns the child's pid.
func (fx *fixture) expectGPUs(t *testing.T, rel string, allowed ...uint32) int {
	t.Helper()
	pid, got := fx.openAll(t, rel)
	for _, n := range testNodes {
		want := allowedErrno(n)
		if n.gpu && !slices.Contains(allowed, n.minor) {
			want = unix.EPERM
		}
		if got[n.name] != want {
			t.Errorf("open %s from %s: errno %d (%v), want %d (%v)", n.name, rel, int(got[n.name]), got[n.name], int(want), want)
		}
	}
	return pid
}

// eventCollector reads events of f until it is closed.
type eventCollector struct {
	ch   chan Event
	done chan error
}

func collectEvents(f *Filter) *eventCollector {
	c := &eventCollector{ch: make(chan Event, 1024), done: make(chan error, 1)}
	go func() {
		for {
			e, err := f.ReadEvent()
			if err != nil {
				c.done <- err
				return
			}
			c.ch <- e
		}
	}()
	return c
}

func (c *eventCollector) wait(t *testing.T, what string, match func(Event) bool) Event {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case e := <-c.ch:
			if match(e) {
				return e
			}
		case err := <-c.done:
			t.Fatalf("waiting for %s: %v", what, err)
		case <-timeout:
			t.Fatalf("no event for %s", what)
		}
	}
}

func wantComm() string {
	c := filepath.Base(os.Args[0])
	if len(c) > 15 {
		c = c[:15]
	}
	return c
}

func newFilter(t *testing.T, opts Options) *Filter {
	t.Helper()
	f, err := New(opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts, err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return f
}

func TestPrivilegedScopeMode(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModeScope)

	f := newFilter(t, Options{Mode: ModeScope, ScopeDir: fx.scope})
	if f.Mode() != ModeScope {
		t.Fatalf("Mode() = %q", f.Mode())
	}
	events := collectEvents(f)
	step1, job2step, job3, system := fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "job_2/step_0"), fx.cgroup(t, "job_3"), fx.cgroup(t, "system")
	for cg, p := range map[cgroup.Cgroup]Policy{
		step1:  {GPUMinors: []uint32{0}},
		job3:   {GPUMinors: []uint32{2, 3}},
		system: {AllowAll: true},
	} {
		if err := f.Set(cg, p); err != nil {
			t.Fatal(err)
		}
	}

	fx.expectGPUs(t, "job_1/step_0/user/task_0", 0)
	fx.expectGPUs(t, "job_1/step_0/slurm", 0)
	// No entry for job 2's step or job: fail closed.
	pid := fx.expectGPUs(t, "job_2/step_0/user/task_0")
	// Job-level entry applies to its steps.
	fx.expectGPUs(t, "job_3/step_0/user/task_0", 2, 3)
	fx.expectGPUs(t, "system", 0, 1, 2, 3)

	e := events.wait(t, "job 2 opening nvidia1", func(e Event) bool { return int(e.TGID) == pid && e.Minor == 1 })
	if e.CgroupID != job2step.ID || e.Decision != DecisionDenied || e.Major != 195 ||
		e.Access != AccessRead|AccessWrite || e.Comm != wantComm() || e.UID != 0 || e.PID == 0 || e.Time == 0 {
		t.Errorf("event = %+v, want denied read,write of 195:1 by %s in cgroup %d", e, wantComm(), job2step.ID)
	}
	e = events.wait(t, "job 3 opening nvidia0", func(e Event) bool { return e.Minor == 0 && e.CgroupID == job3.ID })
	if e.Decision != DecisionDenied {
		t.Errorf("event = %+v, want denied", e)
	}

	got, err := f.Policies()
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64]Policy{step1.ID: {GPUMinors: []uint32{0}}, job3.ID: {GPUMinors: []uint32{2, 3}}, system.ID: {AllowAll: true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Policies() = %v, want %v", got, want)
	}

	// A new policy replaces the old one.
	if err := f.Set(step1, Policy{GPUMinors: []uint32{1}}); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_0", 1)
	if err := f.Remove(step1); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_0")
	if err := f.Remove(step1); err != nil {
		t.Errorf("Remove of an absent entry: %v", err)
	}
	if err := f.Set(step1, Policy{GPUMinors: []uint32{254}}); err == nil {
		t.Error("Set accepted minor 254")
	}
	if n, err := f.Lost(); err != nil || n != 0 {
		t.Errorf("Lost() = %d, %v; want 0", n, err)
	}

	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-events.done; !errors.Is(err, ErrClosed) {
		t.Errorf("ReadEvent after Close: %v, want ErrClosed", err)
	}
	fx.expectGPUs(t, "job_2/step_0/user/task_0", 0, 1, 2, 3)
}

func TestPrivilegedPerCgroupMode(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModePerCgroup)

	f := newFilter(t, Options{Mode: ModePerCgroup})
	if f.Mode() != ModePerCgroup {
		t.Fatalf("Mode() = %q", f.Mode())
	}
	events := collectEvents(f)
	step1, system := fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "system")
	if err := f.Set(step1, Policy{GPUMinors: []uint32{0}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Set(system, Policy{AllowAll: true}); err != nil {
		t.Fatal(err)
	}

	pid := fx.expectGPUs(t, "job_1/step_0/user/task_0", 0)
	// Nothing is attached above job 2: the kernel does not narrow it in
	// this mode.
	fx.expectGPUs(t, "job_2/step_0/user/task_0", 0, 1, 2, 3)
	fx.expectGPUs(t, "system", 0, 1, 2, 3)

	e := events.wait(t, "job 1 opening nvidia2", func(e Event) bool { return int(e.TGID) == pid && e.Minor == 2 })
	if e.CgroupID != step1.ID || e.Decision != DecisionDenied || e.Major != 195 ||
		e.Access != AccessRead|AccessWrite || e.Comm != wantComm() || e.PID == 0 {
		t.Errorf("event = %+v, want denied read,write of 195:2 by %s in cgroup %d", e, wantComm(), step1.ID)
	}

	// Updating the storage takes effect without re-attaching.
	if err := f.Set(step1, Policy{GPUMinors: []uint32{1, 3}}); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_0", 1, 3)
	got, err := f.Policies()
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64]Policy{step1.ID: {GPUMinors: []uint32{1, 3}}, system.ID: {AllowAll: true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Policies() = %v, want %v", got, want)
	}
	if err := f.Set(cgroup.Cgroup{ID: step1.ID + 1, Path: step1.Path}, Policy{}); err == nil {
		t.Error("Set attached to a path whose inode is not the cgroup id")
	}

	// Remove detaches: the step is no longer narrowed. Re-attaching must
	// not bring the old policy back before Set writes the new one.
	if err := f.Remove(step1); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_0", 0, 1, 2, 3)
	if err := f.Remove(step1); err != nil {
		t.Errorf("Remove of an absent entry: %v", err)
	}
	if err := f.Set(step1, Policy{}); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_0")

	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-events.done; !errors.Is(err, ErrClosed) {
		t.Errorf("ReadEvent after Close: %v, want ErrClosed", err)
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_0", 0, 1, 2, 3)
}

// attachSlurmLike attaches an allow-all device program at rel with
// BPF_F_ALLOW_OVERRIDE and no MULTI, as Slurm does with ConstrainDevices=yes.
func (fx *fixture) attachSlurmLike(t *testing.T, rel string) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.CGroupDevice,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(fx.path(rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		prog.Close()
		t.Fatal(err)
	}
	err = link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: fd, Program: prog, Attach: ebpf.AttachCGroupDevice, Flags: unix.BPF_F_ALLOW_OVERRIDE,
	})
	if err != nil {
		unix.Close(fd)
		prog.Close()
		t.Fatalf("attach Slurm-like program to %s: %v", rel, err)
	}
	t.Cleanup(func() {
		err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: fd, Program: prog, Attach: ebpf.AttachCGroupDevice})
		if err != nil {
			t.Errorf("detach Slurm-like program: %v", err)
		}
		unix.Close(fd)
		prog.Close()
	})
}

func TestPrivilegedSlurmConstrainDevicesScope(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModeScope)
	f := newFilter(t, Options{ScopeDir: fx.scope})
	if f.Mode() != ModeScope {
		t.Fatalf("ModeAuto picked %q on a kernel that supports %q", f.Mode(), ModeScope)
	}
	fx.attachSlurmLike(t, "job_1")
	if err := f.Set(fx.cgroup(t, "job_1/step_0"), Policy{GPUMinors: []uint32{3}}); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_0", 3)
}

func TestPrivilegedSlurmConstrainDevicesPerCgroup(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModePerCgroup)
	fx.attachSlurmLike(t, "job_1")
	f := newFilter(t, Options{Mode: ModePerCgroup})
	if err := f.Set(fx.cgroup(t, "job_1/step_0"), Policy{GPUMinors: []uint32{3}}); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, "job_1/step_0/user/task_0", 3)
}

func TestPrivilegedRingBufferFullStillDenies(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModeScope)
	// No rate limit, and nobody reads events: 4 denials a round overflow
	// the 256 KiB buffer (80 bytes a record) long before 2000 rounds.
	f := newFilter(t, Options{Mode: ModeScope, ScopeDir: fx.scope, RateBurst: math.MaxUint32})
	t.Setenv(repeatEnv, "2000")
	fx.expectGPUs(t, "job_2/step_0/user/task_0")
	n, err := f.Lost()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || n > 4*2001 {
		t.Fatalf("Lost() = %d, want between 1 and %d", n, 4*2001)
	}
	t.Logf("lost %d of %d denial events", n, 4*2001)
}

func TestPrivilegedProbe(t *testing.T) {
	requirePrivileges(t)
	mode, err := Probe()
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	t.Logf("best mode on this kernel: %s", mode)
	if mode != ModeScope && mode != ModePerCgroup {
		t.Fatalf("Probe() = %q", mode)
	}
}

func TestPrivilegedNewRejectsNonCgroupScope(t *testing.T) {
	requirePrivileges(t)
	requireMode(t, ModeScope)
	dir := t.TempDir()
	if _, err := New(Options{Mode: ModeScope, ScopeDir: dir}); err == nil || !strings.Contains(err.Error(), "not in a cgroup2") {
		t.Fatalf("New with scope %s: %v, want a not-cgroup2 error", dir, err)
	}
}

// A policy with AuditOnly allows what it does not grant, reported as
// would-deny, for its cgroup alone; BeforeAttach's entries are in the map
// before the program first runs.
func TestPrivilegedPolicyAuditOnly(t *testing.T) {
	for _, mode := range []Mode{ModeScope, ModePerCgroup} {
		t.Run(string(mode), func(t *testing.T) {
			fx := newFixture(t)
			requireMode(t, mode)
			adopted, other := fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "job_2/step_0")
			called := false
			f := newFilter(t, Options{Mode: mode, ScopeDir: fx.scope, BeforeAttach: func(f *Filter) error {
				called = true
				if mode == ModeScope {
					// Not attached yet: nothing is narrowed.
					fx.expectGPUs(t, "job_2/step_0/user/task_0", 0, 1, 2, 3)
				}
				if err := f.Set(adopted, Policy{AuditOnly: true, GPUMinors: []uint32{1}}); err != nil {
					return err
				}
				return f.Set(other, Policy{GPUMinors: []uint32{2}})
			}})
			if !called {
				t.Fatal("BeforeAttach was not called")
			}
			events := collectEvents(f)
			pid := fx.expectGPUs(t, "job_1/step_0/user/task_0", 0, 1, 2, 3)
			fx.expectGPUs(t, "job_2/step_0/user/task_0", 2)
			e := events.wait(t, "audit-only open of nvidia0", func(e Event) bool { return int(e.TGID) == pid && e.Minor == 0 })
			if e.Decision != DecisionWouldDeny || e.CgroupID != adopted.ID {
				t.Errorf("event = %+v, want would_deny in cgroup %d", e, adopted.ID)
			}
			got, err := f.Policies()
			if err != nil {
				t.Fatal(err)
			}
			if p := got[adopted.ID]; !p.AuditOnly || fmt.Sprint(p.GPUMinors) != "[1]" {
				t.Errorf("Policies()[adopted] = %+v, want audit-only with minor 1", p)
			}
			if p := got[other.ID]; p.AuditOnly {
				t.Errorf("Policies()[other] = %+v: audit-only leaked to another cgroup", p)
			}
		})
	}
}
