// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"

	"github.com/spf13/cobra"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/status"
)

// agentUID is the uid the agent runs as: root (the packaged unit, the
// docs). A socket or listener of another uid is not the agent.
const agentUID = 0

// statusCommand is `gpufence status` (package status): what the agent's
// socket, the pinned device filter and the saved state say, cross-checked.
// Exit status: 0 consistent, 1 something is off (see the problems), 2
// usage error.
func statusCommand() *cobra.Command {
	var cfgPath, socket, pinDir, stateFile string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [flags]",
		Short: "show jobs, steps, GPUs, cgroups, pinned objects and counters (works while the agent is down)",
		Long: "Shows the agent socket, the pinned device filter (mode, link, policy entries, counters) and the\n" +
			"jobs and steps of the agent's state file, and cross-checks them. It reads the pins and files\n" +
			"directly (run it as root) and works while the agent is down.\n\n" +
			"Exit status: 0 consistent, 1 something is off (listed under Problems), 2 usage error.",
	}
	fs := cmd.Flags()
	fs.StringVar(&cfgPath, "config", config.DefaultPath, "configuration file (YAML); missing is fine at the default path")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object instead of the sections")
	fs.StringVar(&socket, "socket", "", "agent socket (default: the configuration's)")
	fs.StringVar(&pinDir, "pin-dir", "", "bpffs folder of the pinned filter (default: the configuration's)")
	fs.StringVar(&stateFile, "state-file", "", "agent state file (default: the configuration's)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := loadConfig(fs, cfgPath)
		if err != nil {
			return configError(err)
		}
		if fs.Changed("socket") {
			cfg.Socket = socket
		}
		if fs.Changed("pin-dir") {
			cfg.PinDir = pinDir
		}
		if fs.Changed("state-file") {
			cfg.StateFile = stateFile
		}
		r := status.Build(status.Gather(cfg, agentUID))
		stdout := cmd.OutOrStdout()
		if asJSON {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetIndent("", "  ")
			if err := enc.Encode(r); err != nil {
				return err
			}
			// Same JSON; no character in it can drive the terminal.
			stdout.Write(audit.TerminalSafeJSON(buf.Bytes()))
		} else {
			status.Write(stdout, r)
		}
		if !r.OK {
			return exitStatus(exitFailure)
		}
		return nil
	}
	return cmd
}
