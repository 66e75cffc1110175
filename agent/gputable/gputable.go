// Package gputable is the node's GPU table: Slurm's GPU indices (gres.conf),
// the device files and minors each one opens, and what the NVIDIA driver
// says of them. It is built once at start and read by every stage: the
// step decision (which minors an index opens), attribution (which index a
// device is) and metrics.
package gputable

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/slurm"
)

// Table maps Slurm's GPU indices to devices. Its methods are safe for
// concurrent use.
type Table struct {
	NvidiaMajor uint32
	// CapsMajor is the nvidia-caps major; 0: unknown, MIG slices refused.
	CapsMajor uint32

	gpus map[int]devices.GPU
	devs map[int]policy.Devices
	// byMinor and byCaps attribute a device back to the indices that hold
	// it: the MIG slices of one GPU share its minor, the compute instances
	// of one GPU instance its access caps.
	byMinor map[uint32][]int
	byCaps  map[uint32][]int

	nvml atomic.Pointer[nvmlView]
}

// Load reads the GPUs gres.conf gives node and resolves their device
// files. A node with none is no error: every job then gets no GPU.
func Load(gresConf, node string, nvidiaMajor, capsMajor uint32) (*Table, error) {
	t := &Table{NvidiaMajor: nvidiaMajor, CapsMajor: capsMajor, gpus: map[int]devices.GPU{},
		devs: map[int]policy.Devices{}, byMinor: map[uint32][]int{}, byCaps: map[uint32][]int{}}
	table, err := slurm.ReadGresGPUs(gresConf, node)
	switch {
	case errors.Is(err, slurm.ErrNoGPUs):
		return t, nil
	case err != nil:
		return nil, err
	}
	resolved, err := devices.Resolve(table, nvidiaMajor, capsMajor)
	if err != nil {
		return nil, fmt.Errorf("GPU table from %s: %w", gresConf, err)
	}
	for _, g := range resolved {
		t.gpus[g.Index] = g
		t.devs[g.Index] = policy.Devices{GPUMinor: g.Minor, CapsMinors: g.CapsMinors()}
		t.byMinor[g.Minor] = append(t.byMinor[g.Minor], g.Index)
		for _, c := range g.Caps {
			t.byCaps[c.Minor] = append(t.byCaps[c.Minor], g.Index)
		}
	}
	return t, nil
}

// GPUs returns the table's GPUs by index.
func (t *Table) GPUs() []devices.GPU {
	out := make([]devices.GPU, 0, len(t.gpus))
	for _, g := range t.gpus {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b devices.GPU) int { return cmp.Compare(a.Index, b.Index) })
	return out
}

// GPU returns index's GPU.
func (t *Table) GPU(index int) (devices.GPU, bool) {
	g, ok := t.gpus[index]
	return g, ok
}

// Devices returns what holding gpus opens; an index the table lacks is an
// error (the agent never guesses which device a GPU is).
func (t *Table) Devices(gpus []int) (policy.DeviceSet, error) {
	return policy.DevicesFor(t.devs, gpus)
}

// Unknown returns the first of gpus the table lacks, if any.
func (t *Table) Unknown(gpus []int) (int, bool) {
	for _, g := range gpus {
		if _, ok := t.gpus[g]; !ok {
			return g, true
		}
	}
	return 0, false
}

// Of attributes a device to the GPU index holding it, and names its file: a
// GPU minor or a MIG capability minor. Slices of one GPU share its minor,
// and compute instances of one GPU instance its access minor, so an index
// in own (the step's) wins among several, else the lowest.
func (t *Table) Of(major, minor uint32, own []int) (devices.GPU, string, bool) {
	var held []int
	switch {
	case major == t.NvidiaMajor:
		held = t.byMinor[minor]
	case t.CapsMajor != 0 && major == t.CapsMajor:
		held = t.byCaps[minor]
	}
	if len(held) == 0 {
		return devices.GPU{}, "", false
	}
	idx := held[0]
	for _, h := range held {
		if slices.Contains(own, h) {
			idx = h
			break
		}
	}
	g := t.gpus[idx]
	if major == t.NvidiaMajor {
		return g, g.Path, true
	}
	for _, c := range g.Caps {
		if c.Minor == minor {
			return g, c.Path, true
		}
	}
	return g, "", true
}

// nvmlView is what NVML said about Slurm's GPUs; set once, never changed.
type nvmlView struct {
	// bySlurm maps Slurm's GPU index to the NVML GPU with the same minor
	// (for a MIG slice, its parent GPU).
	bySlurm map[int]inventory.GPU
	// uuid is the UUID of Slurm's GPU index: the GPU's, or for a MIG slice
	// the MIG device's its caps files grant.
	uuid map[int]string
	// untrusted is non-empty when Slurm's table disagrees with the driver:
	// the reason every step that asks for a GPU is refused.
	untrusted string
}

// Identified is one of Slurm's GPUs as NVML identified it.
type Identified struct {
	GPU  devices.GPU
	NVML inventory.GPU
	// MIG is the MIG device a slice's caps grant, when the GPU is one.
	MIG *inventory.MIGDevice
}

// CheckNVML checks the table against the GPUs the NVIDIA driver reports,
// once, before requests are served. It returns the GPUs it identified and
// the mismatches; when one is an error, Untrusted says so from then on:
// the agent cannot tell which device a Slurm index is, so every step that
// would get a GPU is refused.
func (t *Table) CheckNVML(gpus []inventory.GPU) ([]Identified, []inventory.Mismatch) {
	byMinor := map[uint32]inventory.GPU{}
	for _, g := range gpus {
		byMinor[g.Minor] = g
	}
	v := &nvmlView{bySlurm: map[int]inventory.GPU{}, uuid: map[int]string{}}
	var ids []Identified
	for _, g := range t.GPUs() {
		n, ok := byMinor[g.Minor]
		if !ok {
			continue
		}
		v.bySlurm[g.Index] = n
		id := Identified{GPU: g, NVML: n}
		if len(g.Caps) == 0 {
			v.uuid[g.Index] = n.UUID
		} else if m, ok := inventory.MatchSlice(n, g.CapsMinors()); ok {
			v.uuid[g.Index] = m.UUID
			id.MIG = &m
		}
		ids = append(ids, id)
	}
	ms := inventory.Check(gpus, t.GPUs())
	if errs := inventory.Errors(ms); len(errs) > 0 {
		more := ""
		if len(errs) > 1 {
			more = fmt.Sprintf(" (and %d more)", len(errs)-1)
		}
		v.untrusted = fmt.Sprintf("this node's GPU table (gres.conf) does not match the NVIDIA driver: %s%s; gpufence gives no GPU to any step until they agree (see the agent's log or gpufence doctor)",
			errs[0].Message, more)
	}
	t.nvml.Store(v)
	return ids, ms
}

// UUID returns the UUID of Slurm's GPU index where NVML identified it: the
// GPU's, or for a MIG slice the MIG device's.
func (t *Table) UUID(index int) (string, bool) {
	v := t.nvml.Load()
	if v == nil {
		return "", false
	}
	u, ok := v.uuid[index]
	return u, ok
}

// NVMLGPU returns the NVML view of Slurm's GPU index where NVML identified
// it (of the parent, for a MIG slice).
func (t *Table) NVMLGPU(index int) (inventory.GPU, bool) {
	v := t.nvml.Load()
	if v == nil {
		return inventory.GPU{}, false
	}
	g, ok := v.bySlurm[index]
	return g, ok
}

// Untrusted is why no GPU may be given now; "" when the table is trusted
// (or there is no NVML to check it against).
func (t *Table) Untrusted() string {
	if v := t.nvml.Load(); v != nil {
		return v.untrusted
	}
	return ""
}
