// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/status"
)

// agentUID is the uid the agent runs as: root (the packaged unit, the
// docs). A socket or listener of another uid is not the agent.
const agentUID = 0

// runStatus is `gpufence status` (package status): what the agent's
// socket, the pinned device filter and the saved state say, cross-checked.
// Exit status:
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
	r := status.Build(status.Gather(cfg, agentUID))
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
		status.Write(stdout, r)
	}
	if !r.OK {
		return 1
	}
	return 0
}
