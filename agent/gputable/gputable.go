// SPDX-License-Identifier: Apache-2.0

// Package gputable is the node's GPU table: Slurm's GPU indices, the
// device files and minors each one opens, and what the NVIDIA driver says
// of them. It is built once at start from slurmd's own view (slurmd -G),
// cross-checked with gres.conf (Choose), and read by every stage: the step
// decision (which minors an index opens), attribution (which index a
// device is) and metrics.
package gputable

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gpufence/gpufence/agent/audit"
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

	// layout is the table in use: made at start, replaced once at most, by
	// slurmd's late answer while no job holds a GPU (Settle).
	layout atomic.Pointer[layout]
	// pending: slurmd -G was asked at start and failed; Settle ends it.
	pending atomic.Bool
	// sources is why Slurm's sources make the table unusable now ("" when
	// they agree): set from origin at start, again at each Recheck and
	// Settle.
	sources atomic.Pointer[string]
	nvml    atomic.Pointer[nvmlView]
	// mu orders the writers: Settle, Recheck, CheckNVML.
	mu sync.Mutex
	// use is read-held by a request between reading devices from the
	// table and recording its step (Hold), and write-held while Late
	// decides whether to replace the table: no step's entry is made from
	// a table that was replaced under it.
	use sync.RWMutex
}

// Hold keeps the table from being replaced until release is called: a
// request holds it from reading the table to recording its step.
func (t *Table) Hold() (release func()) {
	t.use.RLock()
	return t.use.RUnlock
}

// layout is one table's GPUs and where they came from; never changed once
// published.
type layout struct {
	gpus map[int]devices.GPU
	devs map[int]policy.Devices
	// byMinor and byCaps attribute a device back to the indices that hold
	// it: the MIG slices of one GPU share its minor, the compute instances
	// of one GPU instance its access caps.
	byMinor map[uint32][]int
	byCaps  map[uint32][]int
	// shares places shard and mps devices on GPUs (the chosen source's).
	shares slurm.Shares
	origin Origin
}

// Sources of the table.
const (
	SourceSlurmd   = "slurmd -G"
	SourceGresConf = "gres.conf"
)

// Origin says where the table came from and why.
type Origin struct {
	// Source is SourceSlurmd or SourceGresConf.
	Source string `json:"source"`
	// Detail says why that source, and what the other one said.
	Detail string `json:"detail"`
	// Severity is info (the sources agree, or only one was asked), warning
	// (they differ, or slurmd -G failed, in a way that gives no job another
	// GPU) or error (Untrusted is set).
	Severity audit.Severity `json:"severity"`
	// Kind names a disagreement for audit records: slurmd_failed,
	// slurmd_fewer, sources_differ; "" when there is none.
	Kind string `json:"kind,omitempty"`
	// Untrusted is why no step may get a GPU: the sources disagree on
	// which device an index is, or only slurmd knows and it failed.
	Untrusted string `json:"untrusted,omitempty"`
	// Slurmd is the slurmd -G command run ("" when not run).
	Slurmd string `json:"slurmd,omitempty"`
	// GresConf is the gres.conf read; AutoDetect its AutoDetect= value.
	GresConf   string `json:"gres_conf"`
	AutoDetect string `json:"autodetect,omitempty"`
}

// Severities of an Origin: the audit records' (one severity type in the
// agent).
const (
	SeverityInfo    = audit.SeverityInfo
	SeverityWarning = audit.SeverityWarning
	SeverityError   = audit.SeverityError
)

// Input is what the table is chosen from.
type Input struct {
	// GresConf is the path of gres.conf; Gres what it says for the node,
	// GresErr why it could not be read (slurm.ErrNoGPUs: no GPU record).
	GresConf string
	Gres     slurm.GresConf
	GresErr  error
	// SlurmdOff: slurmd_gpu_table is off, slurmd -G was not run.
	SlurmdOff bool
	// Slurmd is slurmd -G's table, SlurmdErr why it could not be read.
	Slurmd    slurm.SlurmdView
	SlurmdErr error
}

// Choose picks the node's GPU table from slurmd's view and gres.conf, and
// says why (pure; docs/configuration.md "Where the GPU table comes from"):
//   - slurmd's table when slurmd -G worked: it is what Slurm numbers
//     jobs' GPUs by. Without AutoDetect, gres.conf must say the same (or
//     name more GPUs, which slurmd drops when slurm.conf counts fewer);
//     when an index is another device in each, the table is untrusted:
//     gpufence cannot tell which device Slurm gives out.
//     When gres.conf cannot be read, nothing cross-checks slurmd's
//     table: untrusted too.
//   - gres.conf's when slurmd -G failed or is off, but not under
//     AutoDetect, where only slurmd knows the GPUs and their order: then
//     the table is untrusted (with slurmd_gpu_table off, gres.conf's
//     File= lines sorted by file, as before this check existed).
//
// An error is returned where no table at all can be made: gres.conf
// unreadable and slurmd -G off or failed.
func Choose(in Input) ([]slurm.GPU, Origin, error) {
	o := Origin{GresConf: in.GresConf, AutoDetect: in.Gres.AutoDetect, Slurmd: in.Slurmd.Command}
	gres, gresErr := in.Gres.GPUs, in.GresErr
	if errors.Is(gresErr, slurm.ErrNoGPUs) {
		gres, gresErr = nil, nil
	}
	auto := in.Gres.AutoDetect
	if in.SlurmdOff || in.SlurmdErr != nil {
		if gresErr != nil {
			if in.SlurmdErr != nil {
				return nil, o, fmt.Errorf("no GPU table: %w; and %w", in.SlurmdErr, gresErr)
			}
			return nil, o, gresErr
		}
		o.Source = SourceGresConf
		switch {
		case in.SlurmdOff && auto != "":
			o.Severity = SeverityWarning
			o.Detail = fmt.Sprintf("slurmd_gpu_table is off: gres.conf's %d GPU(s) with File=, sorted by file; gres.conf sets AutoDetect=%s, so slurmd may order them by the driver's links and add GPUs gres.conf does not name", len(gres), auto)
		case in.SlurmdOff:
			o.Severity = SeverityInfo
			o.Detail = fmt.Sprintf("slurmd_gpu_table is off: gres.conf's %d GPU(s)", len(gres))
		case auto != "":
			o.Severity, o.Kind = SeverityError, "slurmd_failed"
			o.Detail = fmt.Sprintf("slurmd -G failed: %v", in.SlurmdErr)
			o.Untrusted = fmt.Sprintf("gres.conf sets AutoDetect=%s, so only slurmd knows which device each GPU index is, and slurmd -G failed (%v); gpufence gives no GPU to any step until it works (fix it, then send the agent SIGHUP or restart it)", auto, in.SlurmdErr)
		default:
			o.Severity, o.Kind = SeverityWarning, "slurmd_failed"
			o.Detail = fmt.Sprintf("slurmd -G failed, so gres.conf's %d GPU(s) are used without slurmd's cross-check: %v", len(gres), in.SlurmdErr)
		}
		return gres, o, nil
	}
	sd := in.Slurmd.GPUs
	o.Source = SourceSlurmd
	switch {
	case gresErr != nil:
		// Nothing vouches for slurmd's GPUs but NVML, which may be absent:
		// fail closed rather than trust one source unchecked.
		o.Severity, o.Kind = SeverityError, "gres_unreadable"
		o.Detail = fmt.Sprintf("slurmd's %d GPU(s); gres.conf could not be read to cross-check them: %v", len(sd), gresErr)
		o.Untrusted = fmt.Sprintf("gpufence cannot read gres.conf to cross-check slurmd's GPU table (%v); gpufence gives no GPU to any step until it can (fix gres.conf, then restart the agent)", gresErr)
	case auto != "":
		o.Severity = SeverityInfo
		o.Detail = fmt.Sprintf("slurmd's %d GPU(s): gres.conf sets AutoDetect=%s, so slurmd's table (what it found, in its order) is the authority; gres.conf names %d", len(sd), auto, len(gres))
		if i, ok := firstDifference(sd, gres); ok {
			o.Detail += "; " + describeDifference(i, sd, gres)
		}
	default:
		i, differ := firstDifference(sd, gres)
		switch {
		case !differ:
			o.Severity = SeverityInfo
			o.Detail = fmt.Sprintf("slurmd's %d GPU(s), the same as gres.conf's", len(sd))
		case i == len(sd):
			// slurmd dropped the GPUs past slurm.conf's count: the indices
			// it keeps are gres.conf's.
			o.Severity, o.Kind = SeverityWarning, "slurmd_fewer"
			o.Detail = fmt.Sprintf("slurmd's %d GPU(s); gres.conf names %d: slurmd uses only the first %d (slurm.conf's Gres= counts fewer); no job gets the others", len(sd), len(gres), len(sd))
		default:
			o.Severity, o.Kind = SeverityError, "sources_differ"
			o.Detail = describeDifference(i, sd, gres)
			o.Untrusted = fmt.Sprintf("slurmd -G and gres.conf disagree on which device a GPU index is (%s); gpufence gives no GPU to any step until they agree (fix gres.conf, or look for a fake_gpus.conf beside it; then restart slurmd and the agent)", o.Detail)
		}
	}
	return sd, o, nil
}

// firstDifference is the first index whose device files differ between
// a and b (len(a) when a is a prefix of b, len(b) when b is one of a).
func firstDifference(a, b []slurm.GPU) (int, bool) {
	for i := 0; i < min(len(a), len(b)); i++ {
		if !slices.Equal(files(a[i]), files(b[i])) {
			return i, true
		}
	}
	return min(len(a), len(b)), len(a) != len(b)
}

func files(g slurm.GPU) []string {
	if len(g.Files) == 0 {
		return []string{g.Path}
	}
	return g.Files
}

func describeDifference(i int, sd, gres []slurm.GPU) string {
	side := func(t []slurm.GPU) string {
		if i >= len(t) {
			return "absent"
		}
		return strings.Join(files(t[i]), ",")
	}
	return fmt.Sprintf("GPU index %d is %s for slurmd -G, %s in gres.conf", i, side(sd), side(gres))
}

// Build chooses the table (Choose) and resolves its device files.
func Build(in Input, nvidiaMajor, capsMajor uint32) (*Table, error) {
	gpus, o, err := Choose(in)
	if err != nil {
		return nil, err
	}
	r, err := resolve(gpus, o, nvidiaMajor, capsMajor)
	if err != nil {
		return nil, err
	}
	r.shares = sharesOf(in, o)
	t := &Table{NvidiaMajor: nvidiaMajor, CapsMajor: capsMajor}
	t.layout.Store(r)
	t.sources.Store(&o.Untrusted)
	t.pending.Store(!in.SlurmdOff && in.SlurmdErr != nil)
	return t, nil
}

// sharesOf is where the chosen source places shard and mps devices.
func sharesOf(in Input, o Origin) slurm.Shares {
	if o.Source == SourceSlurmd {
		return in.Slurmd.Shares
	}
	return in.Gres.Shares
}

func resolve(gpus []slurm.GPU, o Origin, nvidiaMajor, capsMajor uint32) (*layout, error) {
	r := &layout{gpus: map[int]devices.GPU{}, devs: map[int]policy.Devices{}, byMinor: map[uint32][]int{},
		byCaps: map[uint32][]int{}, origin: o}
	if len(gpus) == 0 {
		return r, nil
	}
	resolved, err := devices.Resolve(gpus, nvidiaMajor, capsMajor)
	if err != nil {
		return nil, fmt.Errorf("GPU table from %s: %w", o.Source, err)
	}
	for _, g := range resolved {
		r.gpus[g.Index] = g
		r.devs[g.Index] = policy.Devices{GPUMinor: g.Minor, CapsMinors: g.CapsMinors()}
		r.byMinor[g.Minor] = append(r.byMinor[g.Minor], g.Index)
		for _, c := range g.Caps {
			r.byCaps[c.Minor] = append(r.byCaps[c.Minor], g.Index)
		}
	}
	return r, nil
}

// Origin says where the table in use came from: as chosen at start, or
// slurmd's when its late answer confirmed or replaced it (Settle).
func (t *Table) Origin() Origin { return t.layout.Load().origin }

// Pending reports whether the table was made without slurmd's answer
// (slurmd -G was asked at start and failed) and no later answer settled
// it yet.
func (t *Table) Pending() bool { return t.pending.Load() }

// Recheck compares what the sources say now (a reload) with the table in
// use, which stays: the kernel entries of running jobs were made from
// it. When they no longer match, or now disagree with each other, no step
// gets a GPU until the agent restarts with the new table; when they match
// again, GPUs are given out again. It returns what was found, one
// sentence, and whether the table is usable.
func (t *Table) Recheck(in Input) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	gpus, o, err := Choose(in)
	var why string
	switch {
	case err != nil:
		why = fmt.Sprintf("the GPU table could not be read again (%v); the agent keeps the one it started with", err)
		return why, t.Untrusted() == ""
	case o.Untrusted != "":
		why = o.Untrusted
	default:
		cur := t.GPUs()
		inUse := make([]slurm.GPU, len(cur))
		for i, g := range cur {
			inUse[i] = g.GPU
		}
		if i, differ := firstDifference(gpus, inUse); differ {
			why = changed(o.Source, "changed since the agent started", i, gpus, inUse)
		}
	}
	t.sources.Store(&why)
	if why == "" {
		return fmt.Sprintf("Slurm's GPU table is unchanged (%s: %s)", o.Source, o.Detail), true
	}
	return why, false
}

// changed is the reason no GPU is given when Slurm's table (from source)
// says another device for index i than the table in use.
func changed(source, how string, i int, now, inUse []slurm.GPU) string {
	side := func(t []slurm.GPU) string {
		if i >= len(t) {
			return "absent"
		}
		return strings.Join(files(t[i]), ",")
	}
	return fmt.Sprintf("Slurm's GPU table (%s) %s: GPU index %d is %s now, %s in the table in use; gpufence gives no GPU to any step until the agent restarts with the new table (systemctl restart gpufence)", source, how, i, side(now), side(inUse))
}

// GPUs returns the table's GPUs by index.
func (t *Table) GPUs() []devices.GPU { return t.layout.Load().sorted() }

func (r *layout) sorted() []devices.GPU {
	out := make([]devices.GPU, 0, len(r.gpus))
	for _, g := range r.gpus {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b devices.GPU) int { return cmp.Compare(a.Index, b.Index) })
	return out
}

// HasShares reports whether the node has gres/shard or gres/mps.
func (t *Table) HasShares() bool { return len(t.layout.Load().shares) > 0 }

// ShareGPU returns the GPU index that device dev of shared GRES kind
// ("shard", "mps"), as slurmctld numbers it, is on; false when the table
// places no such device on a GPU of its own.
func (t *Table) ShareGPU(kind string, dev int) (int, bool) {
	l := t.layout.Load()
	g, ok := l.shares.GPU(kind, dev)
	if !ok {
		return 0, false
	}
	if _, known := l.gpus[g]; !known {
		return 0, false
	}
	return g, true
}

// GPU returns index's GPU.
func (t *Table) GPU(index int) (devices.GPU, bool) {
	g, ok := t.layout.Load().gpus[index]
	return g, ok
}

// Devices returns what holding gpus opens; an index the table lacks is an
// error (the agent never guesses which device a GPU is).
func (t *Table) Devices(gpus []int) (policy.DeviceSet, error) {
	return policy.DevicesFor(t.layout.Load().devs, gpus)
}

// Unknown returns the first of gpus the table lacks, if any.
func (t *Table) Unknown(gpus []int) (int, bool) {
	r := t.layout.Load()
	for _, g := range gpus {
		if _, ok := r.gpus[g]; !ok {
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
	r := t.layout.Load()
	var held []int
	switch {
	case major == t.NvidiaMajor:
		held = r.byMinor[minor]
	case t.CapsMajor != 0 && major == t.CapsMajor:
		held = r.byCaps[minor]
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
	g := r.gpus[idx]
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
	// driver is what the driver reported, for the check of a table that
	// replaced the one at start (Settle).
	driver []inventory.GPU
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
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.checkNVMLLocked(gpus)
}

func (t *Table) checkNVMLLocked(gpus []inventory.GPU) ([]Identified, []inventory.Mismatch) {
	byMinor := map[uint32]inventory.GPU{}
	for _, g := range gpus {
		byMinor[g.Minor] = g
	}
	v := &nvmlView{bySlurm: map[int]inventory.GPU{}, uuid: map[int]string{}, driver: gpus}
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
		v.untrusted = fmt.Sprintf("this node's GPU table (%s) does not match the NVIDIA driver: %s%s; gpufence gives no GPU to any step until they agree (see the agent's log or gpufence doctor)",
			t.Origin().Source, errs[0].Message, more)
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

// Untrusted is why no GPU may be given now; "" when the table is trusted:
// Slurm's sources agree (Choose, Recheck) and NVML, where there is one,
// agrees with them.
func (t *Table) Untrusted() string {
	if why := t.sources.Load(); why != nil && *why != "" {
		return *why
	}
	if v := t.nvml.Load(); v != nil {
		return v.untrusted
	}
	return ""
}
