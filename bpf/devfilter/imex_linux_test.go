// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpufence/gpufence/agent/cgroup"
	"golang.org/x/sys/unix"
)

// imexChildEnv makes the test binary a child that, in its cgroup, opens
// the IMEX channel nodes of the directory the variable names and makes one
// more node there (mknod), printing each errno.
const imexChildEnv = "GPUFENCE_DEVFILTER_TEST_IMEX_CHILD"

// imexTestChannels are the fake channel nodes: 0 (the channel every job
// shares under ParallelCluster's prolog), 1 and 2 (two jobs' channels as
// Slurm's switch/nvidia_imex hands them out), and 2047 (the last of Slurm's
// default 2048).
var imexTestChannels = []uint32{0, 1, 2, 2047}

func init() {
	dir := os.Getenv(imexChildEnv)
	if dir == "" {
		return
	}
	major, err := strconv.ParseUint(os.Getenv(imexChildEnv+"_MAJOR"), 10, 32)
	if err != nil {
		fmt.Fprintln(os.Stderr, "imex child: bad major:", err)
		os.Exit(2)
	}
	for _, c := range imexTestChannels {
		fd, err := unix.Open(filepath.Join(dir, fmt.Sprintf("channel%d", c)), unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		fmt.Printf("channel%d %d\n", c, errnoOf(err))
	}
	// What slurmstepd does in the step's cgroup before the agent knows the
	// channel: make the node (of a channel no policy grants).
	node := filepath.Join(dir, fmt.Sprintf("made%d", os.Getpid()))
	err = unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(uint32(major), 7)))
	fmt.Printf("mknod %d\n", errnoOf(err))
	if err == nil {
		os.Remove(node)
	}
	os.Exit(0)
}

func errnoOf(err error) int {
	if err == nil {
		return 0
	}
	if e, ok := err.(unix.Errno); ok {
		return int(e)
	}
	return -1
}

// fakeIMEXMajor picks a char major no driver registered and none of the
// fixture's fake ones (nvidia-caps, NVSwitch, NVLink), so that an allowed
// open fails with ENXIO.
func fakeIMEXMajor(t *testing.T, not ...uint32) uint32 {
	t.Helper()
	f, err := os.Open("/proc/devices")
	if err != nil {
		t.Fatalf("pick a fake IMEX major: %v", err)
	}
	defer f.Close()
	used := map[uint32]bool{195: true, uvmMajor: true}
	for _, m := range not {
		used[m] = true
	}
	inChar := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			inChar = true
		case strings.HasSuffix(line, "devices:"):
			inChar = false
		case inChar && line != "":
			num, _, _ := strings.Cut(line, " ")
			if n, err := strconv.ParseUint(num, 10, 32); err == nil {
				used[uint32(n)] = true
			}
		}
	}
	for m := uint32(229); m >= 220; m-- {
		if !used[m] {
			return m
		}
	}
	t.Skip("skipping: no unused char major in 220-229 for fake IMEX channel nodes")
	return 0
}

// imexNodes makes the fake channel nodes in a new directory.
func imexNodes(t *testing.T, major uint32) string {
	t.Helper()
	dir := t.TempDir()
	for _, c := range imexTestChannels {
		if err := unix.Mknod(filepath.Join(dir, fmt.Sprintf("channel%d", c)), unix.S_IFCHR|0o666, int(unix.Mkdev(major, c))); err != nil {
			t.Fatalf("mknod channel%d: %v", c, err)
		}
	}
	return dir
}

// openIMEX runs the IMEX child in cgroup rel: errno by node, "mknod" for
// making one.
func (fx *fixture) openIMEX(t *testing.T, rel, dir string, major uint32) (int, map[string]unix.Errno) {
	t.Helper()
	fd, err := unix.Open(fx.path(rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), imexChildEnv+"="+dir, fmt.Sprintf("%s_MAJOR=%d", imexChildEnv, major))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("IMEX child in %s: %v", rel, err)
	}
	got := map[string]unix.Errno{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		name, val, _ := strings.Cut(sc.Text(), " ")
		n, err := strconv.Atoi(val)
		if err != nil {
			t.Fatalf("IMEX child output %q: %v", sc.Text(), err)
		}
		got[name] = unix.Errno(n)
	}
	if len(got) != len(imexTestChannels)+1 {
		t.Fatalf("IMEX child output %q: want %d lines", out, len(imexTestChannels)+1)
	}
	return cmd.Process.Pid, got
}

// expectIMEX checks that from rel exactly the channel open (ENXIO: no
// driver) that allowed names (-1: none), every other is EPERM, and making
// a node is allowed.
func (fx *fixture) expectIMEX(t *testing.T, rel, dir string, major uint32, allowed int64) int {
	t.Helper()
	pid, got := fx.openIMEX(t, rel, dir, major)
	for _, c := range imexTestChannels {
		want := unix.EPERM
		if int64(c) == allowed {
			want = unix.ENXIO
		}
		if n := fmt.Sprintf("channel%d", c); got[n] != want {
			t.Errorf("open %s from %s: errno %d (%v), want %d (%v)", n, rel, int(got[n]), got[n], int(want), want)
		}
	}
	if got["mknod"] != 0 {
		t.Errorf("mknod of an IMEX channel node from %s: errno %d (%v), want allowed", rel, int(got["mknod"]), got["mknod"])
	}
	return pid
}

// TestPrivilegedIMEXChannels: with the IMEX major narrowed, each step
// opens only its own channel, a step without one (and a job with no entry)
// none, allow-all entries every one; making a node is allowed; denials are
// reported with the IMEX device; GPUs are untouched by a channel.
func TestPrivilegedIMEXChannels(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		major := fakeIMEXMajor(t, fx.capsMajor, fx.nvswitchMajor, fx.nvlinkMajor)
		dir := imexNodes(t, major)
		f := newFilter(t, fx.options(mode, Options{CapsMajor: fx.capsMajor, IMEXMajor: major}))
		events := collectEvents(f)
		jobA, jobB, cpu, system := fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "job_2/step_0"), fx.cgroup(t, "job_3/step_0"), fx.cgroup(t, "system")
		for cg, p := range map[cgroup.Cgroup]Policy{
			jobA:   {GPUMinors: []uint32{0}, IMEXChannels: []uint32{1}},
			jobB:   {GPUMinors: []uint32{1}, IMEXChannels: []uint32{2047}},
			cpu:    {},
			system: {AllowAll: true},
		} {
			if err := f.Set(cg, p); err != nil {
				t.Fatal(err)
			}
		}
		pid := fx.expectIMEX(t, "job_1/step_0/user/task_0", dir, major, 1)
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 0)
		fx.expectIMEX(t, "job_2/step_0/user/task_0", dir, major, 2047)
		fx.expectIMEX(t, "job_3/step_0/user/task_0", dir, major, -1)
		_, got := fx.openIMEX(t, "system", dir, major)
		for _, c := range imexTestChannels {
			if n := fmt.Sprintf("channel%d", c); got[n] != unix.ENXIO {
				t.Errorf("open %s from system (allow-all): errno %v, want ENXIO", n, got[n])
			}
		}

		// In the order job 1 opened them.
		events.wait(t, "job 1 opening channel 0", func(e Event) bool {
			return e.Major == major && e.Minor == 0 && e.CgroupID == jobA.ID && e.Decision == DecisionDenied
		})
		e := events.wait(t, "job 1 opening job 2's channel", func(e Event) bool {
			return e.Major == major && e.Minor == 2047 && e.CgroupID == jobA.ID && e.Decision == DecisionDenied
		})
		if int(e.TGID) != pid || e.Access != AccessRead|AccessWrite {
			t.Errorf("event = %+v, want denied read,write of %d:2047 by pid %d", e, major, pid)
		}

		// The channel learned after the step started (the agent's second
		// exchange) replaces the entry: from none to its own.
		if err := f.Set(cpu, Policy{IMEXChannels: []uint32{2}}); err != nil {
			t.Fatal(err)
		}
		fx.expectIMEX(t, "job_3/step_0/user/task_0", dir, major, 2)

		got2, err := f.Policies()
		if err != nil {
			t.Fatal(err)
		}
		if want := (Policy{GPUMinors: []uint32{1}, IMEXChannels: []uint32{2047}}); fmt.Sprint(got2[jobB.ID]) != fmt.Sprint(want) {
			t.Errorf("Policies()[job 2] = %+v, want %+v", got2[jobB.ID], want)
		}
		if mode == ModeScope {
			if err := os.MkdirAll(fx.path("job_4/step_0/user/task_0"), 0o755); err != nil {
				t.Fatal(err)
			}
			// No entry: no channel, and no node made either.
			_, got := fx.openIMEX(t, "job_4/step_0/user/task_0", dir, major)
			for n, e := range got {
				if e != unix.EPERM {
					t.Errorf("%s from a job with no entry: errno %v, want EPERM", n, e)
				}
			}
		}
	})
}

// TestPrivilegedIMEXUnnarrowed: without an IMEX major the channels are
// other devices: every job opens them, as before gpufence knew of them.
func TestPrivilegedIMEXUnnarrowed(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModeScope)
	major := fakeIMEXMajor(t, fx.capsMajor, fx.nvswitchMajor, fx.nvlinkMajor)
	dir := imexNodes(t, major)
	f := newFilter(t, fx.options(ModeScope, Options{CapsMajor: fx.capsMajor}))
	if err := f.Set(fx.cgroup(t, "job_1/step_0"), Policy{}); err != nil {
		t.Fatal(err)
	}
	_, got := fx.openIMEX(t, "job_1/step_0/user/task_0", dir, major)
	for _, c := range imexTestChannels {
		if n := fmt.Sprintf("channel%d", c); got[n] != unix.ENXIO {
			t.Errorf("open %s with IMEX not narrowed: errno %v, want ENXIO", n, got[n])
		}
	}
}

func TestIMEXPolicyEncoding(t *testing.T) {
	for _, tt := range []struct {
		p    Policy
		want uint32
		err  string
	}{
		{Policy{}, 0, ""},
		{Policy{IMEXChannels: []uint32{0}}, 1, ""},
		{Policy{IMEXChannels: []uint32{2047}}, 2048, ""},
		{Policy{IMEXChannels: []uint32{MaxIMEXChannel}}, MaxIMEXChannel + 1, ""},
		{Policy{IMEXChannels: []uint32{MaxIMEXChannel + 1}}, 0, "larger than"},
		{Policy{IMEXChannels: []uint32{1, 2}}, 0, "at most one"},
	} {
		got, err := tt.p.imexWord()
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%+v: err %v, want %q", tt.p, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%+v: %d, %v; want %d", tt.p, got, err, tt.want)
		}
		if back := policyFromBitmaps(0, nil, nil, got); fmt.Sprint(back.IMEXChannels) != fmt.Sprint(tt.p.IMEXChannels) {
			t.Errorf("%+v: decoded %v", tt.p, back.IMEXChannels)
		}
	}
	if _, err := (Options{ScopeDir: "/x", IMEXMajor: 195}).validate(); err == nil {
		t.Error("IMEXMajor 195 (the NVIDIA major) accepted")
	}
}
