// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// execEnv makes the test binary a child that opens the device node it
// names, prints the errno, and at once execs sleep (found in PATH) for 30
// seconds: a process that opens a GPU and becomes another program.
const execEnv = "GPUFENCE_DEVFILTER_TEST_CHILD_EXEC"

func childExec(node string) int {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fd, err := unix.Open(node, unix.O_RDWR|unix.O_CLOEXEC, 0)
	var errno unix.Errno
	if err == nil {
		unix.Close(fd)
	} else if !errors.As(err, &errno) {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(int(errno))
	os.Stdout.Sync()
	err = syscall.Exec(sleep, []string{"sleep", "30"}, os.Environ())
	fmt.Fprintln(os.Stderr, "exec sleep:", err)
	return 2
}

// threadReader reads every event of f on one locked OS thread until the
// ring buffer is flushed, and reports how many it read and the CPU time
// that thread used: the agent's cost of the events.
type threadReader struct {
	f    *Filter
	done chan threadResult
}

type threadResult struct {
	events []Event
	cpu    time.Duration
	err    error
}

func startThreadReader(f *Filter) *threadReader {
	r := &threadReader{f: f, done: make(chan threadResult, 1)}
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var res threadResult
		var before unix.Rusage
		unix.Getrusage(unix.RUSAGE_THREAD, &before)
		for {
			e, err := f.ReadEvent()
			if err != nil {
				if !errors.Is(err, ErrClosed) {
					res.err = err
				}
				break
			}
			res.events = append(res.events, e)
		}
		var after unix.Rusage
		unix.Getrusage(unix.RUSAGE_THREAD, &after)
		res.cpu = rusageCPU(after) - rusageCPU(before)
		r.done <- res
	}()
	return r
}

func rusageCPU(u unix.Rusage) time.Duration {
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

func (r *threadReader) drain(t *testing.T) threadResult {
	t.Helper()
	if err := r.f.Drain(); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-r.done:
		if res.err != nil {
			t.Fatalf("reading events: %v", res.err)
		}
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("event reader did not drain the ring buffer")
	}
	return threadResult{}
}

// TestPrivilegedAuditRateMapFull: a storm over more rate keys than the rate
// map holds (the map shrunk to 4 entries; 3 steps x 4 GPUs, one allowed,
// give 12 keys) sends the reader no event for a key without an entry,
// counts every such access by decision, and the books still balance
// exactly: events + suppressed + rate_full + lost = attempts.
func TestPrivilegedAuditRateMapFull(t *testing.T) {
	const entries = 4
	// Opens per step and GPU: 12 keys of these take about as long as one
	// storm of -devfilter.storm opens.
	n := max(*stormN/7, 100)
	steps := []string{"job_1/step_0", "job_2/step_0", "job_3/step_0"}
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		t.Cleanup(func() { testSpecHook = nil })
		testSpecHook = func(_ Mode, spec *ebpf.CollectionSpec) { spec.Maps["rate"].MaxEntries = entries }
		f := newFilter(t, fx.options(mode, Options{}))
		testSpecHook = nil
		if got := f.rate.MaxEntries(); got != entries {
			t.Fatalf("rate map holds %d entries, want the test's %d", got, entries)
		}
		for _, s := range steps {
			if err := f.Set(fx.cgroup(t, s), Policy{GPUMinors: []uint32{0}}); err != nil {
				t.Fatal(err)
			}
		}
		r := startThreadReader(f)
		start := time.Now()
		attempts := map[Decision]uint64{}
		for _, s := range steps {
			for _, n2 := range testNodes[:4] {
				errno, d, k := unix.EPERM, DecisionDenied, n
				if n2.minor == 0 {
					// Fewer: an allowed open of a node without a driver
					// makes a kernel with modules run modprobe each time.
					errno, d, k = unix.ENXIO, DecisionAllowed, min(n, 50)
				}
				wantOnly(t, s+" opening "+n2.name, fx.storm(t, s+"/user/task_0", n2.name, k), errno, k)
				attempts[d] += uint64(k)
			}
		}
		elapsed := time.Since(start)
		res := r.drain(t)

		supp := suppressed(t, f)
		if len(supp) != entries {
			t.Errorf("rate map has %d keys, want it full with %d", len(supp), entries)
		}
		full, err := f.RateFull()
		if err != nil {
			t.Fatal(err)
		}
		lost, err := f.Lost()
		if err != nil {
			t.Fatal(err)
		}
		events := map[Decision]uint64{}
		for _, e := range res.events {
			if _, ok := supp[keyOf(e)]; !ok {
				t.Errorf("event %+v of a key the rate map has no entry for: sent unthrottled", e)
			}
			events[e.Decision]++
		}
		suppByDecision := map[Decision]uint64{}
		for k, v := range supp {
			suppByDecision[k.Decision] += v
		}
		var total, sumAttempts uint64
		for _, d := range []Decision{DecisionDenied, DecisionAllowed} {
			got := events[d] + suppByDecision[d] + full[d]
			total += got
			sumAttempts += attempts[d]
			if lost == 0 && got != attempts[d] {
				t.Errorf("%s: events %d + suppressed %d + rate_full %d = %d, want the %d attempts",
					d, events[d], suppByDecision[d], full[d], got, attempts[d])
			}
		}
		if total+lost != sumAttempts {
			t.Errorf("events + suppressed + rate_full %d + lost %d = %d, want the %d attempts", total, lost, total+lost, sumAttempts)
		}
		if full[DecisionDenied] == 0 {
			t.Errorf("rate_full = %v: the storm over %d keys did not overflow a map of %d", full, 12, entries)
		}
		// At most burst 5 per key and second, for the keys with an entry.
		if most := uint64(entries * 5 * (int(elapsed/time.Second) + 1)); uint64(len(res.events)) > most {
			t.Errorf("%d events for %d keys in %s, want at most %d", len(res.events), entries, elapsed.Round(time.Millisecond), most)
		}
		t.Logf("%s: %d opens over 12 keys (rate map of %d) in %s: reader got %d events using %s CPU; suppressed %v, rate_full %v, lost %d",
			mode, sumAttempts, entries, elapsed.Round(time.Millisecond), len(res.events), res.cpu, suppByDecision, full, lost)
	})
}

// superblockDev is the device of the superblock of the file at path, as
// mountinfo shows it for the file's mount: what the program records.
func superblockDev(t *testing.T, path string) (uint32, uint32) {
	t.Helper()
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &stx); err != nil || stx.Mask&unix.STATX_MNT_ID == 0 {
		t.Fatalf("statx %s: %v (mask %#x)", path, err, stx.Mask)
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[0] == strconv.FormatUint(stx.Mnt_id, 10) {
			ma, mi, _ := strings.Cut(f[2], ":")
			a, _ := strconv.ParseUint(ma, 10, 32)
			b, _ := strconv.ParseUint(mi, 10, 32)
			return uint32(a), uint32(b)
		}
	}
	t.Fatalf("mount %d of %s not in /proc/self/mountinfo", stx.Mnt_id, path)
	return 0, 0
}

func exeIDOf(t *testing.T, path string) ExeID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	ma, mi := superblockDev(t, path)
	return ExeID{Ino: st.Ino, Major: ma, Minor: mi}
}

// procStartTicks is field 22 of /proc/<pid>/stat: the start in clock ticks.
func procStartTicks(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	v, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPrivilegedEventNamesExeOfTheAccess: a process opens a denied GPU and
// execs sleep at once. By the time anyone reads /proc/<pid>/exe it names
// sleep; the event names the program that made the access (the test
// binary): its inode and superblock device, the process's start time and
// its comm then.
func TestPrivilegedEventNamesExeOfTheAccess(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		f := newFilter(t, fx.options(mode, Options{}))
		step := fx.cgroup(t, "job_2/step_0")
		if err := f.Set(step, Policy{}); err != nil {
			t.Fatal(err)
		}
		events := collectEvents(f)
		sleep, err := exec.LookPath("sleep")
		if err != nil {
			t.Fatal(err)
		}
		if sleep, err = filepath.EvalSymlinks(sleep); err != nil {
			t.Fatal(err)
		}
		self, err := filepath.EvalSymlinks(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		wantExe, sleepExe := exeIDOf(t, self), exeIDOf(t, sleep)

		cg, err := unix.Open(fx.path("job_2/step_0/user/task_0"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(cg)
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), execEnv+"="+filepath.Join(fx.devDir, "nvidia1"))
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cg}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			cmd.Process.Kill()
			cmd.Wait()
		}()
		pid := cmd.Process.Pid
		line := make([]byte, 16)
		k, _ := out.Read(line)
		if got := strings.TrimSpace(string(line[:k])); got != strconv.Itoa(int(unix.EPERM)) {
			t.Fatalf("child opening nvidia1: errno %q, want EPERM", got)
		}
		ev := events.wait(t, "the child's denied open", func(e Event) bool { return int(e.TGID) == pid })
		// Now the process runs sleep.
		deadline := time.Now().Add(5 * time.Second)
		for {
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
			if exe == sleep {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("child did not exec %s: /proc/%d/exe = %q", sleep, pid, exe)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if ev.Exe != wantExe || ev.Exe == sleepExe {
			t.Errorf("event exe %+v, want the test binary %+v (sleep is %+v)", ev.Exe, wantExe, sleepExe)
		}
		if ev.Comm != wantComm() {
			t.Errorf("event comm %q, want %q (the comm at the access)", ev.Comm, wantComm())
		}
		// /proc/<pid>/stat counts clock ticks (USER_HZ 100) of CLOCK_BOOTTIME.
		if got, want := uint64(ev.Start/(10*time.Millisecond)), procStartTicks(t, pid); ev.Start == 0 || got != want {
			t.Errorf("event start %s = %d ticks, /proc/%d/stat says %d", ev.Start, got, pid, want)
		}
		proc := fmt.Sprintf("/proc/%d/", pid)
		if same, err := SameExe(proc+"exe", proc+"mountinfo", ev.Exe); err != nil || same {
			t.Errorf("SameExe(%sexe = sleep, the event's exe) = %v, %v; want false", proc, same, err)
		}
		if same, err := SameExe(proc+"exe", proc+"mountinfo", sleepExe); err != nil || !same {
			t.Errorf("SameExe(%sexe, sleep's identity) = %v, %v; want true", proc, same, err)
		}
		if _, err := SameExe(proc+"exe", proc+"mountinfo", ExeID{}); !errors.Is(err, ErrExeUnknown) {
			t.Errorf("SameExe with no identity: %v, want ErrExeUnknown", err)
		}
	})
}

// TestPrivilegedProbeFindsAncestorHelper checks, without Probe, whether this
// kernel offers bpf_get_current_ancestor_cgroup_id to CGROUP_DEVICE
// programs, by loading one that calls it; Probe must then pick scope mode
// (and must not where the kernel does not offer it). Scope mode is what
// narrows a job cgroup nobody registered: a Probe that quietly fell back to
// per-cgroup mode would leave such cgroups open, so this fails, not skips.
func TestPrivilegedProbeFindsAncestorHelper(t *testing.T) {
	requirePrivileges(t)
	if err := features.HaveProgramType(ebpf.CGroupDevice); err != nil {
		t.Skipf("skipping: no CGROUP_DEVICE programs: %v", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "gf_ancestor",
		Type: ebpf.CGroupDevice,
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R1, 1),
			asm.FnGetCurrentAncestorCgroupId.Call(),
			asm.Mov.Imm(asm.R0, 1),
			asm.Return(),
		},
		License: "GPL",
	})
	offered := err == nil
	if err == nil {
		prog.Close()
	} else {
		var verr *ebpf.VerifierError
		if !errors.As(err, &verr) || !(strings.Contains(verr.Error(), "unknown func") ||
			strings.Contains(verr.Error(), "cannot use helper") || strings.Contains(fmt.Sprintf("%+v", verr), "unknown func")) {
			t.Fatalf("loading a CGROUP_DEVICE program that calls bpf_get_current_ancestor_cgroup_id: %v", err)
		}
	}
	mode, perr := Probe()
	var have []string
	for _, h := range []asm.BuiltinFunc{asm.FnGetCurrentAncestorCgroupId, asm.FnGetCurrentPidTgid, asm.FnGetCurrentComm,
		asm.FnGetCurrentCgroupId, asm.FnGetCurrentTask, asm.FnGetCurrentTaskBtf, asm.FnProbeReadKernel,
		asm.FnProbeReadKernelStr, asm.FnGetLocalStorage} {
		if features.HaveProgramHelper(ebpf.CGroupDevice, h) == nil {
			have = append(have, strings.TrimPrefix(h.String(), "Fn"))
		}
	}
	slices.Sort(have)
	t.Logf("kernel %s: ancestor helper offered to CGROUP_DEVICE: %v; Probe: %q, %v; helpers offered: %s",
		kernelRelease(), offered, mode, perr, strings.Join(have, " "))
	switch {
	case offered && mode != ModeScope:
		t.Fatalf("the kernel offers bpf_get_current_ancestor_cgroup_id to CGROUP_DEVICE programs, but Probe picked %q (%v): scope mode silently lost", mode, perr)
	case !offered && mode == ModeScope:
		t.Fatalf("Probe picked scope mode on a kernel that does not offer bpf_get_current_ancestor_cgroup_id to CGROUP_DEVICE programs")
	}
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}
