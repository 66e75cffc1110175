// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package inventory

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// node is go-nvml's DGX H100 mock with what its devices lack filled in: a
// PCI bus id in GetPciInfo, utilization, and counters of Init and Shutdown.
type node struct {
	*server.Server
	inits, shutdowns int
}

func newNode(t *testing.T, s *server.Server) *node {
	t.Helper()
	n := &node{Server: s}
	s.InitFunc = func() nvml.Return { n.inits++; return nvml.SUCCESS }
	s.ShutdownFunc = func() nvml.Return { n.shutdowns++; return nvml.SUCCESS }
	for i := range s.Devices {
		d := n.dev(i)
		d.PciBusID = fmt.Sprintf("00000000:%02X:00.0", 0x18+i*0x10)
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			p := nvml.PciInfo{PciDeviceId: d.Config.PciDeviceId, Bus: uint32(0x18 + i*0x10)}
			copy(p.BusId[:], cString(d.PciBusID))
			return p, nvml.SUCCESS
		}
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			if d.MigMode == nvml.DEVICE_MIG_ENABLE {
				return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
			}
			return nvml.Utilization{Gpu: uint32(10 * i)}, nvml.SUCCESS
		}
		d.MemoryInfo.Used = uint64(i) << 30
	}
	return n
}

func (n *node) dev(i int) *server.Device { return n.Devices[i].(*server.Device) }

func cString(s string) []int8 {
	out := make([]int8, len(s))
	for i := range s {
		out[i] = int8(s[i])
	}
	return out
}

// migSlot is one MIG device the test puts on a GPU by hand.
type migSlot struct {
	gi, ci  int
	profile string
}

// enableMIG turns MIG on for GPU i with the given slots (nil: empty slot,
// which NVML answers with ERROR_NOT_FOUND).
func (n *node) enableMIG(i int, slots ...*migSlot) []string {
	d := n.dev(i)
	d.MigMode = nvml.DEVICE_MIG_ENABLE
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	var uuids []string
	devs := make([]nvml.Device, len(slots))
	for j, s := range slots {
		if s == nil {
			continue
		}
		uuid := fmt.Sprintf("MIG-%08d-%04d-0000-0000-000000000000", i, j)
		uuids = append(uuids, uuid)
		devs[j] = &mock.Device{
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return s.gi, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return s.ci, nvml.SUCCESS },
			GetUUIDFunc:              func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
			GetNameFunc:              func() (string, nvml.Return) { return d.Config.Name + " MIG " + s.profile, nvml.SUCCESS },
		}
	}
	d.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		if j < 0 || j >= 7 {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if j >= len(devs) || devs[j] == nil {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return devs[j], nvml.SUCCESS
	}
	return uuids
}

func fixture(t *testing.T) Options {
	p, err := filepath.Abs("testdata/mig-minors")
	if err != nil {
		t.Fatal(err)
	}
	return Options{MIGMinorsPath: p}
}

func TestInventoryDGXH100(t *testing.T) {
	n := newNode(t, dgxh100.New())
	inv, err := Open(n, fixture(t))
	if err != nil {
		t.Fatal(err)
	}
	got, err := inv.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 {
		t.Fatalf("%d GPUs, want 8", len(got))
	}
	seen := map[string]bool{}
	for i, g := range got {
		d := n.dev(i)
		want := GPU{Index: i, Minor: uint32(i), UUID: d.UUID, PCIBusID: d.PciBusID, Name: "NVIDIA H100 80GB HBM3"}
		if !equalGPU(g, want) {
			t.Errorf("GPU %d = %+v, want %+v", i, g, want)
		}
		if seen[g.UUID] || !strings.HasPrefix(g.UUID, "GPU-") {
			t.Errorf("GPU %d: UUID %q repeated or malformed", i, g.UUID)
		}
		seen[g.UUID] = true
	}
	if got[3].PCIBusID != "00000000:48:00.0" {
		t.Errorf("bus id %q", got[3].PCIBusID)
	}
	if err := inv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := inv.Close(); err != nil {
		t.Fatal(err)
	}
	if n.inits != 1 || n.shutdowns != 1 {
		t.Errorf("Init %d times, Shutdown %d times; want once each", n.inits, n.shutdowns)
	}
	if _, err := inv.GPUs(); !errors.Is(err, ErrClosed) {
		t.Errorf("GPUs after Close: %v", err)
	}
	if _, err := inv.Sample(); !errors.Is(err, ErrClosed) {
		t.Errorf("Sample after Close: %v", err)
	}
}

func equalGPU(a, b GPU) bool {
	return a.Index == b.Index && a.Minor == b.Minor && a.UUID == b.UUID && a.PCIBusID == b.PCIBusID &&
		a.Name == b.Name && a.MIGEnabled == b.MIGEnabled && slices.Equal(a.MIG, b.MIG)
}

// TestInventoryMIG: minors run opposite to NVML indices, so a cap minor
// looked up by index instead of minor shows.
func TestInventoryMIG(t *testing.T) {
	n := newNode(t, dgxh100.New())
	for i := range n.Devices {
		n.dev(i).Minor = 7 - i
	}
	u2 := n.enableMIG(2, &migSlot{gi: 1, ci: 0, profile: "3g.40gb"}, nil, &migSlot{gi: 1, ci: 1, profile: "1c.3g.40gb"})
	u5 := n.enableMIG(5, &migSlot{gi: 2, ci: 0, profile: "1g.10gb"})
	n.enableMIG(6) // MIG on, no instance yet
	inv, err := Open(n, fixture(t))
	if err != nil {
		t.Fatal(err)
	}
	defer inv.Close()
	got, err := inv.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	// Table (testdata/mig-minors, the driver's numbering): gpuN/giG/access
	// is 3 + 135N + 9G, its ciC is one more plus C.
	want := map[int][]MIGDevice{
		2: { // minor 5
			{Index: 0, UUID: u2[0], Profile: "3g.40gb", GI: 1, CI: 0, GICapMinor: 687, CICapMinor: 688},
			{Index: 2, UUID: u2[1], Profile: "1c.3g.40gb", GI: 1, CI: 1, GICapMinor: 687, CICapMinor: 689},
		},
		5: { // minor 2
			{Index: 0, UUID: u5[0], Profile: "1g.10gb", GI: 2, CI: 0, GICapMinor: 291, CICapMinor: 292},
		},
	}
	for i, g := range got {
		if g.Minor != uint32(7-i) {
			t.Errorf("GPU %d minor %d", i, g.Minor)
		}
		if wantMIG := i == 2 || i == 5 || i == 6; g.MIGEnabled != wantMIG {
			t.Errorf("GPU %d MIGEnabled = %v", i, g.MIGEnabled)
		}
		if !slices.Equal(g.MIG, want[i]) {
			t.Errorf("GPU %d MIG devices:\n got %+v\nwant %+v", i, g.MIG, want[i])
		}
	}
}

func TestInventoryErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		setup    func(n *node, o *Options)
		openErr  string // "" when Open succeeds
		noDriver bool
		gpusErr  string
	}{
		{name: "library not found", setup: func(n *node, _ *Options) {
			n.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
		}, openErr: "NVML init", noDriver: true},
		{name: "driver not loaded", setup: func(n *node, _ *Options) {
			n.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
		}, openErr: "NVML init", noDriver: true},
		{name: "init fails otherwise", setup: func(n *node, _ *Options) {
			n.InitFunc = func() nvml.Return { return nvml.ERROR_NO_PERMISSION }
		}, openErr: "NVML init: ERROR_NO_PERMISSION"},
		{name: "driver/library version mismatch is no missing driver", setup: func(n *node, _ *Options) {
			n.InitFunc = func() nvml.Return { return nvml.ERROR_LIB_RM_VERSION_MISMATCH }
		}, openErr: "NVML init"},
		{name: "device count fails", setup: func(n *node, _ *Options) {
			n.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		}, gpusErr: "NVML device count: ERROR_UNKNOWN"},
		{name: "minor number fails", setup: func(n *node, _ *Options) {
			n.dev(4).GetMinorNumberFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }
		}, gpusErr: "NVML GPU 4: minor number: ERROR_GPU_IS_LOST"},
		{name: "MIG mode fails", setup: func(n *node, _ *Options) {
			n.dev(1).GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_UNKNOWN }
		}, gpusErr: "NVML GPU 1: MIG mode"},
		{name: "MIG not supported is MIG off", setup: func(n *node, _ *Options) {
			n.dev(1).GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
		}},
		{name: "MIG device without caps entry", setup: func(n *node, _ *Options) {
			n.enableMIG(0, &migSlot{gi: 14, ci: 7, profile: "1g.10gb"})
			n.dev(0).Minor = 9 // the fixture lists gpu0..gpu7 only
		}, gpusErr: "lists no gpu9/gi14/access for MIG device MIG-00000000-0000"},
		{name: "mig-minors missing", setup: func(n *node, o *Options) {
			n.enableMIG(3, &migSlot{gi: 1, ci: 0, profile: "3g.40gb"})
			o.MIGMinorsPath = "/nonexistent/mig-minors"
		}, gpusErr: "NVML GPU 3 has MIG devices: read MIG capability minors: open /nonexistent/mig-minors"},
		{name: "MIG on without devices needs no mig-minors", setup: func(n *node, o *Options) {
			n.enableMIG(3)
			o.MIGMinorsPath = "/nonexistent/mig-minors"
		}},
		{name: "MIG device handle fails", setup: func(n *node, _ *Options) {
			n.enableMIG(3, &migSlot{gi: 1, ci: 0, profile: "3g.40gb"})
			n.dev(3).GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_UNKNOWN }
		}, gpusErr: "NVML GPU 3 MIG device 0: handle: ERROR_UNKNOWN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, dgxh100.New())
			opts := fixture(t)
			tc.setup(n, &opts)
			inv, err := Open(n, opts)
			if tc.openErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.openErr) {
					t.Fatalf("Open: %v, want %q", err, tc.openErr)
				}
				if errors.Is(err, ErrNoDriver) != tc.noDriver {
					t.Errorf("errors.Is(%v, ErrNoDriver) = %v, want %v", err, !tc.noDriver, tc.noDriver)
				}
				if n.shutdowns != 0 {
					t.Errorf("Shutdown called after a failed Init")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer inv.Close()
			_, err = inv.GPUs()
			switch {
			case tc.gpusErr == "" && err != nil:
				t.Errorf("GPUs: %v", err)
			case tc.gpusErr != "" && (err == nil || !strings.Contains(err.Error(), tc.gpusErr)):
				t.Errorf("GPUs: %v, want %q", err, tc.gpusErr)
			}
		})
	}
}

// TestCheckAgainstMock: the mismatch cases of the issue on the mock node.
func TestCheckAgainstMock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		nvml   int
		minors []uint32
		want   []MismatchKind
	}{
		{"Slurm lists 8 and NVML has 8", 8, []uint32{0, 1, 2, 3, 4, 5, 6, 7}, nil},
		{"Slurm lists 8 but NVML has 7", 7, []uint32{0, 1, 2, 3, 4, 5, 6, 7}, []MismatchKind{MismatchCount, MismatchNotInNVML}},
		{"a minor differs", 8, []uint32{0, 1, 2, 3, 4, 5, 6, 8}, []MismatchKind{MismatchNotInNVML, MismatchNotInSlurm}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, dgxh100.NewWithGPUs(gpus.Multiple(tc.nvml, gpus.H100_SXM5_80GB)...))
			inv, err := Open(n, fixture(t))
			if err != nil {
				t.Fatal(err)
			}
			defer inv.Close()
			got, err := inv.GPUs()
			if err != nil {
				t.Fatal(err)
			}
			ms := Check(got, slurmTable(tc.minors...))
			var kinds []MismatchKind
			for _, m := range ms {
				kinds = append(kinds, m.Kind)
			}
			if !slices.Equal(kinds, tc.want) {
				t.Errorf("mismatches %v, want %v: %v", kinds, tc.want, ms)
			}
			for _, m := range ms {
				if m.NVML != nil && !strings.Contains(m.Message, m.NVML.UUID) {
					t.Errorf("message lacks the NVML UUID: %s", m)
				}
			}
		})
	}
}

func TestSampleConcurrent(t *testing.T) {
	n := newNode(t, dgxh100.New())
	n.enableMIG(7)
	inv, err := Open(n, fixture(t))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for k := 0; k < 8; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < 50; r++ {
				u, err := inv.Sample()
				if err != nil {
					errs <- err
					return
				}
				if len(u) != 8 || u[3].UtilizationGPU != 30 || !u[3].UtilizationKnown || u[3].MemoryUsed != 3<<30 ||
					u[3].MemoryTotal != 80*1024<<20 || u[3].UUID != n.dev(3).UUID || u[7].UtilizationKnown {
					errs <- fmt.Errorf("sample %+v", u)
					return
				}
				gs, err := inv.GPUs()
				if err != nil {
					errs <- err
					return
				}
				// The sample names each GPU as the inventory does (the
				// metrics' pci_bus_id and modelName labels).
				if gs[3].PCIBusID == "" || u[3].PCIBusID != gs[3].PCIBusID || gs[3].Name == "" || u[3].Name != gs[3].Name {
					errs <- fmt.Errorf("sample names GPU 3 %q %q, the inventory %q %q", u[3].PCIBusID, u[3].Name, gs[3].PCIBusID, gs[3].Name)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	inv.Close()
	if n.shutdowns != 1 {
		t.Errorf("%d shutdowns", n.shutdowns)
	}
}

// TestOpenSystem uses the real go-nvml: on a machine without the NVIDIA
// driver (no /proc/driver/nvidia) libnvidia-ml.so.1 is missing or cannot
// initialize, and that must read as ErrNoDriver; with a driver it must list
// at least one GPU.
func TestOpenSystem(t *testing.T) {
	inv, err := OpenSystem(Options{})
	if _, statErr := os.Stat("/proc/driver/nvidia/gpus"); statErr != nil {
		if !errors.Is(err, ErrNoDriver) {
			t.Fatalf("no driver here (%v), but OpenSystem = %v, want ErrNoDriver", statErr, err)
		}
		t.Logf("no driver: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("driver present but OpenSystem: %v", err)
	}
	defer inv.Close()
	got, err := inv.GPUs()
	if err != nil || len(got) == 0 {
		t.Fatalf("GPUs: %d, %v", len(got), err)
	}
	for _, g := range got {
		t.Logf("GPU %d minor %d %s %s %s mig=%v", g.Index, g.Minor, g.UUID, g.PCIBusID, g.Name, g.MIGEnabled)
	}
}
