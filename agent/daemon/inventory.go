package daemon

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/inventory"
)

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

// SetInventory checks Slurm's GPU table against the GPUs the NVIDIA driver
// reports and returns the mismatches. Call it once, before serving
// requests. When a mismatch is an error, the daemon fails closed: it cannot
// tell which device a Slurm GPU index is, so every step that would get a
// GPU is refused with the reason, while CPU-only steps still run and the
// agent stays reachable for gpufence status and doctor. Policies already
// in the kernel from before (restored steps) are left as they are.
func (d *Daemon) SetInventory(gpus []inventory.GPU) []inventory.Mismatch {
	table := make([]devices.GPU, 0, len(d.gpus))
	for _, g := range d.gpus {
		table = append(table, g)
	}
	slices.SortFunc(table, func(a, b devices.GPU) int { return cmp.Compare(a.Index, b.Index) })
	byMinor := map[uint32]inventory.GPU{}
	for _, g := range gpus {
		byMinor[g.Minor] = g
	}
	v := &nvmlView{bySlurm: map[int]inventory.GPU{}, uuid: map[int]string{}}
	for _, g := range table {
		n, ok := byMinor[g.Minor]
		if !ok {
			continue
		}
		v.bySlurm[g.Index] = n
		attrs := []any{keyGPU, g.Index, "path", g.Path, "device", fmt.Sprintf("%d:%d", g.Major, g.Minor),
			"nvml_index", n.Index, "uuid", n.UUID, "bus_id", n.PCIBusID, "name", n.Name, "mig", migSummary(n)}
		if len(g.Caps) == 0 {
			v.uuid[g.Index] = n.UUID
		} else if m, ok := inventory.MatchSlice(n, g.CapsMinors()); ok {
			v.uuid[g.Index] = m.UUID
			attrs = append(attrs, "caps", g.CapsMinors(), "mig_uuid", m.UUID, "mig_profile", m.Profile)
		}
		d.log.Info("gpu identified by NVML", attrs...)
	}
	ms := inventory.Check(gpus, table)
	for _, m := range ms {
		sev, msg := audit.SeverityWarning, "Slurm's GPU table (gres.conf) and the NVIDIA driver disagree; GPUs are still given out"
		if m.Severity == inventory.SeverityError {
			d.log.Error("GPU table mismatch", "kind", m.Kind, "detail", m.Message)
			sev, msg = audit.SeverityError, "Slurm's GPU table (gres.conf) does not match the NVIDIA driver; steps that ask for a GPU are refused"
		} else {
			d.log.Warn("GPU table warning", "kind", m.Kind, "detail", m.Message)
		}
		d.lifecycle(audit.EventGPUTableMismatch, sev, msg, func(r *audit.Record) {
			r.Error = string(m.Kind) + ": " + m.Message
		})
	}
	if errs := inventory.Errors(ms); len(errs) > 0 {
		more := ""
		if len(errs) > 1 {
			more = fmt.Sprintf(" (and %d more)", len(errs)-1)
		}
		v.untrusted = fmt.Sprintf("this node's GPU table (gres.conf) does not match the NVIDIA driver: %s%s; gpufence gives no GPU to any step until they agree (see the agent's log or gpufence doctor)",
			errs[0].Message, more)
		d.log.Error("Slurm's GPU table does not match the NVIDIA driver; failing closed: steps that ask for a GPU are refused, CPU-only steps run", "mismatches", len(errs))
	}
	d.nvml.Store(v)
	return ms
}

func migSummary(g inventory.GPU) string {
	if !g.MIGEnabled {
		return "off"
	}
	s := fmt.Sprintf("on, %d devices", len(g.MIG))
	for _, m := range g.MIG {
		s += fmt.Sprintf(" [%s gi%d/ci%d %s caps %d/%d]", m.Profile, m.GI, m.CI, m.UUID, m.GICapMinor, m.CICapMinor)
	}
	return s
}

// GPUUUID returns the UUID of Slurm's GPU index where NVML identified it:
// the GPU's, or for a MIG slice the MIG device's.
func (d *Daemon) GPUUUID(index int) (string, bool) {
	v := d.nvml.Load()
	if v == nil {
		return "", false
	}
	u, ok := v.uuid[index]
	return u, ok
}

// NVMLGPU returns the NVML view of Slurm's GPU index where NVML identified
// it: UUID, bus id, name and MIG devices (of the parent, for a MIG slice).
func (d *Daemon) NVMLGPU(index int) (inventory.GPU, bool) {
	v := d.nvml.Load()
	if v == nil {
		return inventory.GPU{}, false
	}
	g, ok := v.bySlurm[index]
	return g, ok
}

// untrustedTable is why no GPU may be given now; empty when the table is
// trusted (or there is no NVML to check it against).
func (d *Daemon) untrustedTable() string {
	if v := d.nvml.Load(); v != nil {
		return v.untrusted
	}
	return ""
}
