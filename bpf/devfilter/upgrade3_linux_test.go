// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// TestPrivilegedPinUpgradeFromLayout3: an agent of this layout takes over
// what an agent with the 40-byte config map (management majors, no IMEX
// major) pinned. That program denies the management nodes and leaves the
// IMEX channels alone, and cannot be given an IMEX major; gpufence status
// reads its pins; the new filter replaces the config map, keeps every
// policy (an old entry holds no channel), keeps denying the management
// nodes and narrows the channels at once.
func TestPrivilegedPinUpgradeFromLayout3(t *testing.T) {
	pinModes(t, func(t *testing.T, mode Mode) {
		fx := newFixture(t)
		requireMode(t, mode)
		major := fakeIMEXMajor(t, fx.capsMajor, fx.nvswitchMajor, fx.nvlinkMajor)
		dir := imexNodes(t, major)
		o := pinOpts(fx, mode, newPinDir(t))
		o.CapsMajor, o.NVSwitchMajor, o.NVLinkMajor = fx.capsMajor, fx.nvswitchMajor, fx.nvlinkMajor
		unpinAtEnd(t, o)
		t.Cleanup(func() { testSpecHook = nil })
		old := olderSpec(t, 3, "config", configLayout2Size)
		testSpecHook = func(_ Mode, spec *ebpf.CollectionSpec) { *spec = *old.Copy() }
		f := mustNew(t, o)
		// The older program has no word for the IMEX major: writing one
		// is refused, not dropped.
		cfg := f.cfg
		cfg.ImexMajor = major
		if err := putConfig(f.config, cfg); err == nil {
			t.Error("putConfig of an IMEX major into the 40-byte config map: no error")
		}
		step, system := setStepAndSystem(t, fx, f)
		mustClose(t, f)
		testSpecHook = nil
		fx.expectFabric(t, "job_1/step_0/user/task_0", false)
		_, got := fx.openIMEX(t, "job_1/step_0/user/task_0", dir, major)
		for _, c := range imexTestChannels {
			if n := fmt.Sprintf("channel%d", c); got[n] != unix.ENXIO {
				t.Errorf("open %s under the layout 3 program: errno %v, want ENXIO (it does not narrow IMEX)", n, got[n])
			}
		}
		view, err := InspectPins(o.PinDir)
		if err != nil || len(view.Errors) > 0 || view.Config == nil {
			t.Fatalf("InspectPins of the layout 3 pins: %v, %v, config %+v", err, view.Errors, view.Config)
		}
		if c := view.Config; c.CapsMajor != fx.capsMajor || c.NVSwitchMajor != fx.nvswitchMajor || c.NVLinkMajor != fx.nvlinkMajor || c.IMEXMajor != 0 {
			t.Errorf("layout 3 pinned config = %+v, want caps %d, nvswitch %d, nvlink %d, no IMEX major", c, fx.capsMajor, fx.nvswitchMajor, fx.nvlinkMajor)
		}

		o.IMEXMajor = major
		f = mustNew(t, o)
		if !f.Adopted() {
			t.Error("Adopted() = false after a layout 3 filter")
		}
		if got, want := int(f.config.ValueSize()), binary.Size(devfilterFilterConfig{}); got != want {
			t.Errorf("config map is %d bytes after the upgrade, want %d", got, want)
		}
		pols, err := f.Policies()
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint64]Policy{step.ID: {GPUMinors: []uint32{2}, CapsMinors: []uint32{12}}, system.ID: {AllowAll: true}}
		if fmt.Sprint(pols) != fmt.Sprint(want) {
			t.Errorf("Policies() after the upgrade = %v, want %v", pols, want)
		}
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 2)
		fx.expectCaps(t, "job_1/step_0/user/task_0", 12)
		fx.expectFabric(t, "job_1/step_0/user/task_0", false)
		fx.expectFabric(t, "system", true)
		fx.expectIMEX(t, "job_1/step_0/user/task_0", dir, major, -1)
		_, got = fx.openIMEX(t, "system", dir, major)
		for _, c := range imexTestChannels {
			if n := fmt.Sprintf("channel%d", c); got[n] != unix.ENXIO {
				t.Errorf("open %s from system (allow-all) after the upgrade: errno %v, want ENXIO", n, got[n])
			}
		}
		if err := f.Set(step, Policy{GPUMinors: []uint32{2}, CapsMinors: []uint32{12}, IMEXChannels: []uint32{1}}); err != nil {
			t.Fatal(err)
		}
		fx.expectIMEX(t, "job_1/step_0/user/task_0", dir, major, 1)
		fx.expectFabric(t, "job_1/step_0/user/task_0", false)
		view, err = InspectPins(o.PinDir)
		if err != nil || len(view.Errors) > 0 || view.Config == nil {
			t.Fatalf("InspectPins after the upgrade: %v, %v", err, view.Errors)
		}
		if c := view.Config; c.IMEXMajor != major || c.NVSwitchMajor != fx.nvswitchMajor || c.NVLinkMajor != fx.nvlinkMajor || c.CapsMajor != fx.capsMajor {
			t.Errorf("pinned config after the upgrade = %+v, want IMEX %d, nvswitch %d, nvlink %d, caps %d", c, major, fx.nvswitchMajor, fx.nvlinkMajor, fx.capsMajor)
		}
		if err := f.Unpin(); err != nil {
			t.Fatal(err)
		}
	})
}
