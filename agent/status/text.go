// SPDX-License-Identifier: Apache-2.0

package status

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/gpulist"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Write prints the report as short aligned sections.
func Write(w io.Writer, r Report) {
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
	case a.Untrusted != "":
		state = fmt.Sprintf("NOT THE AGENT (pid %d): %s", a.PID, a.Untrusted)
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
			k := e.KernelEntry
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

func kernelLabel(k *KernelEntry) string {
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
	return minorsLabel(k.GPUMinors, k.CapsMinors)
}

// minorsLabel shows GPU minors and MIG caps minors: "minors 0,1, MIG caps
// 12" or "no GPU".
func minorsLabel(gpus, caps []uint32) string {
	if len(gpus) == 0 && len(caps) == 0 {
		return "no GPU"
	}
	join := func(ms []uint32) string {
		parts := make([]string, len(ms))
		for i, m := range ms {
			parts[i] = strconv.FormatUint(uint64(m), 10)
		}
		return strings.Join(parts, ",")
	}
	out := "minors " + join(gpus)
	if len(gpus) == 0 {
		out = "no GPU minor"
	}
	if len(caps) > 0 {
		out += ", MIG caps " + join(caps)
	}
	return out
}
