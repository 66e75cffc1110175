// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/gpufence/gpufence/agent/gpulist"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/agent/version"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// runStatus is `gpufence status`: what the agent's socket, the pinned
// device filter and the saved state say, read directly (the agent is not
// asked, so it works while the agent is down), cross-checked. Exit status:
// 0 consistent, 1 something is off (see the problems), 2 usage error.
func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpufence status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", config.DefaultPath, "configuration file (YAML); missing is fine at the default path")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the sections")
	socket := fs.String("socket", "", "agent socket (default: the configuration's)")
	pinDir := fs.String("pin-dir", "", "bpffs folder of the pinned filter (default: the configuration's)")
	stateFile := fs.String("state-file", "", "agent state file (default: the configuration's)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: gpufence status [--config FILE] [--json]\n\n"+
			"Shows the agent socket, the pinned device filter (mode, link, policy entries, counters) and the\n"+
			"jobs and steps of the agent's state file, and cross-checks them. It reads the pins and files\n"+
			"directly (run it as root) and works while the agent is down.\n"+
			"Exit status: 0 consistent, 1 something is off (listed under Problems), 2 usage error.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	cfg, err := loadConfig(fs, *cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "gpufence status: %v\n", err)
		return 2
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "socket":
			cfg.Socket = *socket
		case "pin-dir":
			cfg.PinDir = *pinDir
		case "state-file":
			cfg.StateFile = *stateFile
		}
	})
	r := buildStatus(gatherStatus(cfg))
	if *asJSON {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(stderr, "gpufence status: %v\n", err)
			return 1
		}
		// Same JSON; no character in it can drive the terminal.
		stdout.Write(audit.TerminalSafeJSON(buf.Bytes()))
	} else {
		writeStatus(stdout, r)
	}
	if !r.OK {
		return 1
	}
	return 0
}

// statusInput is everything status reads from the system; buildStatus is a
// pure function of it.
type statusInput struct {
	Version string
	Agent   agentReport
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
}

// statusReport is what `gpufence status --json` prints.
type statusReport struct {
	// Version is the version of this gpufence binary.
	Version string `json:"version"`
	// OK is false when Problems is not empty (exit status 1).
	OK bool `json:"ok"`
	// Problems are the findings, one sentence each.
	Problems []string     `json:"problems"`
	Agent    agentReport  `json:"agent"`
	Filter   filterReport `json:"filter"`
	State    stateReport  `json:"state"`
	// Jobs are the jobs of the state file, by id.
	Jobs []jobReport `json:"jobs"`
	// OtherEntries are the kernel entries no step of the state owns, by
	// cgroup id: exempt cgroups (fine) and mismatches (Problem set).
	OtherEntries []entryReport `json:"other_entries"`
	// GPUTable is the agent's GPU table and where it came from (slurmd -G
	// or gres.conf), as of the agent's last state write; null when the
	// state file does not say.
	GPUTable *statefile.GPUTable `json:"gpu_table"`
}

// agentReport is the agent socket.
type agentReport struct {
	// Socket is the configured socket path.
	Socket string `json:"socket"`
	// SocketExists: a unix socket is at that path.
	SocketExists bool `json:"socket_exists"`
	// Listening: a connection was accepted (and closed unused).
	Listening bool `json:"listening"`
	// PID is the process holding the socket (SO_PEERCRED), 0 if unknown.
	PID int `json:"pid,omitempty"`
	// Error is why the socket is unusable, if it is.
	Error string `json:"error,omitempty"`
}

// filterReport is the pinned device filter.
type filterReport struct {
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
	Link *linkReport `json:"link,omitempty"`
	// SlurmdCgroup is slurmd's cgroup outside the scope (systemd's
	// slurmd.service), where the agent puts the program too; SlurmdLink
	// the link pinned there.
	SlurmdCgroup string      `json:"slurmd_cgroup,omitempty"`
	SlurmdLink   *linkReport `json:"slurmd_link,omitempty"`
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

// linkReport is a pinned bpf_link.
type linkReport struct {
	ID          uint32 `json:"id"`
	ProgramID   uint32 `json:"program_id"`
	ProgramName string `json:"program_name,omitempty"`
	// CgroupID is the cgroup it is attached to; 0 when that cgroup is gone.
	CgroupID uint64 `json:"cgroup_id"`
}

// stateReport is the state file.
type stateReport struct {
	File   string `json:"file"`
	Exists bool   `json:"exists"`
	Scope  string `json:"scope,omitempty"`
	Error  string `json:"error,omitempty"`
}

// jobReport is one job of the state file.
type jobReport struct {
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
	Steps  []stepReport  `json:"steps"`
}

// stepReport is one step of a job.
type stepReport struct {
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
	Kernel *kernelEntry `json:"kernel"`
	// Problems are this step's mismatches (also in the top-level list).
	Problems []string `json:"problems,omitempty"`
}

// kernelEntry is what the kernel holds for one cgroup.
type kernelEntry struct {
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

// entryReport is a kernel entry that no step of the state owns.
type entryReport struct {
	CgroupID uint64 `json:"cgroup_id"`
	kernelEntry
	// CgroupExists: whether a cgroup with that id exists (null: unknown).
	CgroupExists *bool `json:"cgroup_exists"`
	// Exempt names the exempt scope child (system, slurmd) it belongs to.
	Exempt string `json:"exempt,omitempty"`
	// Problem is set when the entry is a mismatch.
	Problem string `json:"problem,omitempty"`
}

func buildStatus(in statusInput) statusReport {
	r := statusReport{Version: in.Version, Agent: in.Agent, Problems: []string{}, Jobs: []jobReport{}, OtherEntries: []entryReport{}}
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
	}

	// The kernel view.
	f := filterReport{PinDir: in.PinDir, Scope: in.Scope, SlurmScope: in.SlurmScope, IgnoredScopes: in.IgnoredScopes, SlurmdCgroup: in.Slurmd}
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
			f.Link = &linkReport{ID: l.ID, ProgramID: l.ProgramID, ProgramName: l.ProgramName, CgroupID: l.CgroupID}
		}
		if l := kv.SlurmdLink; l != nil {
			f.SlurmdLink = &linkReport{ID: l.ID, ProgramID: l.ProgramID, ProgramName: l.ProgramName, CgroupID: l.CgroupID}
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
	r.State = stateReport{File: in.StateFile, Exists: in.StateExists}
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
			j := jobReport{ID: sj.ID, UID: sj.UID, GPUs: sj.GPUs, NoProlog: sj.NoProlog, Broken: sj.Broken,
				Recovered: sj.Recovered, Adopted: sj.Adopted, Unconfirmed: sj.Unconfirmed, Shares: sj.Shares, Steps: []stepReport{}}
			if j.GPUs == nil {
				j.GPUs = []int{}
			}
			if in.UserName != nil {
				j.User = in.UserName(sj.UID)
			}
			for _, ss := range sj.Steps {
				s := stepReport{ID: ss.ID, Name: policy.StepName(ss.ID), UID: ss.UID, GPUs: ss.GPUs, CgroupID: ss.CgroupID, Cgroup: ss.Cgroup}
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
					case gpuCountMismatch(e.Policy, len(ss.GPUs)):
						s.Problems = append(s.Problems, problem("%s: the kernel allows %d GPU(s) to cgroup %d, the state %d", where, len(e.Policy.GPUMinors), ss.CgroupID, len(ss.GPUs)))
					}
				}
				j.Steps = append(j.Steps, s)
			}
			slices.SortFunc(j.Steps, func(a, b stepReport) int { return cmpU32(a.ID, b.ID) })
			r.Jobs = append(r.Jobs, j)
		}
		slices.SortFunc(r.Jobs, func(a, b jobReport) int { return cmpU32(a.ID, b.ID) })
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
			e := entryReport{CgroupID: id, kernelEntry: toKernelEntry(kv.Entries[id], true), Exempt: in.Exempt[id]}
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

// gpuCountMismatch says whether a kernel policy cannot be the one of a
// step holding n GPU indices: one minor per whole GPU, but the MIG slices of
// one GPU (a policy with capability minors) share its minor.
func gpuCountMismatch(p devfilter.Policy, n int) bool {
	if len(p.CapsMinors) == 0 {
		return len(p.GPUMinors) != n
	}
	return len(p.GPUMinors) == 0 || len(p.GPUMinors) > n
}

func toKernelEntry(e devfilter.PinnedEntry, ok bool) kernelEntry {
	k := kernelEntry{Present: ok}
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

// writeStatus prints the report as short aligned sections.
func writeStatus(w io.Writer, r statusReport) {
	var buf bytes.Buffer
	defer func() {
		for _, line := range strings.SplitAfter(buf.String(), "\n") {
			if t := strings.TrimRight(line, " \n"); line != "" {
				fmt.Fprintln(w, t)
			}
		}
	}()
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	flush := func() { tw.Flush() }
	// Every string shown goes through audit.Printable: paths, names, errors
	// and reasons may carry what a job chose (control characters, tabs and
	// newlines that would break the layout or fake a line).
	pf := func(format string, args ...any) {
		for i, a := range args {
			if s, ok := a.(string); ok {
				args[i] = audit.Printable(s)
			}
		}
		fmt.Fprintf(tw, format, args...)
	}
	pf("gpufence %s status\n\n", r.Version)

	pf("Agent\n")
	a := r.Agent
	state := "down: no socket"
	switch {
	case a.Listening && a.PID != 0:
		state = fmt.Sprintf("up (pid %d)", a.PID)
	case a.Listening:
		state = "up"
	case a.SocketExists:
		state = "down: socket refuses connections"
	}
	pf("  socket\t%s\t%s\n", a.Socket, state)
	flush()

	pf("\nFilter\n")
	f := r.Filter
	switch {
	case f.PinDir == "":
		pf("  pin dir\t(none: pin_dir is empty, the kernel view is only in the agent)\n")
	case !f.Pinned:
		pf("  pin dir\t%s\tnothing pinned\n", f.PinDir)
	default:
		pf("  pin dir\t%s\t%d pins\n", f.PinDir, len(f.Pins))
		mode := f.Mode
		if f.ScopeCgroupID != 0 {
			mode += fmt.Sprintf(" (scope cgroup %d)", f.ScopeCgroupID)
		}
		pf("  mode\t%s\n", mode)
		if f.Scope != "" {
			pf("  scope\t%s\n", f.Scope)
		}
		if f.SlurmScope != "" && f.SlurmScope != f.Scope {
			pf("  slurm's scope\t%s\n", f.SlurmScope)
		}
		for _, c := range f.IgnoredScopes {
			pf("  not a scope\t%s: %s\n", c.Path, c.Refused)
		}
		if f.Enforcement != "" {
			pf("  enforcement\t%s (NVIDIA major %d)\n", f.Enforcement, f.NvidiaMajor)
		}
		if l := f.Link; l != nil {
			pf("  link\tid %d, prog %d %s, cgroup %d\n", l.ID, l.ProgramID, l.ProgramName, l.CgroupID)
		} else if f.Mode == string(devfilter.ModeScope) {
			pf("  link\tnone\n")
		}
		if f.SlurmdCgroup != "" {
			pf("  slurmd cgroup\t%s (outside the scope)\n", f.SlurmdCgroup)
		}
		if l := f.SlurmdLink; l != nil {
			pf("  slurmd link\tid %d, prog %d %s, cgroup %d\n", l.ID, l.ProgramID, l.ProgramName, l.CgroupID)
		} else if f.SlurmdCgroup != "" {
			pf("  slurmd link\tnone\n")
		}
		pf("  entries\t%d\n", f.PolicyEntries)
		pf("  counters\tlost %d, rate_full %d, rate entries %d\n", f.Lost, f.RateFull, f.RateEntries)
	}
	flush()

	pf("\nState\n")
	s := r.State
	switch {
	case s.File == "":
		pf("  file\t(none: state_file is empty)\n")
	case s.Error != "":
		pf("  file\t%s\tunreadable\n", s.File)
	case !s.Exists:
		pf("  file\t%s\tmissing (no job recorded)\n", s.File)
	default:
		steps := 0
		for _, j := range r.Jobs {
			steps += len(j.Steps)
		}
		pf("  file\t%s\t%d job(s), %d step(s)\n", s.File, len(r.Jobs), steps)
	}
	flush()

	if t := r.GPUTable; t != nil {
		pf("\nGPU table\n")
		pf("  source\t%s\t%d GPU(s): %s\n", t.Source, len(t.GPUs), t.Detail)
		if t.Slurmd != "" {
			pf("  slurmd\t%s\n", t.Slurmd)
		}
		if t.AutoDetect != "" {
			pf("  gres.conf\t%s\tAutoDetect=%s\n", t.GresConf, t.AutoDetect)
		}
		for _, g := range t.GPUs {
			pf("  gpu %d\t%s\t%s\n", g.Index, strings.Join(g.Files, ","), g.Type)
		}
		if t.Untrusted != "" {
			pf("  refusing\tevery GPU step: %s\n", t.Untrusted)
		}
		flush()
	}

	if len(r.Jobs) > 0 {
		pf("\nJobs (cgroups below the scope)\n")
		pf("  JOB\tSTEP\tUSER\tGPUS\tKERNEL\tCHECK\tCGROUP\n")
		scope := r.State.Scope
		if scope == "" {
			scope = r.Filter.Scope
		}
		for _, j := range r.Jobs {
			var flags []string
			if j.NoProlog {
				flags = append(flags, "no prolog")
			}
			if j.Broken != "" {
				flags = append(flags, "broken: "+j.Broken)
			}
			for _, sh := range j.Shares {
				flags = append(flags, "share "+sh.String())
			}
			switch {
			case j.Unconfirmed != "":
				flags = append(flags, "UNCONFIRMED ("+j.Unconfirmed+"): "+j.Adopted)
			case j.Adopted != "":
				flags = append(flags, "adopted: "+j.Adopted)
			case j.Recovered != "":
				flags = append(flags, "recovered from "+j.Recovered)
			}
			pf("  %d\t\t%s\t%s\t\t\t%s\n", j.ID, userLabel(j.UID, j.User), gpuList(j.GPUs), strings.Join(flags, "; "))
			for _, st := range j.Steps {
				cg := st.Cgroup
				if rel, err := filepath.Rel(scope, cg); scope != "" && err == nil && !strings.HasPrefix(rel, "..") {
					cg = rel
				}
				switch {
				case st.CgroupRecreated:
					cg += " (recreated)"
				case !st.CgroupExists:
					cg += " (gone)"
				}
				check := "ok"
				if len(st.Problems) > 0 {
					check = "MISMATCH"
				}
				pf("  \t%s\t\t%s\t%s\t%s\t%s\n", st.Name, gpuList(st.GPUs), kernelLabel(st.Kernel), check, cg)
			}
		}
		flush()
	}

	if len(r.OtherEntries) > 0 {
		pf("\nKernel entries without a step\n")
		pf("  CGROUP ID\tCGROUP\tKERNEL\tNOTE\n")
		for _, e := range r.OtherEntries {
			exists := "?"
			if e.CgroupExists != nil {
				exists = map[bool]string{true: "exists", false: "gone"}[*e.CgroupExists]
			}
			note := "MISMATCH"
			if e.Problem == "" {
				note = "exempt (" + e.Exempt + ")"
			}
			k := e.kernelEntry
			pf("  %d\t%s\t%s\t%s\n", e.CgroupID, exists, kernelLabel(&k), note)
		}
		flush()
	}

	if len(r.Problems) == 0 {
		pf("\nConsistent: no problem found.\n")
	} else {
		pf("\nProblems (%d)\n", len(r.Problems))
		for _, p := range r.Problems {
			pf("  - %s\n", p)
		}
	}
	flush()
}

func userLabel(uid uint32, name string) string {
	if name == "" {
		return strconv.FormatUint(uint64(uid), 10)
	}
	return fmt.Sprintf("%s(%d)", name, uid)
}

func gpuList(g []int) string {
	if len(g) == 0 {
		return "-"
	}
	return gpulist.Format(g)
}

func kernelLabel(k *kernelEntry) string {
	switch {
	case k == nil:
		return "?"
	case !k.Present:
		return "no entry"
	case k.Error != "":
		return "unreadable"
	case k.AllowAll:
		return "all GPUs"
	case len(k.GPUMinors) == 0:
		return "no GPU"
	}
	parts := make([]string, len(k.GPUMinors))
	for i, m := range k.GPUMinors {
		parts[i] = strconv.FormatUint(uint64(m), 10)
	}
	out := "minors " + strings.Join(parts, ",")
	if len(k.CapsMinors) > 0 {
		caps := make([]string, len(k.CapsMinors))
		for i, m := range k.CapsMinors {
			caps[i] = strconv.FormatUint(uint64(m), 10)
		}
		out += ", MIG caps " + strings.Join(caps, ",")
	}
	return out
}

// gatherStatus reads what buildStatus needs from this node.
func gatherStatus(cfg config.Config) statusInput {
	in := statusInput{
		Version: version.Version, PinDir: cfg.PinDir, StateFile: cfg.StateFile,
		Agent:       probeAgent(cfg.Socket),
		CgroupAlive: map[uint64]bool{}, CgroupIDs: map[string]uint64{}, Exempt: map[uint64]string{},
		UserName: func(uid uint32) string {
			u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
			if err != nil {
				return ""
			}
			return u.Username
		},
	}
	in.State, in.StateExists, in.StateErr = statefile.Read(cfg.StateFile)
	if in.State != nil {
		for _, j := range in.State.Jobs {
			for _, s := range j.Steps {
				var st unix.Stat_t
				if err := unix.Stat(s.Cgroup, &st); err == nil {
					in.CgroupIDs[s.Cgroup] = st.Ino
				}
			}
		}
	}
	if cfg.PinDir != "" {
		in.Kernel, in.KernelErr = devfilter.InspectPins(cfg.PinDir)
		if in.KernelErr == nil {
			for id := range in.Kernel.Entries {
				if alive, err := devfilter.CgroupExists(id); err == nil {
					in.CgroupAlive[id] = alive
				}
			}
		}
	}
	// Slurm's scope, by the agent's own rule.
	var candidates []string
	if mnt, err := jobcgroup.Mountpoint(); err == nil {
		w := jobcgroup.Where{Mount: mnt, Configured: cfg.Scope, Node: cfg.NodeName}
		st, _ := slurm.ReadSettings(cfg.SlurmConf)
		w.Slice = st.CgroupSlice
		found := jobcgroup.Find(w)
		if found.Err != nil {
			in.ScopeErr = found.Err.Error()
		}
		in.SlurmScope, in.IgnoredScopes = found.Scope, found.Ignored()
		if found.Scope != "" {
			in.SlurmScopeID, _ = jobcgroup.ID(found.Scope)
		}
		sd, err := found.Slurmd(mnt, st.SlurmdPid(cfg.NodeName))
		if err != nil {
			in.SlurmdErr = err.Error()
		}
		if sd != "" {
			if id, err := jobcgroup.ID(sd); err == nil {
				in.Slurmd, in.SlurmdID = sd, id
				// Its entry is the agent's, for root only: an exempt one.
				if rel, err := filepath.Rel(mnt, sd); err == nil {
					in.Exempt[id] = rel
				}
			}
		}
	}
	// The scope shown: the one the pinned state names, else the state
	// file's, the configured one or Slurm's.
	if in.State != nil && in.State.Scope != "" {
		candidates = append(candidates, in.State.Scope)
	}
	if cfg.Scope != "" {
		candidates = append(candidates, cfg.Scope)
	}
	if in.SlurmScope != "" {
		candidates = append(candidates, in.SlurmScope)
	}
	for _, c := range candidates {
		id, err := jobcgroup.ID(c)
		if err != nil {
			continue
		}
		if in.Kernel != nil && in.Kernel.ScopeID != 0 {
			if id == in.Kernel.ScopeID {
				in.Scope = c
				break
			}
			continue
		}
		in.Scope = c
		break
	}
	if in.Scope != "" && in.Kernel != nil && in.Kernel.Mode == devfilter.ModeScope {
		for _, name := range cfg.ExemptCgroups {
			if id, err := jobcgroup.ID(filepath.Join(in.Scope, name)); err == nil {
				in.Exempt[id] = name
			}
		}
	}
	return in
}

// probeAgent checks the socket by connecting and closing at once (the agent
// reads EOF and drops the connection), and asks the kernel for the pid of
// the listener (SO_PEERCRED).
func probeAgent(path string) agentReport {
	a := agentReport{Socket: path}
	fi, err := os.Stat(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			a.Error = err.Error()
		}
		return a
	}
	if fi.Mode().Type() != os.ModeSocket {
		a.Error = "not a socket"
		return a
	}
	a.SocketExists = true
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	defer c.Close()
	a.Listening = true
	if uc, ok := c.(*net.UnixConn); ok {
		if raw, err := uc.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
					a.PID = int(cred.Pid)
				}
			})
		}
	}
	return a
}
