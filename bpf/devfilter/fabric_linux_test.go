// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gpufence/gpufence/agent/cgroup"
	"golang.org/x/sys/unix"
)

// fabricNode is a fake NVSwitch or NVLink management node, named and
// numbered as the driver makes them: nvidia-nvswitchctl is minor 255 of the
// nvidia-nvswitch major, nvidia-nvswitchN minor N; nvidia-nvlink minor 0 of
// its own major.
type fabricNode struct {
	name   string
	nvlink bool
	minor  uint32
}

var fabricNodes = []fabricNode{
	{"nvidia-nvswitchctl", false, 255},
	{"nvidia-nvswitch0", false, 0},
	{"nvidia-nvswitch1", false, 1},
	{"nvidia-nvlink", true, 0},
}

func fabricNodeNames() []string {
	var out []string
	for _, n := range fabricNodes {
		out = append(out, n.name)
	}
	return out
}

func (fx *fixture) fabricMajor(n fabricNode) uint32 {
	if n.nvlink {
		return fx.nvlinkMajor
	}
	return fx.nvswitchMajor
}

// fabricOptions are o with the fixture's fake management majors.
func (fx *fixture) fabricOptions(mode Mode, o Options) Options {
	o = fx.options(mode, o)
	o.CapsMajor, o.NVSwitchMajor, o.NVLinkMajor = fx.capsMajor, fx.nvswitchMajor, fx.nvlinkMajor
	return o
}

// expectFabric checks the management nodes from rel: every one opens
// (ENXIO, no driver) when open, else every one is denied (EPERM).
func (fx *fixture) expectFabric(t *testing.T, rel string, open bool) int {
	t.Helper()
	pid, got := fx.openAll(t, rel)
	want := unix.EPERM
	if open {
		want = unix.ENXIO
	}
	for _, n := range fabricNodes {
		if got[n.name] != want {
			t.Errorf("open %s (%d:%d) from %s: errno %d (%v), want %d (%v)", n.name, fx.fabricMajor(n), n.minor, rel, int(got[n.name]), got[n.name], int(want), want)
		}
	}
	return pid
}

// TestPrivilegedFabricDenied: with the NVSwitch and NVLink majors set, a
// step opens its GPUs as before and none of the management nodes, whatever
// its policy; allow-all entries (Slurm's system and slurmd) open them; every
// denial is reported with the node's major and minor.
func TestPrivilegedFabricDenied(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		f := newFilter(t, fx.fabricOptions(mode, Options{}))
		events := collectEvents(f)
		step, sliceStep, system := fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "job_2/step_0"), fx.cgroup(t, "system")
		for cg, p := range map[cgroup.Cgroup]Policy{
			// A step holding every GPU, and one holding a MIG slice.
			step:      {GPUMinors: []uint32{0, 1, 2, 3}},
			sliceStep: {GPUMinors: []uint32{0}, CapsMinors: []uint32{12, 13}},
			system:    {AllowAll: true},
		} {
			if err := f.Set(cg, p); err != nil {
				t.Fatal(err)
			}
		}
		pid := fx.expectFabric(t, "job_1/step_0/user/task_0", false)
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 0, 1, 2, 3)
		fx.expectFabric(t, "job_2/step_0/user/task_0", false)
		fx.expectCaps(t, "job_2/step_0/user/task_0", 12, 13)
		fx.expectFabric(t, "system", true)
		if mode == ModeScope {
			// No entry: denied like a GPU.
			fx.expectFabric(t, "job_3/step_0/user/task_0", false)
		} else {
			// Nothing attached above an unregistered step in this mode.
			fx.expectFabric(t, "job_3/step_0/user/task_0", true)
		}

		for _, n := range fabricNodes {
			e := events.wait(t, "job 1 opening "+n.name, func(e Event) bool {
				return e.Major == fx.fabricMajor(n) && e.Minor == n.minor && e.CgroupID == step.ID
			})
			if e.Decision != DecisionDenied || int(e.TGID) != pid || e.Access != AccessRead|AccessWrite || e.Comm != wantComm() {
				t.Errorf("event for %s = %+v, want denied read,write by pid %d (%s)", n.name, e, pid, wantComm())
			}
		}
	})
}

// TestPrivilegedFabricAllowed: without the management majors (the driver
// has none, or fabric_management: allow) the nodes are not narrowed: every
// cgroup opens them, and no access to them is reported.
func TestPrivilegedFabricAllowed(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		f := newFilter(t, fx.options(mode, Options{CapsMajor: fx.capsMajor, AuditAllowed: AuditAllowedAll}))
		events := collectEvents(f)
		step := fx.cgroup(t, "job_1/step_0")
		if err := f.Set(step, Policy{GPUMinors: []uint32{1}}); err != nil {
			t.Fatal(err)
		}
		fx.expectFabric(t, "job_1/step_0/user/task_0", true)
		if mode == ModeScope {
			fx.expectFabric(t, "job_3/step_0/user/task_0", true)
		}
		// The child opens the management nodes last; an event of a later
		// child marks the end of what its accesses reported.
		pid := fx.expectGPUs(t, "job_1/step_0/user/task_0", 1)
		for {
			e := events.wait(t, "the marker child opening nvidia0", func(Event) bool { return true })
			if e.Major == fx.nvswitchMajor || e.Major == fx.nvlinkMajor {
				t.Errorf("access to an unnarrowed management node reported: %+v", e)
			}
			if int(e.TGID) == pid && e.Major == 195 && e.Minor == 0 {
				break
			}
		}
	})
}

// TestPrivilegedFabricAuditOnly: in audit-only mode, and for an audit-only
// entry, the management nodes open and each open is reported as would-deny.
func TestPrivilegedFabricAuditOnly(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		for _, global := range []bool{true, false} {
			t.Run(fmt.Sprintf("global=%v", global), func(t *testing.T) {
				f := newFilter(t, fx.fabricOptions(mode, Options{AuditOnly: global}))
				events := collectEvents(f)
				step := fx.cgroup(t, "job_1/step_0")
				if err := f.Set(step, Policy{AuditOnly: !global, GPUMinors: []uint32{0}}); err != nil {
					t.Fatal(err)
				}
				pid := fx.expectFabric(t, "job_1/step_0/user/task_0", true)
				e := events.wait(t, "would-deny of nvidia-nvswitchctl", func(e Event) bool {
					return int(e.TGID) == pid && e.Major == fx.nvswitchMajor && e.Minor == 255
				})
				if e.Decision != DecisionWouldDeny || e.CgroupID != step.ID {
					t.Errorf("event = %+v, want would-deny in cgroup %d", e, step.ID)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// TestPrivilegedPinUpgradeFromLayout2: an agent of this layout takes over
// what an agent with the 32-byte config map (no management majors) pinned.
// gpufence status reads the old pins; the new filter replaces the config
// map, keeps every policy, and denies the management nodes at once.
func TestPrivilegedPinUpgradeFromLayout2(t *testing.T) {
	pinModes(t, func(t *testing.T, mode Mode) {
		fx := newFixture(t)
		requireMode(t, mode)
		o := pinOpts(fx, mode, newPinDir(t))
		o.CapsMajor = fx.capsMajor
		unpinAtEnd(t, o)
		t.Cleanup(func() { testSpecHook = nil })
		old := olderSpec(t, 2, "config", configLayout1Size)
		testSpecHook = func(_ Mode, spec *ebpf.CollectionSpec) { *spec = *old.Copy() }
		f := mustNew(t, o)
		step, system := setStepAndSystem(t, fx, f)
		mustClose(t, f)
		testSpecHook = nil
		fx.expectFabric(t, "job_1/step_0/user/task_0", true)
		view, err := InspectPins(o.PinDir)
		if err != nil || len(view.Errors) > 0 || view.Config == nil {
			t.Fatalf("InspectPins of the layout 2 pins: %v, %v, config %+v", err, view.Errors, view.Config)
		}
		if view.Config.CapsMajor != fx.capsMajor || view.Config.NVSwitchMajor != 0 || view.Config.NVLinkMajor != 0 {
			t.Errorf("layout 2 pinned config = %+v, want caps major %d and no management major", view.Config, fx.capsMajor)
		}

		o.NVSwitchMajor, o.NVLinkMajor = fx.nvswitchMajor, fx.nvlinkMajor
		f = mustNew(t, o)
		if !f.Adopted() {
			t.Error("Adopted() = false after a layout 2 filter")
		}
		if got := f.config.ValueSize(); got == configLayout1Size {
			t.Error("config map kept the layout 2 value size")
		}
		got, err := f.Policies()
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint64]Policy{step.ID: {GPUMinors: []uint32{2}, CapsMinors: []uint32{12}}, system.ID: {AllowAll: true}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Policies() after the upgrade = %v, want %v", got, want)
		}
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 2)
		fx.expectCaps(t, "job_1/step_0/user/task_0", 12)
		fx.expectFabric(t, "job_1/step_0/user/task_0", false)
		fx.expectFabric(t, "system", true)
		view, err = InspectPins(o.PinDir)
		if err != nil || len(view.Errors) > 0 || view.Config == nil {
			t.Fatalf("InspectPins after the upgrade: %v, %v", err, view.Errors)
		}
		if view.Config.NVSwitchMajor != fx.nvswitchMajor || view.Config.NVLinkMajor != fx.nvlinkMajor || view.Config.CapsMajor != fx.capsMajor {
			t.Errorf("pinned config after the upgrade = %+v, want nvswitch %d, nvlink %d, caps %d", view.Config, fx.nvswitchMajor, fx.nvlinkMajor, fx.capsMajor)
		}
		if err := f.Unpin(); err != nil {
			t.Fatal(err)
		}
	})
}
