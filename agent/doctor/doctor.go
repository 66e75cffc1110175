// SPDX-License-Identifier: Apache-2.0

// Package doctor checks that a node is ready for gpufence: cgroup v2, the
// kernel features of the device filter, bpffs, Slurm's version against the
// installed SPANK plugin, the plugstack line, Slurm's cgroup settings,
// gres.conf against the device nodes, the agent socket and the audit path.
// Every check reads real files below Env.Root, so tests run it on prepared
// fixture trees; what needs the kernel or runs a program is injected.
package doctor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/status"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Verdict is the outcome of one check.
type Verdict string

// Verdicts, from good to bad. Only Fail makes the report fail.
const (
	OK   Verdict = "ok"
	Info Verdict = "info"
	Skip Verdict = "skip"
	Warn Verdict = "warn"
	Fail Verdict = "fail"
)

// Check is one finding. The JSON names are stable.
type Check struct {
	// ID names the check: cgroup, kernel, bpffs, slurm-conf, slurm-plugin,
	// plugstack, slurm-cgroup, slurm-layout, gres, nvml, agent-socket, audit.
	ID string `json:"id"`
	// Title says what is checked.
	Title   string  `json:"title"`
	Verdict Verdict `json:"verdict"`
	// Summary is the finding in one line.
	Summary string `json:"summary"`
	// Detail is what was found, with paths and values, one fact a line.
	Detail []string `json:"detail"`
	// Fix is what to do, for warn and fail only.
	Fix string `json:"fix,omitempty"`
}

// Report is the result of Run.
type Report struct {
	Version string `json:"version"`
	// OK is false when any check failed (warnings are allowed).
	OK     bool    `json:"ok"`
	Checks []Check `json:"checks"`
}

// Env is the node Run looks at.
type Env struct {
	// Root is prefixed to every path read: "/" (or "") on the node itself, a
	// fixture directory in tests.
	Root string
	// Config is the agent's configuration (socket, slurm_conf, node_name,
	// pin_dir, audit, ...), paths as seen on the node (without Root).
	Config config.Config
	// Version is this gpufence's version, for the report.
	Version string
	// AdminUID must own the agent socket and the audit file: 0 on a node.
	AdminUID uint32
	// ProbeKernel finds the device filter mode the kernel supports
	// (devfilter.Probe). Nil skips the kernel check, for KernelSkip.
	ProbeKernel func() (devfilter.Mode, error)
	KernelSkip  string
	// InspectPins reads the pinned filter (devfilter.InspectPins); nil only
	// lists the pin names.
	InspectPins func(dir string) (*devfilter.PinnedView, error)
	// RunVersion runs the Slurm program at path (below Root) with -V and
	// returns its output; nil means exec.Command.
	RunVersion func(path string) (string, error)
	// Inventory lists the GPUs through NVML (inventory.OpenSystem); nil
	// skips the NVML check.
	Inventory func() ([]inventory.GPU, error)
	// SlurmdG finds this node's slurmd (the slurmd setting, else
	// slurm.SlurmdPath) and runs slurmd
	// -G (slurm.Slurmd) for the gres check, as the agent does; nil skips
	// it, for SlurmdGSkip.
	SlurmdG     func(binDir, slurmConf, node string) (slurm.SlurmdView, error)
	SlurmdGSkip string
	// SearchPath is the PATH searched for slurmd and srun (before
	// /usr/sbin, /usr/local/sbin and /opt/slurm/sbin).
	SearchPath string
}

// path maps a path of the node to the file under Root.
func (e *Env) path(p string) string {
	if e.Root == "" || e.Root == "/" {
		return p
	}
	return filepath.Join(e.Root, p)
}

// Run runs every check and returns them in a fixed order.
func Run(env Env) Report {
	r := &run{env: &env}
	r.mounts, r.mountsErr = readMountinfo(env.path("/proc/self/mountinfo"))
	r.sock = probeSocket(&env)
	r.slurm = readSlurm(&env)
	r.plug = readPlugstack(&env, r.slurm)
	checks := []Check{
		r.checkCgroup(),
		r.checkKernel(),
		r.checkBPFFS(),
		r.checkSlurmConf(),
		r.checkPlugin(),
		r.checkPlugstack(),
		r.checkSlurmCgroup(),
		r.checkLayout(),
		r.checkGres(),
		r.checkNVML(),
		r.checkSocket(),
		r.checkAudit(),
	}
	rep := Report{Version: env.Version, OK: true, Checks: checks}
	for i := range rep.Checks {
		c := &rep.Checks[i]
		if c.Detail == nil {
			c.Detail = []string{}
		}
		if c.Verdict == Fail {
			rep.OK = false
		}
		if c.Verdict != Warn && c.Verdict != Fail {
			c.Fix = ""
		}
	}
	return rep
}

// run holds what several checks share.
type run struct {
	env *Env
	// gresTable is gres.conf resolved as the agent resolves it (set by
	// checkGres when it can be), for the NVML check.
	gresTable []devices.GPU
	mounts    []mountEntry
	mountsErr error
	sock      status.Socket
	slurm     slurmFacts
	plug      plugstackFacts
	// mode is the filter mode the agent would run in, "" when unknown.
	mode devfilter.Mode
	// slurmV is the node's Slurm release (from slurmd -V), when haveSlurm.
	slurmV    SlurmVersion
	haveSlurm bool
}

// newCheck starts a Check; ok, info, skip, warn and fail fill it.
func newCheck(id, title string) Check { return Check{ID: id, Title: title} }

func (c *Check) add(format string, args ...any) {
	c.Detail = append(c.Detail, fmt.Sprintf(format, args...))
}

func rank(v Verdict) int {
	switch v {
	case Fail:
		return 4
	case Warn:
		return 3
	case Skip:
		return 2
	case Info:
		return 1
	}
	return 0
}

func (c *Check) ok(format string, args ...any)   { c.escalate(OK, "", format, args...) }
func (c *Check) info(format string, args ...any) { c.escalate(Info, "", format, args...) }
func (c *Check) skip(format string, args ...any) { c.escalate(Skip, "", format, args...) }
func (c *Check) warn(fix, format string, args ...any) {
	c.escalate(Warn, fix, format, args...)
}
func (c *Check) fail(fix, format string, args ...any) {
	c.escalate(Fail, fix, format, args...)
}

// escalate records a finding. The worst finding is the summary and gives
// the fix; milder or later ones of the same weight go to the detail, so
// nothing found is lost.
func (c *Check) escalate(v Verdict, fix, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	switch {
	case c.Verdict == "" || rank(v) > rank(c.Verdict):
		if c.Summary != "" {
			prev := []string{c.Summary}
			if c.Verdict == Warn {
				prev = []string{"warn: " + c.Summary}
				if c.Fix != "" {
					prev = append(prev, "  fix: "+c.Fix)
				}
			}
			c.Detail = append(prev, c.Detail...)
		}
		c.Verdict, c.Summary, c.Fix = v, msg, fix
	case rank(v) == rank(c.Verdict) && (v == Warn || v == Fail):
		c.add("also %s: %s", v, msg)
		if c.Fix == "" {
			c.Fix = fix
		} else if fix != "" && fix != c.Fix {
			c.add("  fix: %s", fix)
		}
	case v == Warn || v == Fail:
		c.add("%s: %s", v, msg)
		if fix != "" {
			c.add("  fix: %s", fix)
		}
	default:
		c.add("%s", msg)
	}
}

// WriteText prints the report for a person: one line per check (verdict,
// id, summary), its detail and fix indented below, then a count.
func (r Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "gpufence %s doctor\n\n", r.Version)
	counts := map[Verdict]int{}
	for _, c := range r.Checks {
		counts[c.Verdict]++
		fmt.Fprintf(tw, "%-4s\t%s\t%s\n", strings.ToUpper(string(c.Verdict)), c.ID, c.Summary)
		for _, d := range c.Detail {
			fmt.Fprintf(tw, "\t\t  %s\n", d)
		}
		if c.Fix != "" {
			fmt.Fprintf(tw, "\t\t  fix: %s\n", c.Fix)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var parts []string
	for _, v := range []Verdict{OK, Info, Skip, Warn, Fail} {
		if counts[v] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[v], v))
		}
	}
	result := "ready"
	switch {
	case !r.OK:
		result = "NOT READY"
	case counts[Warn] > 0:
		result = "ready, with warnings"
	}
	_, err := fmt.Fprintf(w, "\n%s: %s\n", result, strings.Join(parts, ", "))
	return err
}

// exists reports whether p (below Root) exists; an error other than
// ErrNotExist counts as existing, so that it is reported where used.
func (e *Env) exists(p string) bool {
	_, err := os.Lstat(e.path(p))
	return err == nil || !errors.Is(err, os.ErrNotExist)
}

// systemd reports whether the node runs systemd (it decides which fix to
// suggest).
func (e *Env) systemd() bool { return e.exists("/run/systemd/system") }
