// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/verify"
)

// runVerify is `gpufence verify`: the live self-test. Exit status: 0 every
// check passed, 1 a check failed (named on stdout), 2 usage error.
func runVerify(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpufence verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := config.Default()
	cfgPath := fs.String("config", config.DefaultPath, "agent configuration file (YAML); missing is fine at the default path")
	socket := fs.String("socket", def.Socket, "the agent's unix socket; overrides the configuration's socket")
	scope := fs.String("scope", def.Scope, "cgroup directory of Slurm's slurmstepd scope (default: the configuration's scope, else found as the agent finds it)")
	gpu := fs.Int("gpu", -1, "GPU index to give the throw-away cgroup; -1: the lowest in the node's GPU table")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long (each check that did not finish fails)")
	asJSON := fs.Bool("json", false, `print {"ok":bool,"failed":[...],"checks":[...],"took_us":N} instead of text`)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: gpufence verify [--config FILE] [--socket PATH] [--scope DIR] [--gpu N] [--json]

A live self-test of GPU isolation on this node, through the running agent
and the kernel, as a job meets it. It makes a throw-away cgroup below Slurm's
slurmstepd scope (gpufence-verify-<pid>), has the agent give it one GPU the
way a job step gets its GPUs, and from a process inside it opens every GPU
device file of the node's GPU table: the GPU given must open, every other must
be refused (EPERM). In scope mode a second cgroup, never registered, must be
refused every GPU. Then it removes the cgroup, the agent drops its kernel
entry and writes a "verify" audit record, and it checks that nothing is left.
Run it as root; it takes tens of milliseconds, so it fits a Slurm
HealthCheckProgram (docs/verify.md).
Exit status: 0 every check passed, 1 a check failed (each failed check is
named), 2 usage error.

Flags:
`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	cfg, err := loadConfig(fs, *cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "gpufence verify: %v\n", err)
		return 2
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "socket":
			cfg.Socket = *socket
		case "scope":
			cfg.Scope = *scope
		}
	})
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "gpufence verify: --timeout %v must be above 0\n", *timeout)
		return 2
	}
	o := verify.Options{Socket: cfg.Socket, Scope: cfg.Scope, Node: cfg.NodeName, Timeout: *timeout}
	// Where slurmd makes its scope: cgroup.conf's CgroupSlice. Unreadable,
	// system.slice is looked at (and verify fails if that is not it).
	if st, err := slurm.ReadSettings(cfg.SlurmConf); err == nil {
		o.Slice = st.CgroupSlice
	}
	if *gpu >= 0 {
		o.GPU = gpu
	}
	r := verify.Run(o)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(r)
	} else {
		printVerify(stdout, r)
	}
	if !r.OK {
		return 1
	}
	return 0
}

func printVerify(w io.Writer, r verify.Report) {
	for _, c := range r.Checks {
		v := "ok  "
		switch {
		case c.Skipped:
			v = "skip"
		case !c.OK:
			v = "FAIL"
		}
		line := fmt.Sprintf("%s %s", v, c.Name)
		if c.Detail != "" {
			line += ": " + c.Detail
		}
		if c.TookUS > 0 {
			line += fmt.Sprintf(" (%.1f ms)", float64(c.TookUS)/1000)
		}
		fmt.Fprintln(w, line)
	}
	took := fmt.Sprintf("%.1f ms", float64(r.TookUS)/1000)
	if r.OK {
		fmt.Fprintf(w, "gpufence verify: passed in %s\n", took)
		return
	}
	fmt.Fprintf(w, "gpufence verify: FAILED in %s: %s\n", took, strings.Join(r.Failed, "; "))
}
