// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gpufence/gpufence/agent/cgroup"
	"golang.org/x/sys/unix"
)

// capsTestMinors are the fake nvidia-caps nodes every fixture has, as the
// driver numbers them: 1 MIG config, 2 MIG monitor, 12/13 gpu0/gi1 access and
// its ci0, 21/22 gpu0/gi2 and its ci0, 4322 gpu31/gi14/ci7 (the driver's
// highest), and 4400, above the program's bitmap.
var capsTestMinors = []uint32{1, 2, 12, 13, 21, 22, 4322, 4400}

func capsNodeName(minor uint32) string { return fmt.Sprintf("nvidia-caps/nvidia-cap%d", minor) }

func capsNodeNames() []string {
	var out []string
	for _, m := range capsTestMinors {
		out = append(out, capsNodeName(m))
	}
	return out
}

// fakeMajors picks n char majors no driver registered (nvidia-caps,
// nvidia-nvswitch and nvidia-nvlink get dynamic ones, from the same range),
// so that an allowed open fails with ENXIO.
func fakeMajors(t *testing.T, n int) []uint32 {
	t.Helper()
	f, err := os.Open("/proc/devices")
	if err != nil {
		t.Fatalf("pick fake dynamic majors: %v", err)
	}
	defer f.Close()
	used := map[uint32]bool{195: true, uvmMajor: true}
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
	var out []uint32
	for m := uint32(239); m >= 220 && len(out) < n; m-- {
		if !used[m] {
			out = append(out, m)
		}
	}
	if len(out) < n {
		t.Skipf("skipping: fewer than %d unused char majors in 220-239 for fake nvidia-caps, nvswitch and nvlink nodes", n)
	}
	return out
}

// expectCaps checks which fake nvidia-caps nodes open from rel: exactly
// those in allowed (ENXIO), the others EPERM.
func (fx *fixture) expectCaps(t *testing.T, rel string, allowed ...uint32) {
	t.Helper()
	_, got := fx.openAll(t, rel)
	for _, m := range capsTestMinors {
		want := unix.EPERM
		if slices.Contains(allowed, m) {
			want = unix.ENXIO
		}
		if n := capsNodeName(m); got[n] != want {
			t.Errorf("open %s from %s: errno %d (%v), want %d (%v)", n, rel, int(got[n]), got[n], int(want), want)
		}
	}
}

// TestPrivilegedCaps: each step opens only the MIG capability nodes of its
// slices; config, monitor and minors above the bitmap stay denied except to
// allow-all entries, and denials are reported with the caps device.
func TestPrivilegedCaps(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		f := newFilter(t, fx.options(mode, Options{CapsMajor: fx.capsMajor}))
		events := collectEvents(f)
		sliceA, sliceB, system := fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "job_2/step_0"), fx.cgroup(t, "system")
		// Two slices of GPU 0: both open the parent, each its own caps.
		for cg, p := range map[cgroup.Cgroup]Policy{
			sliceA: {GPUMinors: []uint32{0}, CapsMinors: []uint32{12, 13}},
			sliceB: {GPUMinors: []uint32{0}, CapsMinors: []uint32{21, 22, 4322}},
			system: {AllowAll: true},
		} {
			if err := f.Set(cg, p); err != nil {
				t.Fatal(err)
			}
		}
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 0)
		fx.expectCaps(t, "job_1/step_0/user/task_0", 12, 13)
		pid := fx.expectGPUs(t, "job_2/step_0/user/task_0", 0)
		fx.expectCaps(t, "job_2/step_0/user/task_0", 21, 22, 4322)
		fx.expectCaps(t, "system", capsTestMinors...)
		if mode == ModeScope {
			// No entry: no capability either.
			fx.expectCaps(t, "job_3/step_0/user/task_0")
		}

		e := events.wait(t, "job 2 opening gpu0/gi1's access node", func(e Event) bool {
			return e.Major == fx.capsMajor && e.Minor == 12 && e.CgroupID == sliceB.ID && e.Decision == DecisionDenied
		})
		if int(e.TGID) != pid || e.Access != AccessRead|AccessWrite {
			t.Errorf("event = %+v, want denied read,write of %d:12 by pid %d", e, fx.capsMajor, pid)
		}
		events.wait(t, "job 2 opening the MIG config node", func(e Event) bool {
			return e.Major == fx.capsMajor && e.Minor == 1 && e.CgroupID == sliceB.ID && e.Decision == DecisionDenied
		})

		got, err := f.Policies()
		if err != nil {
			t.Fatal(err)
		}
		if want := (Policy{GPUMinors: []uint32{0}, CapsMinors: []uint32{21, 22, 4322}}); fmt.Sprint(got[sliceB.ID]) != fmt.Sprint(want) {
			t.Errorf("Policies()[job 2] = %+v, want %+v", got[sliceB.ID], want)
		}
		if err := f.Set(sliceA, Policy{CapsMinors: []uint32{1}}); err == nil {
			t.Error("Set granted the MIG config capability")
		}
		if err := f.Set(sliceA, Policy{CapsMinors: []uint32{4400}}); err == nil {
			t.Error("Set accepted a caps minor above the bitmap")
		}
		// The failed Sets left the policy as it was.
		fx.expectCaps(t, "job_1/step_0/user/task_0", 12, 13)
	})
}

// TestPrivilegedCapsWithoutMajor: with no nvidia-caps major configured the
// filter leaves that major alone (a node whose driver never registered it).
func TestPrivilegedCapsWithoutMajor(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		f := newFilter(t, fx.options(mode, Options{}))
		if err := f.Set(fx.cgroup(t, "job_1/step_0"), Policy{GPUMinors: []uint32{1}}); err != nil {
			t.Fatal(err)
		}
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 1)
		fx.expectCaps(t, "job_1/step_0/user/task_0", capsTestMinors...)
	})
}

// layout1Spec is the collection of the first map layout (48-byte policies,
// no caps): testdata/layout1_bpfel.o is devfilter_bpfel.o as committed
// before the caps bitmap was added.
func layout1Spec(t *testing.T) *ebpf.CollectionSpec {
	return olderSpec(t, 1, "policies", policyLayout1Size)
}

// olderSpec loads testdata/layout<n>_bpfel.o, devfilter_bpfel.o as an
// older agent committed it, and checks that map's value size there.
func olderSpec(t *testing.T, n int, mapName string, valueSize uint32) *ebpf.CollectionSpec {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec(fmt.Sprintf("testdata/layout%d_bpfel.o", n))
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Maps[mapName].ValueSize; got != valueSize {
		t.Fatalf("layout %d %s value is %d bytes, want %d", n, mapName, got, valueSize)
	}
	return spec
}

// setStepAndSystem gives job_1/step_0 GPU 2 and MIG capability 12 and
// system every device, as the upgrade tests' older agents do.
func setStepAndSystem(t *testing.T, fx *fixture, f *Filter) (step, system cgroup.Cgroup) {
	t.Helper()
	step, system = fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "system")
	for cg, p := range map[cgroup.Cgroup]Policy{step: {GPUMinors: []uint32{2}, CapsMinors: []uint32{12}}, system: {AllowAll: true}} {
		if err := f.Set(cg, p); err != nil {
			t.Fatal(err)
		}
	}
	return step, system
}

// setLayout1 writes a first-layout policy (GPU bitmap word 0 only), as an
// agent of that layout did.
func setLayout1(t *testing.T, f *Filter, cg cgroup.Cgroup, allowAll bool, gpuWord0 uint64) {
	t.Helper()
	raw := make([]byte, policyLayout1Size)
	binary.NativeEndian.PutUint64(raw, cg.ID)
	if allowAll {
		binary.NativeEndian.PutUint32(raw[8:], policyAllowAll)
	}
	binary.NativeEndian.PutUint64(raw[16:], gpuWord0)
	if f.mode == ModeScope {
		if err := f.policies.Put(cg.ID, raw); err != nil {
			t.Fatal(err)
		}
		return
	}
	l, err := attach(cg.Path, cg.ID, f.program)
	if err != nil {
		t.Fatal(err)
	}
	if err := pinOver(f.pinDir, cgroupPinName(cg.ID), l.Pin); err != nil {
		t.Fatal(err)
	}
	f.attached[cg.ID] = l
	if err := f.storage.Update(storageKey(cg.ID), raw, ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
}

// TestPrivilegedPinUpgradeFromLayout1: an agent of this layout takes over
// what an agent of the first layout pinned, while a task of a step keeps
// opening its own GPU and a foreign one. The step keeps its GPU, never
// opens the foreign one, and gets no MIG capability it did not hold.
func TestPrivilegedPinUpgradeFromLayout1(t *testing.T) {
	pinModes(t, func(t *testing.T, mode Mode) {
		fx := newFixture(t)
		requireMode(t, mode)
		o := pinOpts(fx, mode, newPinDir(t))
		o.CapsMajor = fx.capsMajor
		unpinAtEnd(t, o)
		t.Cleanup(func() { testSpecHook = nil })
		old := layout1Spec(t)
		testSpecHook = func(_ Mode, spec *ebpf.CollectionSpec) { *spec = *old.Copy() }

		f := mustNew(t, o)
		if got := f.policies; mode == ModeScope && got.ValueSize() != policyLayout1Size {
			t.Fatalf("layout 1 agent has policies of %d bytes", got.ValueSize())
		}
		step1, system := fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "system")
		setLayout1(t, f, step1, false, 1<<0)
		setLayout1(t, f, system, true, 0)
		mustClose(t, f)
		testSpecHook = nil
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 0)
		// The first layout did not narrow the caps major.
		fx.expectCaps(t, "job_1/step_0/user/task_0", capsTestMinors...)

		loop := startOpenLoop(t, fx, "job_1/step_0/user/task_0")

		f = mustNew(t, o)
		if !f.Adopted() {
			t.Error("Adopted() = false after a layout 1 filter")
		}
		if mode == ModeScope && f.policies.ValueSize() == policyLayout1Size {
			t.Error("policies map kept the layout 1 value size")
		}
		got, err := f.Policies()
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint64]Policy{step1.ID: {GPUMinors: []uint32{0}}, system.ID: {AllowAll: true}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Policies() after the upgrade = %v, want %v", got, want)
		}
		view, err := InspectPins(o.PinDir)
		if err != nil || len(view.Errors) > 0 {
			t.Errorf("InspectPins after the upgrade: %v, %v", err, view.Errors)
		} else if view.Config == nil || view.Config.CapsMajor != fx.capsMajor {
			t.Errorf("pinned config = %+v, want caps major %d", view.Config, fx.capsMajor)
		}

		counts := loop.stop(t)
		t.Logf("upgrade from layout 1: foreign GPU nvidia1: %s; own GPU nvidia0: %s",
			fmtCounts(counts["nvidia1"]), fmtCounts(counts["nvidia0"]))
		for errno, k := range counts["nvidia1"] {
			if errno != unix.EPERM {
				t.Errorf("foreign GPU opened with errno %d (%v) %d times during the upgrade, want EPERM only", int(errno), errno, k)
			}
		}
		for errno, k := range counts["nvidia0"] {
			// Per-cgroup mode re-attaches with new storage (see
			// TestPrivilegedPinNoWindowOnUpgrade): the own GPU may be
			// denied for an instant, never a foreign one allowed.
			if errno != unix.ENXIO && !(errno == unix.EPERM && mode == ModePerCgroup) {
				t.Errorf("own GPU opened with errno %d (%v) %d times during the upgrade", int(errno), errno, k)
			}
		}
		if counts["nvidia1"][unix.EPERM] == 0 || counts["nvidia0"][unix.ENXIO] == 0 {
			t.Errorf("child did not run through the upgrade: %v", counts)
		}

		// The new program narrows the caps major: the step held none.
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 0)
		fx.expectCaps(t, "job_1/step_0/user/task_0")
		fx.expectCaps(t, "system", capsTestMinors...)
		if err := f.Set(step1, Policy{GPUMinors: []uint32{0}, CapsMinors: []uint32{12, 13}}); err != nil {
			t.Fatal(err)
		}
		fx.expectCaps(t, "job_1/step_0/user/task_0", 12, 13)
		if err := f.Unpin(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestPrivilegedVerifierCost loads both programs and reports what the
// verifier walked; the kernel's limit is 1,000,000 instructions.
func TestPrivilegedVerifierCost(t *testing.T) {
	for _, mode := range []Mode{ModeScope, ModePerCgroup} {
		t.Run(string(mode), func(t *testing.T) {
			fx := newFixture(t)
			requireMode(t, mode)
			f := newFilter(t, fx.options(mode, Options{CapsMajor: fx.capsMajor}))
			info, err := f.program.Info()
			if err != nil {
				t.Fatal(err)
			}
			n, ok := info.VerifiedInstructions()
			if !ok {
				t.Skip("skipping: kernel does not report verified instructions")
			}
			insns, err := info.Instructions()
			if err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
				t.Fatal(err)
			}
			t.Logf("%s: %d instructions, %d verified", info.Name, len(insns), n)
			if n > 100_000 {
				t.Errorf("the verifier walked %d instructions; keep well under the 1,000,000 limit", n)
			}
		})
	}
}
