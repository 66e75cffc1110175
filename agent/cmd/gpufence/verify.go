// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/verify"
)

// verifyCommand is `gpufence verify`: the live self-test. Exit status: 0
// every check passed, 1 a check failed (named on stdout), 2 usage error.
func verifyCommand() *cobra.Command {
	def := config.Default()
	var cfgPath, socket, scope string
	var gpu int
	var timeout time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "verify [flags]",
		Short: "live self-test: a throw-away cgroup given one GPU by the agent must open it and be refused the others",
		Long: `A live self-test of GPU isolation on this node, through the running agent
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
named), 2 usage error.`,
	}
	fs := cmd.Flags()
	fs.StringVar(&cfgPath, "config", config.DefaultPath, "agent configuration file (YAML); missing is fine at the default path")
	fs.StringVar(&socket, "socket", def.Socket, "the agent's unix socket; overrides the configuration's socket")
	fs.StringVar(&scope, "scope", def.Scope, "cgroup directory of Slurm's slurmstepd scope (default: the configuration's scope, else found as the agent finds it)")
	fs.IntVar(&gpu, "gpu", -1, "GPU index to give the throw-away cgroup; -1: the lowest in the node's GPU table")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long (each check that did not finish fails)")
	fs.BoolVar(&asJSON, "json", false, `print {"ok":bool,"failed":[...],"checks":[...],"took_us":N} instead of text`)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if timeout <= 0 {
			return usageErrorf("--timeout %v must be above 0", timeout)
		}
		cfg, err := loadConfig(fs, cfgPath)
		if err != nil {
			return configError(err)
		}
		if fs.Changed("socket") {
			cfg.Socket = socket
		}
		if fs.Changed("scope") {
			cfg.Scope = scope
		}
		o := verify.Options{Socket: cfg.Socket, Scope: cfg.Scope, Node: cfg.NodeName, Timeout: timeout}
		// Where slurmd makes its scope: cgroup.conf's CgroupSlice. Unreadable,
		// system.slice is looked at (and verify fails if that is not it).
		if st, err := slurm.ReadSettings(cfg.SlurmConf); err == nil {
			o.Slice = st.CgroupSlice
		}
		if gpu >= 0 {
			o.GPU = &gpu
		}
		r := verify.Run(o)
		if asJSON {
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			if err := enc.Encode(r); err != nil {
				return err
			}
		} else {
			printVerify(cmd.OutOrStdout(), r)
		}
		if !r.OK {
			return exitStatus(exitFailure)
		}
		return nil
	}
	return cmd
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
