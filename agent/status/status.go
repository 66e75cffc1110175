// SPDX-License-Identifier: Apache-2.0

// Package status is what `gpufence status` reports and `gpufence doctor`
// shares: the agent's socket and who listens on it, the pinned device
// filter, the agent's state file, read directly (the agent is not asked,
// so it works while the agent is down) and cross-checked: each step's
// kernel entry against the devices its GPUs open, as sets. Gather reads
// the node, Build is a pure function of what it read, Write prints it.
package status

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Input is everything status reads from the system; Build is a
// pure function of it.
type Input struct {
	Version string
	Agent   AgentReport
	// PinDir is the configured pin_dir; "" means nothing is pinned and the
	// kernel view cannot be read from outside the agent.
	PinDir    string
	Kernel    *devfilter.PinnedView
	KernelErr error
	// CgroupAlive says, for kernel entries, whether their cgroup exists
	// (missing: unknown).
	CgroupAlive map[uint64]bool
	// Scope is the slurmstepd scope directory found, "" if none.
	Scope string
	// SlurmScope is Slurm's scope as the agent finds it (jobcgroup.Find)
	// and SlurmScopeID its cgroup id; ScopeErr why it cannot be told;
	// IgnoredScopes the cgroups named like a scope that are not Slurm's.
	SlurmScope    string
	SlurmScopeID  uint64
	ScopeErr      string
	IgnoredScopes []jobcgroup.Candidate
	// Slurmd is slurmd's cgroup outside the scope (Found.Slurmd), "" when
	// slurmd runs inside it or not at all; SlurmdID its id; SlurmdErr why
	// it cannot be told.
	Slurmd    string
	SlurmdID  uint64
	SlurmdErr string
	// Exempt names the exempt cgroups of the scope by their current id.
	Exempt      map[uint64]string
	StateFile   string
	State       *statefile.File // nil when missing or unreadable
	StateExists bool
	StateErr    error
	// CgroupIDs are the current ids of the step cgroup paths; 0 when the
	// directory is gone.
	CgroupIDs map[string]uint64
	UserName  func(uid uint32) string
	// Devices are the device numbers of the state's GPU table by GPU
	// index (what the agent grants for each); nil when the state has no
	// table, DevicesErr why its files could not be resolved.
	Devices    map[int]policy.Devices
	DevicesErr string
}

// Report is what `gpufence status --json` prints.
type Report struct {
	// Version is the version of this gpufence binary.
	Version string `json:"version"`
	// OK is false when Problems is not empty (exit status 1).
	OK bool `json:"ok"`
	// Problems are the findings, one sentence each.
	Problems []string     `json:"problems"`
	Agent    AgentReport  `json:"agent"`
	Filter   FilterReport `json:"filter"`
	State    StateReport  `json:"state"`
	// Jobs are the jobs of the state file, by id.
	Jobs []JobReport `json:"jobs"`
	// OtherEntries are the kernel entries no step of the state owns, by
	// cgroup id: exempt cgroups (fine) and mismatches (Problem set).
	OtherEntries []EntryReport `json:"other_entries"`
	// GPUTable is the agent's GPU table and where it came from (slurmd -G
	// or gres.conf), as of the agent's last state write; null when the
	// state file does not say.
	GPUTable *statefile.GPUTable `json:"gpu_table"`
}

// AgentReport is the agent socket.
type AgentReport struct {
	// Socket is the configured socket path.
	Socket string `json:"socket"`
	// SocketExists: a unix socket is at that path.
	SocketExists bool `json:"socket_exists"`
	// Listening: a connect succeeded (and was closed unused); see
	// Socket.Listening.
	Listening bool `json:"listening"`
	// PID is the process holding the socket (SO_PEERCRED), 0 if unknown.
	PID int `json:"pid,omitempty"`
	// OwnerUID owns the socket file, ListenerUID is the listener's uid
	// (SO_PEERCRED); null when unknown. WantUID is the agent's.
	OwnerUID    *uint32 `json:"owner_uid,omitempty"`
	ListenerUID *uint32 `json:"listener_uid,omitempty"`
	WantUID     uint32  `json:"want_uid"`
	// Untrusted says why what holds the socket is not the agent (another
	// uid owns the file or listens); "" when it is, or nothing listens.
	Untrusted string `json:"untrusted,omitempty"`
	// Error is why the socket is unusable, if it is.
	Error string `json:"error,omitempty"`
}

// FilterReport is the pinned device filter.
type FilterReport struct {
	// PinDir is the configured pin_dir ("" means not pinned: not readable
	// without the agent).
	PinDir string `json:"pin_dir"`
	// Pinned: a filter's pins are in PinDir; Pins are their names.
	Pinned bool     `json:"pinned"`
	Pins   []string `json:"pins,omitempty"`
	// Mode is scope or per-cgroup, from the pinned state map; ScopeCgroupID
	// the scope's cgroup id (scope mode); LayoutVersion the pin layout.
	Mode          string `json:"mode,omitempty"`
	ScopeCgroupID uint64 `json:"scope_cgroup_id,omitempty"`
	LayoutVersion uint32 `json:"layout_version,omitempty"`
	// Scope is the slurmstepd scope directory found on this node.
	Scope string `json:"scope,omitempty"`
	// SlurmScope is Slurm's scope as the agent finds it: where slurmd
	// makes it, root's, holding Slurm's processes. IgnoredScopes are the
	// cgroups named like a scope that are not (a user can make one in
	// their own delegated subtree), each with why.
	SlurmScope    string                `json:"slurm_scope,omitempty"`
	IgnoredScopes []jobcgroup.Candidate `json:"ignored_scopes,omitempty"`
	// Enforcement is enforce or audit-only, from the pinned config map;
	// NvidiaMajor the major it narrows.
	Enforcement string `json:"enforcement,omitempty"`
	NvidiaMajor uint32 `json:"nvidia_major,omitempty"`
	// Link is the scope link (scope mode).
	Link *LinkReport `json:"link,omitempty"`
	// SlurmdCgroup is slurmd's cgroup outside the scope (systemd's
	// slurmd.service), where the agent puts the program too; SlurmdLink
	// the link pinned there.
	SlurmdCgroup string      `json:"slurmd_cgroup,omitempty"`
	SlurmdLink   *LinkReport `json:"slurmd_link,omitempty"`
	// PolicyEntries is the number of kernel policy entries: the policies
	// map (scope mode) or the cgroup_<id> link pins (per-cgroup mode).
	PolicyEntries int `json:"policy_entries"`
	// Lost is the sum of the per-CPU lost counter (events dropped, ring
	// buffer full); RateFull the sum of rate_full (accesses counted without
	// a rate key, rate map full); RateEntries the rate map's entry count.
	Lost        uint64 `json:"lost"`
	RateFull    uint64 `json:"rate_full"`
	RateEntries int    `json:"rate_entries"`
	// Errors are what could not be read.
	Errors []string `json:"errors,omitempty"`
}

// LinkReport is a pinned bpf_link.
type LinkReport struct {
	ID          uint32 `json:"id"`
	ProgramID   uint32 `json:"program_id"`
	ProgramName string `json:"program_name,omitempty"`
	// CgroupID is the cgroup it is attached to; 0 when that cgroup is gone.
	CgroupID uint64 `json:"cgroup_id"`
}

// StateReport is the state file.
type StateReport struct {
	File   string `json:"file"`
	Exists bool   `json:"exists"`
	Scope  string `json:"scope,omitempty"`
	Error  string `json:"error,omitempty"`
}

// JobReport is one job of the state file.
type JobReport struct {
	ID  uint32 `json:"id"`
	UID uint32 `json:"uid"`
	// User is the uid's name, "" if unknown.
	User string `json:"user,omitempty"`
	// GPUs are the job's trusted GPUs (indexes of gres.conf).
	GPUs     []int  `json:"gpus"`
	NoProlog bool   `json:"no_prolog,omitempty"`
	Broken   string `json:"broken,omitempty"`
	// Recovered, Adopted and Unconfirmed: where the list came from when
	// not the prolog (statefile.Job).
	Recovered   string `json:"recovered,omitempty"`
	Adopted     string `json:"adopted,omitempty"`
	Unconfirmed string `json:"unconfirmed,omitempty"`
	// Shares are the job's shard and mps shares per slurmctld.
	Shares []audit.Share `json:"shares,omitempty"`
	Steps  []StepReport  `json:"steps"`
}

// StepReport is one step of a job.
type StepReport struct {
	ID uint32 `json:"id"`
	// Name is the step id as Slurm writes it: 0, 1, batch, extern, ...
	Name     string `json:"name"`
	UID      uint32 `json:"uid"`
	GPUs     []int  `json:"gpus"`
	CgroupID uint64 `json:"cgroup_id"`
	Cgroup   string `json:"cgroup"`
	// CgroupExists: the directory exists with the id of the state.
	CgroupExists bool `json:"cgroup_exists"`
	// CgroupRecreated: the directory exists with another id.
	CgroupRecreated bool `json:"cgroup_recreated,omitempty"`
	// Kernel is the kernel's entry for the step's cgroup id: null when the
	// kernel view is unavailable, present=false when there is none.
	Kernel *KernelEntry `json:"kernel"`
	// Problems are this step's mismatches (also in the top-level list).
	Problems []string `json:"problems,omitempty"`
}

// KernelEntry is what the kernel holds for one cgroup.
type KernelEntry struct {
	Present   bool     `json:"present"`
	AllowAll  bool     `json:"allow_all,omitempty"`
	AuditOnly bool     `json:"audit_only,omitempty"`
	GPUMinors []uint32 `json:"gpu_minors,omitempty"`
	// CapsMinors are the MIG capability minors (nvidia-caps major).
	CapsMinors []uint32 `json:"caps_minors,omitempty"`
	// LinkID is the per-cgroup link (per-cgroup mode).
	LinkID uint32 `json:"link_id,omitempty"`
	Error  string `json:"error,omitempty"`
}

// EntryReport is a kernel entry that no step of the state owns.
type EntryReport struct {
	CgroupID uint64 `json:"cgroup_id"`
	KernelEntry
	// CgroupExists: whether a cgroup with that id exists (null: unknown).
	CgroupExists *bool `json:"cgroup_exists"`
	// Exempt names the exempt scope child (system, slurmd) it belongs to.
	Exempt string `json:"exempt,omitempty"`
	// Problem is set when the entry is a mismatch.
	Problem string `json:"problem,omitempty"`
}

func Build(in Input) Report {
	r := Report{Version: in.Version, Agent: in.Agent, Problems: []string{}, Jobs: []JobReport{}, OtherEntries: []EntryReport{}}
	problem := func(format string, args ...any) string {
		s := fmt.Sprintf(format, args...)
		r.Problems = append(r.Problems, s)
		return s
	}

	switch a := in.Agent; {
	case !a.SocketExists:
		problem("agent: no socket at %s: the agent is not running", a.Socket)
	case !a.Listening:
		problem("agent: socket %s does not accept connections: %s", a.Socket, a.Error)
	case a.Untrusted != "":
		problem("agent: %s; a process that impersonates the agent would get every step's GPU list", a.Untrusted)
	}

	// The kernel view.
	f := FilterReport{PinDir: in.PinDir, Scope: in.Scope, SlurmScope: in.SlurmScope, IgnoredScopes: in.IgnoredScopes, SlurmdCgroup: in.Slurmd}
	if in.ScopeErr != "" {
		problem("scope: %s: the agent attaches the filter to no new scope and moves it nowhere", in.ScopeErr)
	}
	kv := in.Kernel
	kernelKnown := false
	switch {
	case in.PinDir == "":
		// Nothing pinned by design; the entries live in the agent only.
	case in.KernelErr != nil:
		problem("filter: %v", in.KernelErr)
	case kv != nil:
		kernelKnown = true
		f.Pinned = len(kv.Pins) > 0
		f.Pins = kv.Pins
		f.Mode, f.ScopeCgroupID, f.LayoutVersion = string(kv.Mode), kv.ScopeID, kv.Version
		if c := kv.Config; c != nil {
			f.Enforcement, f.NvidiaMajor = config.EnforcementEnforce, c.NvidiaMajor
			if c.AuditOnly {
				f.Enforcement = config.EnforcementAuditOnly
			}
		}
		if l := kv.Link; l != nil {
			f.Link = &LinkReport{ID: l.ID, ProgramID: l.ProgramID, ProgramName: l.ProgramName, CgroupID: l.CgroupID}
		}
		if l := kv.SlurmdLink; l != nil {
			f.SlurmdLink = &LinkReport{ID: l.ID, ProgramID: l.ProgramID, ProgramName: l.ProgramName, CgroupID: l.CgroupID}
		}
		f.PolicyEntries = len(kv.Entries)
		f.Lost, f.RateFull, f.RateEntries = kv.Lost, kv.RateFull, kv.RateEntries
		f.Errors = kv.Errors
		for _, e := range kv.Errors {
			problem("filter: cannot read %s", e)
		}
		if kv.Mode == devfilter.ModeScope {
			switch {
			case kv.Link == nil:
				problem("filter: no scope link pinned in %s: the filter is not attached to Slurm's scope", in.PinDir)
			case kv.Link.CgroupID == 0:
				problem("filter: the scope link %d is defunct: its cgroup (%d) is gone", kv.Link.ID, kv.ScopeID)
			case kv.Link.CgroupID != kv.ScopeID:
				problem("filter: the scope link %d is on cgroup %d, the pinned state says the scope is %d", kv.Link.ID, kv.Link.CgroupID, kv.ScopeID)
			case in.SlurmScopeID != 0 && kv.ScopeID != in.SlurmScopeID:
				problem("filter: the filter is on cgroup %d, but Slurm's scope %s is cgroup %d", kv.ScopeID, in.SlurmScope, in.SlurmScopeID)
			}
			switch {
			case in.SlurmdErr != "":
				problem("filter: %s", in.SlurmdErr)
			case in.Slurmd == "":
			case kv.SlurmdLink == nil:
				problem("filter: slurmd runs in %s, outside the scope, and no link is pinned there: a process there that runs as a user (sbcast's child) opens any GPU", in.Slurmd)
			case kv.SlurmdLink.CgroupID != in.SlurmdID:
				problem("filter: the link on slurmd's cgroup is on cgroup %d, but %s is cgroup %d (made again: the agent re-attaches when it sees it)", kv.SlurmdLink.CgroupID, in.Slurmd, in.SlurmdID)
			}
		}
	}
	r.Filter = f

	// The state file.
	r.State = StateReport{File: in.StateFile, Exists: in.StateExists}
	if in.StateErr != nil {
		r.State.Error = in.StateErr.Error()
		problem("state: %v", in.StateErr)
	}
	owned := map[uint64]bool{}
	if st := in.State; st != nil {
		r.State.Scope = st.Scope
		if r.GPUTable = st.GPUTable; r.GPUTable != nil && r.GPUTable.Untrusted != "" {
			problem("gpu table: the agent gives no GPU to any step: %s", r.GPUTable.Untrusted)
		}
		for _, sj := range st.Jobs {
			j := JobReport{ID: sj.ID, UID: sj.UID, GPUs: sj.GPUs, NoProlog: sj.NoProlog, Broken: sj.Broken,
				Recovered: sj.Recovered, Adopted: sj.Adopted, Unconfirmed: sj.Unconfirmed, Shares: sj.Shares, Steps: []StepReport{}}
			if j.GPUs == nil {
				j.GPUs = []int{}
			}
			if in.UserName != nil {
				j.User = in.UserName(sj.UID)
			}
			for _, ss := range sj.Steps {
				s := StepReport{ID: ss.ID, Name: policy.StepName(ss.ID), UID: ss.UID, GPUs: ss.GPUs, CgroupID: ss.CgroupID, Cgroup: ss.Cgroup}
				if s.GPUs == nil {
					s.GPUs = []int{}
				}
				owned[ss.CgroupID] = true
				where := fmt.Sprintf("job %d step %s", sj.ID, s.Name)
				switch id := in.CgroupIDs[ss.Cgroup]; {
				case id == ss.CgroupID:
					s.CgroupExists = true
				case id == 0:
					s.Problems = append(s.Problems, problem("%s: its cgroup %s is gone but the state still has the step (the agent releases it at its next reconcile)", where, ss.Cgroup))
				default:
					s.CgroupRecreated = true
					s.Problems = append(s.Problems, problem("%s: its cgroup %s was recreated (id %d, the state has %d)", where, ss.Cgroup, id, ss.CgroupID))
				}
				if kernelKnown {
					e, ok := kv.Entries[ss.CgroupID]
					k := toKernelEntry(e, ok)
					s.Kernel = &k
					switch {
					case !ok:
						s.Problems = append(s.Problems, problem("%s: the state has the step but the kernel has no entry for its cgroup %d", where, ss.CgroupID))
					case e.PolicyErr != "":
						s.Problems = append(s.Problems, problem("%s: the kernel entry of cgroup %d is unreadable: %s", where, ss.CgroupID, e.PolicyErr))
					case e.Policy.AllowAll:
						s.Problems = append(s.Problems, problem("%s: the kernel allows every GPU to cgroup %d", where, ss.CgroupID))
					case e.Policy.AuditOnly != ss.AuditOnly:
						s.Problems = append(s.Problems, problem("%s: the kernel entry of cgroup %d is audit-only=%v, the state says %v", where, ss.CgroupID, e.Policy.AuditOnly, ss.AuditOnly))
					default:
						if msg := deviceMismatch(in, e.Policy, ss.GPUs); msg != "" {
							s.Problems = append(s.Problems, problem("%s: cgroup %d: %s", where, ss.CgroupID, msg))
						}
					}
				}
				j.Steps = append(j.Steps, s)
			}
			slices.SortFunc(j.Steps, func(a, b StepReport) int { return cmpU32(a.ID, b.ID) })
			r.Jobs = append(r.Jobs, j)
		}
		slices.SortFunc(r.Jobs, func(a, b JobReport) int { return cmpU32(a.ID, b.ID) })
	}

	// Kernel entries no step owns.
	if kernelKnown {
		ids := make([]uint64, 0, len(kv.Entries))
		for id := range kv.Entries {
			if !owned[id] {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, id := range ids {
			e := EntryReport{CgroupID: id, KernelEntry: toKernelEntry(kv.Entries[id], true), Exempt: in.Exempt[id]}
			if alive, ok := in.CgroupAlive[id]; ok {
				e.CgroupExists = &alive
			}
			switch {
			case e.CgroupExists != nil && !*e.CgroupExists:
				e.Problem = problem("kernel entry for cgroup %d, which no longer exists (stale; the agent removes it when it starts)", id)
			case e.Exempt != "" && e.AllowAll:
				// Slurm's own cgroup, kept open by design.
			case e.Exempt != "":
				e.Problem = problem("kernel entry for the exempt cgroup %s (%d) does not allow every GPU", e.Exempt, id)
			default:
				e.Problem = problem("kernel entry for cgroup %d with no step in the state", id)
			}
			r.OtherEntries = append(r.OtherEntries, e)
		}
		if kv.Mode == devfilter.ModeScope {
			var missing []string
			for id, name := range in.Exempt {
				if _, ok := kv.Entries[id]; !ok {
					missing = append(missing, name)
				}
			}
			slices.Sort(missing)
			for _, name := range missing {
				problem("the exempt cgroup %s has no kernel entry: Slurm's processes in it are denied every GPU", filepath.Join(in.Scope, name))
			}
		}
	}
	r.OK = len(r.Problems) == 0
	return r
}

// deviceMismatch compares what the kernel grants a step's cgroup with
// what its GPUs open by the agent's GPU table: the same minors, as sets
// (two GPUs swapped for two others is a mismatch, however many there
// are). "" when they agree.
func deviceMismatch(in Input, p devfilter.Policy, gpus []int) string {
	if in.Devices == nil && len(gpus) > 0 {
		why := "the state file has no GPU table"
		if in.DevicesErr != "" {
			why = "the GPU table's devices cannot be resolved: " + in.DevicesErr
		}
		return fmt.Sprintf("cannot tell which devices GPU(s) %s are (%s), so the kernel's %s cannot be checked", gpuList(gpus), why, minorsLabel(p.GPUMinors, p.CapsMinors))
	}
	want, err := policy.DevicesFor(in.Devices, gpus)
	if err != nil {
		return fmt.Sprintf("the state's %v; the kernel grants %s", err, minorsLabel(p.GPUMinors, p.CapsMinors))
	}
	if sameSet(p.GPUMinors, want.GPUMinors) && sameSet(p.CapsMinors, want.CapsMinors) {
		return ""
	}
	return fmt.Sprintf("the kernel grants %s, the state's GPU(s) %s are %s", minorsLabel(p.GPUMinors, p.CapsMinors), gpuList(gpus), minorsLabel(want.GPUMinors, want.CapsMinors))
}

// sameSet says whether a and b hold the same values, in any order.
func sameSet(a, b []uint32) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

func toKernelEntry(e devfilter.PinnedEntry, ok bool) KernelEntry {
	k := KernelEntry{Present: ok}
	if !ok {
		return k
	}
	k.AllowAll, k.AuditOnly, k.GPUMinors, k.CapsMinors, k.Error = e.Policy.AllowAll, e.Policy.AuditOnly, e.Policy.GPUMinors, e.Policy.CapsMinors, e.PolicyErr
	if e.Link != nil {
		k.LinkID = e.Link.ID
	}
	return k
}

func cmpU32(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
