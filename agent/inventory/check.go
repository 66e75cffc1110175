// SPDX-License-Identifier: Apache-2.0

package inventory

import (
	"fmt"
	"slices"
	"sort"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/devices"
)

// MismatchKind names what disagrees between Slurm's GPU table and NVML.
type MismatchKind string

// Kinds of mismatch.
const (
	// MismatchCount: gres.conf and NVML list a different number of GPUs.
	MismatchCount MismatchKind = "count"
	// MismatchNotInNVML: a Slurm GPU's device minor is no GPU NVML knows.
	MismatchNotInNVML MismatchKind = "not_in_nvml"
	// MismatchNotInSlurm: NVML has a GPU no gres.conf entry names.
	MismatchNotInSlurm MismatchKind = "not_in_slurm"
	// MismatchMIGWhole: a MIG-enabled GPU is given out whole.
	MismatchMIGWhole MismatchKind = "mig_whole_gpu"
	// MismatchMIGOff: gres.conf lists MIG slices of a GPU whose MIG mode
	// is off, so every slice's holder could use the whole GPU.
	MismatchMIGOff MismatchKind = "mig_disabled"
	// MismatchMIGSlice: a MIG slice's nvidia-caps files are not the
	// capabilities of a MIG device that exists on its parent GPU.
	MismatchMIGSlice MismatchKind = "mig_slice_unknown"
)

// Severity says whether a mismatch makes Slurm's table untrustworthy. It
// is the audit records' scale, so a mismatch's severity is its record's.
type Severity = audit.Severity

// Severities.
const (
	// SeverityError: GPU indices cannot be mapped to devices with
	// confidence; the agent gives no GPU to any step until it is fixed.
	SeverityError = audit.SeverityError
	// SeverityWarning: the mapping holds, but the node is set up in a way
	// that likely does not do what its admin wants.
	SeverityWarning = audit.SeverityWarning
)

// Mismatch is one disagreement, with both sides where there are two.
type Mismatch struct {
	Kind     MismatchKind
	Severity Severity
	// Slurm is the gres.conf side (index, device file, minor); nil when the
	// mismatch has no Slurm GPU.
	Slurm *devices.GPU
	// NVML is the driver's side; nil when NVML has no such GPU.
	NVML *GPU
	// Message explains the mismatch and what to do, in one line.
	Message string
}

// String is the message.
func (m Mismatch) String() string { return m.Message }

// Errors returns the mismatches of SeverityError.
func Errors(ms []Mismatch) []Mismatch {
	var out []Mismatch
	for _, m := range ms {
		if m.Severity == SeverityError {
			out = append(out, m)
		}
	}
	return out
}

// Check compares Slurm's GPU table (gres.conf resolved to device numbers)
// with the GPUs NVML reports. GPUs are matched by device minor, the one
// number both sides share: Slurm's index is gres.conf order, NVML's is PCI
// order, and the two need not agree. A MIG slice (an entry with caps
// files) is matched to its parent GPU by minor and to a MIG device by its
// caps minors. It returns nothing when the two sides agree.
func Check(gpus []GPU, table []devices.GPU) []Mismatch {
	var out []Mismatch
	byMinor := map[uint32]*GPU{}
	for i := range gpus {
		byMinor[gpus[i].Minor] = &gpus[i]
	}
	inSlurm := map[uint32]bool{}
	for _, s := range table {
		inSlurm[s.Minor] = true
	}
	if len(gpus) != len(inSlurm) {
		out = append(out, Mismatch{Kind: MismatchCount, Severity: SeverityError,
			Message: fmt.Sprintf("gres.conf names %d GPU devices for this node but the NVIDIA driver (NVML) sees %d GPUs", len(inSlurm), len(gpus))})
	}
	for i := range table {
		s := &table[i]
		n, ok := byMinor[s.Minor]
		switch {
		case !ok:
			out = append(out, Mismatch{Kind: MismatchNotInNVML, Severity: SeverityError, Slurm: s,
				Message: fmt.Sprintf("Slurm GPU %d (%s, device %d:%d) is not a GPU the NVIDIA driver knows: NVML has no GPU with minor %d%s",
					s.Index, s.Path, s.Major, s.Minor, s.Minor, nvmlMinors(gpus))})
		case len(s.Caps) == 0 && n.MIGEnabled:
			out = append(out, Mismatch{Kind: MismatchMIGWhole, Severity: SeverityWarning, Slurm: s, NVML: n,
				Message: fmt.Sprintf("Slurm GPU %d (%s) is NVML GPU %d (%s, %s, bus %s) with MIG enabled and %d MIG devices, but gres.conf gives it out whole: "+
					"a job holding it can use all of its MIG devices and Slurm cannot give its slices to different jobs; "+
					"list the slices with MultipleFiles= (or AutoDetect=nvml), or disable MIG on it",
					s.Index, s.Path, n.Index, n.Name, n.UUID, n.PCIBusID, len(n.MIG))})
		case len(s.Caps) > 0 && !n.MIGEnabled:
			out = append(out, Mismatch{Kind: MismatchMIGOff, Severity: SeverityError, Slurm: s, NVML: n,
				Message: fmt.Sprintf("Slurm GPU %d (%s, a MIG slice with caps %v) is on NVML GPU %d (%s, %s, bus %s), whose MIG mode is off: "+
					"every holder of one of its slices could use the whole GPU; enable MIG and create the instances, or list the GPU with File=",
					s.Index, s.Source, s.CapsMinors(), n.Index, n.Name, n.UUID, n.PCIBusID)})
		case len(s.Caps) > 0:
			if why := sliceProblem(*n, s.CapsMinors()); why != "" {
				out = append(out, Mismatch{Kind: MismatchMIGSlice, Severity: SeverityError, Slurm: s, NVML: n,
					Message: fmt.Sprintf("Slurm GPU %d (%s, a MIG slice with caps %v) is no MIG device of NVML GPU %d (%s, %s): %s; its MIG devices have caps %s (/proc/driver/nvidia-caps/mig-minors)",
						s.Index, s.Source, s.CapsMinors(), n.Index, n.UUID, n.PCIBusID, why, migCaps(n.MIG))})
			}
		}
	}
	for i := range gpus {
		n := &gpus[i]
		if inSlurm[n.Minor] {
			continue
		}
		out = append(out, Mismatch{Kind: MismatchNotInSlurm, Severity: SeverityError, NVML: n,
			Message: fmt.Sprintf("NVML GPU %d (%s, %s, bus %s, /dev/nvidia%d) is in no gres.conf File= or MultipleFiles= entry for this node",
				n.Index, n.Name, n.UUID, n.PCIBusID, n.Minor)})
	}
	return out
}

// sliceProblem says why the caps minors of a slice do not grant MIG
// devices of g: each must be the GPU-instance or compute-instance
// capability of one of them, a compute instance's only together with its
// GPU instance's, and at least one GPU instance must be named.
func sliceProblem(g GPU, caps []uint32) string {
	gi := map[uint32]uint32{} // cap minor -> GI id
	ci := map[uint32]uint32{} // cap minor -> GI id of the compute instance
	for _, m := range g.MIG {
		gi[m.GICapMinor] = m.GI
		ci[m.CICapMinor] = m.GI
	}
	named := map[uint32]bool{}
	for _, c := range caps {
		id, isGI := gi[c]
		_, isCI := ci[c]
		switch {
		case isGI:
			named[id] = true
		case !isCI:
			return fmt.Sprintf("caps minor %d belongs to no MIG device on this GPU (destroyed, or another GPU's)", c)
		}
	}
	if len(named) == 0 {
		return "it names no GPU instance's access capability"
	}
	for _, c := range caps {
		if _, ok := gi[c]; ok {
			continue
		}
		if id := ci[c]; !named[id] {
			return fmt.Sprintf("caps minor %d is a compute instance of GPU instance %d, whose access capability it lacks", c, id)
		}
	}
	return ""
}

// MatchSlice finds the MIG device of g that a slice with the given
// nvidia-caps minors grants: every minor must be the GPU-instance or
// compute-instance capability of one of g's MIG devices, and one device
// must be fully granted (its GPU instance's capability, and its compute
// instance's unless the slice names the GPU instance alone and it has one
// compute instance). It is false when no device, or more than one, fits.
func MatchSlice(g GPU, caps []uint32) (MIGDevice, bool) {
	if len(caps) == 0 {
		return MIGDevice{}, false
	}
	known := map[uint32]bool{}
	perGI := map[uint32]int{}
	for _, m := range g.MIG {
		known[m.GICapMinor], known[m.CICapMinor] = true, true
		perGI[m.GI]++
	}
	for _, c := range caps {
		if !known[c] {
			return MIGDevice{}, false
		}
	}
	var found []MIGDevice
	for _, m := range g.MIG {
		if !slices.Contains(caps, m.GICapMinor) {
			continue
		}
		if slices.Contains(caps, m.CICapMinor) || perGI[m.GI] == 1 {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		return MIGDevice{}, false
	}
	return found[0], true
}

func migCaps(ms []MIGDevice) string {
	if len(ms) == 0 {
		return "none (no MIG device exists)"
	}
	s := ""
	for i, m := range ms {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s gi%d/ci%d [%d %d]", m.Profile, m.GI, m.CI, m.GICapMinor, m.CICapMinor)
	}
	return s
}

func nvmlMinors(gpus []GPU) string {
	if len(gpus) == 0 {
		return " (NVML sees no GPU)"
	}
	ms := make([]int, 0, len(gpus))
	for _, g := range gpus {
		ms = append(ms, int(g.Minor))
	}
	sort.Ints(ms)
	return fmt.Sprintf(" (NVML minors: %v)", ms)
}
