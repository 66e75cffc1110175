// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gpufence/gpufence/agent/cgroup"
	"golang.org/x/sys/unix"
)

// loopEnv makes the test binary a child that opens nvidia1 (a foreign GPU)
// and nvidia0 (its own) in the directory it names until its stdin closes,
// then prints "name errno count" lines.
const loopEnv = "GPUFENCE_DEVFILTER_TEST_CHILD_LOOP"

// openLoop is a childLoop process in a task cgroup of the fixture.
type openLoop struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startOpenLoop starts a childLoop in the fixture's cgroup task (relative
// path) and returns once it opens devices.
func startOpenLoop(t *testing.T, fx *fixture, task string) *openLoop {
	t.Helper()
	fd, err := unix.Open(fx.path(task), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), loopEnv+"="+fx.devDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("child: %q, %v", sc.Text(), sc.Err())
	}
	return &openLoop{cmd: cmd, stdin: stdin, out: sc}
}

// stop ends the loop and returns how often each device opened with each
// errno.
func (l *openLoop) stop(t *testing.T) map[string]map[unix.Errno]int {
	t.Helper()
	l.stdin.Close()
	counts := map[string]map[unix.Errno]int{"nvidia0": {}, "nvidia1": {}}
	for l.out.Scan() {
		var (
			name     string
			errno, k int
		)
		if _, err := fmt.Sscan(l.out.Text(), &name, &errno, &k); err != nil {
			t.Fatalf("child output %q: %v", l.out.Text(), err)
		}
		counts[name][unix.Errno(errno)] = k
	}
	if err := l.cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	return counts
}

func childLoop(dir string) int {
	var stop atomic.Bool
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop.Store(true)
	}()
	counts := map[string]map[unix.Errno]int{"nvidia0": {}, "nvidia1": {}}
	// "ready" after the first round: a parent that stops the loop at once
	// still gets a count of each device (printed before, a stop could
	// come before any open, and the test would fail for nothing).
	for round := 0; round == 0 || !stop.Load(); round++ {
		if round == 1 {
			fmt.Println("ready")
		}
		for _, n := range []string{"nvidia1", "nvidia0"} {
			fd, err := unix.Open(filepath.Join(dir, n), unix.O_RDWR|unix.O_CLOEXEC, 0)
			var errno unix.Errno
			if err == nil {
				unix.Close(fd)
			} else if !errors.As(err, &errno) {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
			counts[n][errno]++
		}
	}
	for n, c := range counts {
		for errno, k := range c {
			fmt.Println(n, int(errno), k)
		}
	}
	return 0
}

// newPinDir mounts a bpffs instance of the test's own in a temp dir (never
// /sys/fs/bpf) and returns a pin dir inside it; the cleanup unmounts it.
func newPinDir(t *testing.T) string {
	t.Helper()
	mnt := t.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Skipf("skipping: mount bpffs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount test bpffs: %v", err)
		}
	})
	return filepath.Join(mnt, "gpufence")
}

func pinModes(t *testing.T, fn func(t *testing.T, mode Mode)) {
	for _, mode := range []Mode{ModeScope, ModePerCgroup} {
		t.Run(string(mode), func(t *testing.T) { fn(t, mode) })
	}
}

func pinOpts(fx *fixture, mode Mode, pinDir string) Options {
	o := Options{Mode: mode, PinDir: pinDir}
	if mode == ModeScope {
		o.ScopeDir = fx.scope
	}
	return o
}

func mustNew(t *testing.T, o Options) *Filter {
	t.Helper()
	f, err := New(o)
	if err != nil {
		t.Fatalf("New(%+v): %v", o, err)
	}
	return f
}

func mustClose(t *testing.T, f *Filter) {
	t.Helper()
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func pinList(t *testing.T, dir string) []string {
	t.Helper()
	names, err := pinNames(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// unpinAtEnd removes what the test left pinned before the bpffs goes away.
func unpinAtEnd(t *testing.T, o Options) {
	t.Cleanup(func() {
		if names, _ := pinNames(o.PinDir); len(names) == 0 {
			return
		}
		if err := removePins(o.PinDir, pinList(t, o.PinDir)); err != nil {
			t.Errorf("remove pins: %v", err)
		}
	})
}

func TestPrivilegedPinSurvivesClose(t *testing.T) {
	pinModes(t, func(t *testing.T, mode Mode) {
		fx := newFixture(t)
		requireMode(t, mode)
		o := pinOpts(fx, mode, newPinDir(t))
		unpinAtEnd(t, o)
		const task = "job_1/step_0/user/task_0"

		f := mustNew(t, o)
		if f.Adopted() {
			t.Error("Adopted() on an empty pin dir")
		}
		step1 := fx.cgroup(t, "job_1/step_0")
		if err := f.Set(step1, Policy{GPUMinors: []uint32{0}}); err != nil {
			t.Fatal(err)
		}
		mustClose(t, f)
		t.Logf("pins: %v", pinList(t, o.PinDir))
		// No process holds the filter: the pins keep it in force.
		fx.expectGPUs(t, task, 0)

		f = mustNew(t, o)
		defer f.Close()
		if !f.Adopted() {
			t.Error("Adopted() = false after a pinned filter")
		}
		got, err := f.Policies()
		if err != nil {
			t.Fatal(err)
		}
		if want := map[uint64]Policy{step1.ID: {GPUMinors: []uint32{0}}}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Policies() after adoption = %v, want %v", got, want)
		}
		fx.expectGPUs(t, task, 0)
		if err := f.Remove(step1); err != nil {
			t.Fatal(err)
		}
		if mode == ModeScope {
			fx.expectGPUs(t, task)
		} else {
			fx.expectGPUs(t, task, 0, 1, 2, 3)
			if slices.Contains(pinList(t, o.PinDir), cgroupPinName(step1.ID)) {
				t.Error("Remove left the cgroup's link pinned")
			}
		}
		if err := f.Set(step1, Policy{GPUMinors: []uint32{2}}); err != nil {
			t.Fatal(err)
		}
		fx.expectGPUs(t, task, 2)

		if err := f.Unpin(); err != nil {
			t.Fatalf("Unpin: %v", err)
		}
		fx.expectGPUs(t, task, 0, 1, 2, 3)
		if _, err := os.Stat(o.PinDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin dir after Unpin: %v (left %v)", err, pinList(t, o.PinDir))
		}
	})
}

// changeLayout makes New see a changed map layout: the rate map and, in
// ModeScope, the policies map get other sizes (they are created anew, their
// entries copied); in ModePerCgroup the storage map gets another flag (new
// storage: each cgroup gets a new link).
func changeLayout(mode Mode, spec *ebpf.CollectionSpec) {
	spec.Maps["rate"].MaxEntries /= 2
	if mode == ModeScope {
		spec.Maps["policies"].MaxEntries /= 2
	} else {
		spec.Maps["storage"].Flags |= unix.BPF_F_RDONLY_PROG
	}
}

func TestPrivilegedPinNoWindowOnUpgrade(t *testing.T) {
	pinModes(t, func(t *testing.T, mode Mode) {
		fx := newFixture(t)
		requireMode(t, mode)
		o := pinOpts(fx, mode, newPinDir(t))
		unpinAtEnd(t, o)
		t.Cleanup(func() { testSpecHook = nil })

		f := mustNew(t, o)
		step1 := fx.cgroup(t, "job_1/step_0")
		if err := f.Set(step1, Policy{GPUMinors: []uint32{0}}); err != nil {
			t.Fatal(err)
		}
		mustClose(t, f)

		loop := startOpenLoop(t, fx, "job_1/step_0/user/task_0")

		const upgrades = 20
		for i := range upgrades {
			// Every other start is an upgrade that changes maps.
			testSpecHook = nil
			if i%2 == 0 {
				testSpecHook = changeLayout
			}
			f := mustNew(t, o)
			if !f.Adopted() {
				t.Errorf("start %d: Adopted() = false", i)
			}
			// The changed maps were really created anew.
			if want := uint32(16384) >> (1 - i%2); f.rate.MaxEntries() != want {
				t.Errorf("start %d: rate map of %d entries, want %d", i, f.rate.MaxEntries(), want)
			}
			got, err := f.Policies()
			if err != nil {
				t.Fatal(err)
			}
			if want := map[uint64]Policy{step1.ID: {GPUMinors: []uint32{0}}}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("start %d: Policies() = %v, want %v", i, got, want)
			}
			mustClose(t, f)
		}
		testSpecHook = nil

		counts := loop.stop(t)
		t.Logf("%d starts (%d with changed maps): foreign GPU nvidia1: %s; own GPU nvidia0: %s",
			upgrades, upgrades/2, fmtCounts(counts["nvidia1"]), fmtCounts(counts["nvidia0"]))
		for errno, k := range counts["nvidia1"] {
			if errno != unix.EPERM {
				t.Errorf("foreign GPU opened with errno %d (%v) %d times during upgrades, want EPERM only", int(errno), errno, k)
			}
		}
		if counts["nvidia1"][unix.EPERM] == 0 || counts["nvidia0"][unix.ENXIO] == 0 {
			t.Errorf("child did not run through the upgrades: %v", counts)
		}
		for errno, k := range counts["nvidia0"] {
			// A new link on a cgroup starts with zero storage (no GPU)
			// until New copies the policy: per-cgroup mode may deny the
			// own GPU for an instant when the storage map changed.
			if errno != unix.ENXIO && !(errno == unix.EPERM && mode == ModePerCgroup) {
				t.Errorf("own GPU opened with errno %d (%v) %d times during upgrades", int(errno), errno, k)
			}
		}
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 0)
	})
}

func fmtCounts(c map[unix.Errno]int) string {
	var parts []string
	for errno, k := range c {
		name := "success"
		if errno != 0 {
			name = unix.ErrnoName(errno)
		}
		parts = append(parts, name+"="+strconv.Itoa(k))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

func TestPrivilegedPinStaleScope(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModeScope)
	requireMode(t, ModePerCgroup)
	pin := newPinDir(t)
	const task = "job_1/step_0/user/task_0"
	step1 := fx.cgroup(t, "job_1/step_0")

	// A previous run on another scope: its pins are stale.
	old := Options{Mode: ModeScope, ScopeDir: fx.path("job_1"), PinDir: pin}
	unpinAtEnd(t, old)
	f := mustNew(t, old)
	if err := f.Set(step1, Policy{GPUMinors: []uint32{3}}); err != nil {
		t.Fatal(err)
	}
	mustClose(t, f)
	fx.expectGPUs(t, task, 3)

	f = mustNew(t, Options{Mode: ModeScope, ScopeDir: fx.scope, PinDir: pin})
	if f.Adopted() {
		t.Error("adopted the pins of another scope")
	}
	if got, err := f.Policies(); err != nil || len(got) != 0 {
		t.Errorf("Policies() = %v, %v; want none", got, err)
	}
	// The old link on job_1 is gone: only the new scope's (no entry) denies.
	fx.expectGPUs(t, task)
	if err := f.Set(step1, Policy{GPUMinors: []uint32{1}}); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, task, 1)
	mustClose(t, f)

	// A previous run in another mode: stale too.
	f = mustNew(t, Options{Mode: ModePerCgroup, PinDir: pin})
	if f.Adopted() {
		t.Error("adopted the pins of another mode")
	}
	fx.expectGPUs(t, task, 0, 1, 2, 3)
	if err := f.Unpin(); err != nil {
		t.Fatal(err)
	}
}

func TestPrivilegedPinCleanStale(t *testing.T) {
	pinModes(t, func(t *testing.T, mode Mode) {
		fx := newFixture(t)
		requireMode(t, mode)
		o := pinOpts(fx, mode, newPinDir(t))
		unpinAtEnd(t, o)
		if err := os.MkdirAll(fx.path("job_4/step_0/user/task_0"), 0o755); err != nil {
			t.Fatal(err)
		}
		step1, step2, step4 := fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "job_2/step_0"), fx.cgroup(t, "job_4/step_0")

		f := mustNew(t, o)
		for cg, p := range map[cgroup.Cgroup]Policy{step1: {GPUMinors: []uint32{0}}, step2: {GPUMinors: []uint32{1}}, step4: {GPUMinors: []uint32{2}}} {
			if err := f.Set(cg, p); err != nil {
				t.Fatal(err)
			}
		}
		// Denials leave rate entries of job 4.
		fx.expectGPUs(t, "job_4/step_0/user/task_0", 2)
		sup, err := f.Suppressed()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(slices.Collect(mapKeys(sup)), func(k RateKey) bool { return k.CgroupID == step4.ID }) {
			t.Fatalf("no rate entry of job 4: %v", sup)
		}
		mustClose(t, f)
		removeTree(t, fx.path("job_4"))

		live := func(id uint64) bool {
			fd, err := cgroup.OpenByID(id)
			if err != nil {
				return false
			}
			unix.Close(fd)
			return true
		}
		removed, err := CleanStale(o.PinDir, live)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(removed, []uint64{step4.ID}) {
			t.Errorf("CleanStale removed %v, want [%d]", removed, step4.ID)
		}
		if slices.Contains(pinList(t, o.PinDir), cgroupPinName(step4.ID)) {
			t.Error("CleanStale left the link of the removed cgroup pinned")
		}

		f = mustNew(t, o)
		defer f.Close()
		got, err := f.Policies()
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint64]Policy{step1.ID: {GPUMinors: []uint32{0}}, step2.ID: {GPUMinors: []uint32{1}}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Policies() after CleanStale = %v, want %v", got, want)
		}
		sup, err = f.Suppressed()
		if err != nil {
			t.Fatal(err)
		}
		for k := range sup {
			if k.CgroupID == step4.ID {
				t.Errorf("rate entry of the removed cgroup left: %+v", k)
			}
		}
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 0)
		fx.expectGPUs(t, "job_2/step_0/user/task_0", 1)
		if err := f.Unpin(); err != nil {
			t.Fatal(err)
		}
	})
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestPrivilegedEnsureBPFFS(t *testing.T) {
	requirePrivileges(t)
	mnt := t.TempDir()
	dir := filepath.Join(mnt, "gpufence")
	if err := ensureBPFFS(dir, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	if !isBPFFS(mnt) || !isBPFFS(dir) {
		t.Fatalf("%s not on bpffs after ensureBPFFS", dir)
	}
	// Mounted: nothing is mounted again.
	if err := ensureBPFFS(dir, mnt); err != nil {
		t.Fatal(err)
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(info), " "+mnt+" "); n != 1 {
		t.Errorf("%s mounted %d times", mnt, n)
	}
	if err := ensureBPFFS(filepath.Join(t.TempDir(), "x"), mnt); err == nil {
		t.Error("ensureBPFFS accepted a dir outside bpffs")
	}
	if err := EnsureBPFFS("relative"); err == nil {
		t.Error("EnsureBPFFS accepted a relative path")
	}
}
