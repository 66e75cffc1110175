// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package inventory

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Inventory reads the node's GPUs through one initialized NVML; it is safe
// for concurrent use.
type Inventory struct {
	opts Options

	// mu serializes NVML use against Close: a call after Shutdown would
	// touch a library that may be unloaded.
	mu     sync.Mutex
	lib    nvml.Interface
	closed bool
}

// OpenSystem opens the driver's own NVML (libnvidia-ml.so.1, loaded with
// dlopen only now, so a node without the driver still runs this binary).
// Without the library or the kernel module the error wraps ErrNoDriver.
func OpenSystem(opts Options) (*Inventory, error) {
	return Open(nvml.New(), opts)
}

// Open initializes lib once; Close shuts it down once. Tests pass go-nvml's
// mock servers; OpenSystem passes the real library.
func Open(lib nvml.Interface, opts Options) (*Inventory, error) {
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
		return &Inventory{lib: lib, opts: opts}, nil
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		return nil, fmt.Errorf("%w: NVML init: %w", ErrNoDriver, ret)
	default:
		return nil, fmt.Errorf("NVML init: %w", ret)
	}
}

// Close shuts NVML down; later calls return ErrClosed.
func (inv *Inventory) Close() error {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.closed {
		return nil
	}
	inv.closed = true
	if ret := inv.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML shutdown: %v", ret)
	}
	return nil
}

// GPUs lists every GPU NVML sees, in NVML index order, with its MIG devices
// and the nvidia-caps minors that grant them.
func (inv *Inventory) GPUs() ([]GPU, error) {
	gpus := []GPU{}
	var caps *MIGMinors
	err := inv.eachDevice(func(i int, dev nvml.Device) error {
		g, err := readGPU(i, dev)
		if err != nil {
			return err
		}
		if g.MIGEnabled {
			if g.MIG, err = readMIG(g, dev); err != nil {
				return err
			}
		}
		if len(g.MIG) > 0 {
			if caps == nil {
				c, err := ReadMIGMinors(inv.opts.migMinorsPath())
				if err != nil {
					return fmt.Errorf("NVML GPU %d has MIG devices: %w", i, err)
				}
				caps = &c
			}
			if err := capMinors(&g, caps, inv.opts.migMinorsPath()); err != nil {
				return err
			}
		}
		gpus = append(gpus, g)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return gpus, nil
}

// eachDevice calls fn with each GPU's NVML index and handle, in index
// order, under the inventory's lock; the first error stops it.
func (inv *Inventory) eachDevice(fn func(i int, dev nvml.Device) error) error {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.closed {
		return ErrClosed
	}
	n, ret := inv.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML device count: %v", ret)
	}
	for i := 0; i < n; i++ {
		dev, ret := inv.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("NVML GPU %d: handle: %v", i, ret)
		}
		if err := fn(i, dev); err != nil {
			return err
		}
	}
	return nil
}

// identity is what names a GPU: its device minor, UUID, PCI bus id and
// name, read alike for the inventory and for each sample.
type identity struct {
	minor                int
	uuid, pciBusID, name string
}

func readIdentity(i int, dev nvml.Device) (identity, error) {
	fail := func(what string, ret nvml.Return) (identity, error) {
		return identity{}, fmt.Errorf("NVML GPU %d: %s: %v", i, what, ret)
	}
	var id identity
	var ret nvml.Return
	if id.minor, ret = dev.GetMinorNumber(); ret != nvml.SUCCESS {
		return fail("minor number", ret)
	}
	if id.uuid, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return fail("UUID", ret)
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return fail("PCI info", ret)
	}
	id.pciBusID = busID(pci)
	if id.name, ret = dev.GetName(); ret != nvml.SUCCESS {
		return fail("name", ret)
	}
	return id, nil
}

func readGPU(i int, dev nvml.Device) (GPU, error) {
	g := GPU{Index: i}
	fail := func(what string, ret nvml.Return) (GPU, error) {
		return GPU{}, fmt.Errorf("NVML GPU %d: %s: %v", i, what, ret)
	}
	id, err := readIdentity(i, dev)
	if err != nil {
		return GPU{}, err
	}
	if id.minor < 0 {
		return GPU{}, fmt.Errorf("NVML GPU %d: negative minor number %d", i, id.minor)
	}
	g.Minor, g.UUID, g.PCIBusID, g.Name = uint32(id.minor), id.uuid, id.pciBusID, id.name
	current, _, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		g.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED:
		// A GPU without MIG (anything before Ampere, consumer boards).
	default:
		return fail("MIG mode", ret)
	}
	return g, nil
}

// readMIG lists the MIG devices of a MIG-enabled GPU. Empty slots answer
// ERROR_NOT_FOUND.
func readMIG(g GPU, dev nvml.Device) ([]MIGDevice, error) {
	slots, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML GPU %d: MIG device count: %v", g.Index, ret)
	}
	var out []MIGDevice
	for j := 0; j < slots; j++ {
		mig, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		fail := func(what string, ret nvml.Return) ([]MIGDevice, error) {
			return nil, fmt.Errorf("NVML GPU %d MIG device %d: %s: %v", g.Index, j, what, ret)
		}
		if ret != nvml.SUCCESS {
			return fail("handle", ret)
		}
		m := MIGDevice{Index: j}
		gi, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return fail("GPU instance id", ret)
		}
		ci, ret := mig.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return fail("compute instance id", ret)
		}
		if gi < 0 || ci < 0 {
			return nil, fmt.Errorf("NVML GPU %d MIG device %d: negative instance ids gi=%d ci=%d", g.Index, j, gi, ci)
		}
		m.GI, m.CI = uint32(gi), uint32(ci)
		if m.UUID, ret = mig.GetUUID(); ret != nvml.SUCCESS {
			return fail("UUID", ret)
		}
		name, ret := mig.GetName()
		if ret != nvml.SUCCESS {
			return fail("name", ret)
		}
		m.Profile = migProfile(name)
		out = append(out, m)
	}
	return out, nil
}

// capMinors fills each MIG device's nvidia-caps minors. A MIG device the
// table does not list is an error: guessing its minor could grant another
// instance.
func capMinors(g *GPU, caps *MIGMinors, file string) error {
	for k := range g.MIG {
		m := &g.MIG[k]
		gi, ok := caps.GI[GIKey{g.Minor, m.GI}]
		if !ok {
			return fmt.Errorf("%s lists no gpu%d/gi%d/access for MIG device %s (NVML GPU %d)", file, g.Minor, m.GI, m.UUID, g.Index)
		}
		ci, ok := caps.CI[CIKey{g.Minor, m.GI, m.CI}]
		if !ok {
			return fmt.Errorf("%s lists no gpu%d/gi%d/ci%d/access for MIG device %s (NVML GPU %d)", file, g.Minor, m.GI, m.CI, m.UUID, g.Index)
		}
		m.GICapMinor, m.CICapMinor = gi, ci
	}
	return nil
}

// Sample reads each GPU's utilization and memory. A GPU that does not
// report utilization (MIG-enabled GPUs answer ERROR_NOT_SUPPORTED) has
// UtilizationKnown false.
func (inv *Inventory) Sample() ([]Usage, error) {
	out := []Usage{}
	err := inv.eachDevice(func(i int, dev nvml.Device) error {
		fail := func(what string, ret nvml.Return) error {
			return fmt.Errorf("NVML GPU %d: %s: %v", i, what, ret)
		}
		id, err := readIdentity(i, dev)
		if err != nil {
			return err
		}
		u := Usage{Index: i, Minor: uint32(id.minor), UUID: id.uuid, PCIBusID: id.pciBusID, Name: id.name}
		switch util, ret := dev.GetUtilizationRates(); ret {
		case nvml.SUCCESS:
			u.UtilizationGPU, u.UtilizationKnown = util.Gpu, true
		case nvml.ERROR_NOT_SUPPORTED:
		default:
			return fail("utilization", ret)
		}
		mem, ret := dev.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return fail("memory", ret)
		}
		u.MemoryUsed, u.MemoryTotal = mem.Used, mem.Total
		out = append(out, u)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// busID is the PCI address as nvidia-smi prints it (00000000:18:00.0).
func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	if len(b) > 0 {
		return string(b)
	}
	return fmt.Sprintf("%08X:%02X:%02X.0", p.Domain, p.Bus, p.Device)
}
