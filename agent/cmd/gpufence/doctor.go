// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/doctor"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/version"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// doctorCommand is `gpufence doctor`: is this node ready for gpufence,
// and if not, what to fix. Exit status: 0 no check failed (warnings
// allowed), 1 a check failed, 2 usage error.
func doctorCommand() *cobra.Command {
	var cfgPath, slurmConf, root string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor [flags]",
		Short: "check that this node is ready for gpufence: cgroups, kernel, bpffs, Slurm, plugin, gres, socket, audit",
		Long: `Checks that this node is ready for gpufence, and prints each check with a
verdict (ok, info, skip, warn, fail), what it found and, for warn and fail,
the fix:
  cgroup        cgroup v2 mounted, and whether the host is hybrid or v1 only
  kernel        CGROUP_DEVICE programs, ring buffers, and the helper that
                decides scope mode or the per-cgroup fallback (needs root)
  bpffs         pin_dir is on a bpf file system; what is pinned there
  slurm-conf    slurm.conf is readable and names this node
  slurm-plugin  slurmd -V (or srun -V) against the plugin's plugin_version,
                the slurm-X.Y builds and the plugin's Go part
  plugstack     plugstack.conf (and its includes) loads spank_gpufence.so,
                required, with valid options and the agent's socket
  slurm-cgroup  ConstrainDevices, CgroupPlugin, ProctrackType, TaskPlugin
  slurm-layout  the scope and job cgroup names this Slurm release makes
                (CgroupSlice, SLUID job cgroups) and cgroup.conf keys it refuses
  gres          the agent's GPU table (slurmd -G, cross-checked with gres.conf,
                as the agent reads it) against /dev and /proc/devices
  nvml          gres.conf against the GPUs the NVIDIA driver reports (NVML), as the agent checks it
  agent-socket  the socket exists, is root's, 0600, and accepts connections
  audit         the audit file's folder, mode and free space; journald, syslog

It reads files and runs slurmd -V and slurmd -G (which prints slurmd's GPU
table and exits, as the agent runs it); it changes nothing of gpufence's. Run
it as root: otherwise the kernel check and slurmd -G are skipped and some files
are unreadable.

Exit status: 0 nothing failed (warnings allowed), 1 a check failed, 2 usage error.`,
	}
	fs := cmd.Flags()
	fs.StringVar(&cfgPath, "config", config.DefaultPath, "agent configuration file (YAML); missing is fine at the default path")
	fs.BoolVar(&asJSON, "json", false, `print {"ok":bool,"checks":[...]} instead of text`)
	fs.StringVar(&slurmConf, "slurm-conf", "", "Slurm's slurm.conf (default: the configuration's slurm_conf)")
	fs.StringVar(&root, "root", "/", "look at the node's files below this folder (for a mounted image); the kernel probe and Slurm's -V still run here")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return runDoctor(cmd, fs, cfgPath, slurmConf, root, asJSON)
	}
	return cmd
}

func runDoctor(cmd *cobra.Command, fs *pflag.FlagSet, cfgPath, slurmConf, root string, asJSON bool) error {
	stdout := cmd.OutOrStdout()
	cfg, err := loadConfig(fs, cfgPath)
	if err != nil {
		return configError(err)
	}
	if slurmConf != "" {
		cfg.SlurmConf = slurmConf
		if err := cfg.Validate("command line"); err != nil {
			return configError(err)
		}
	}
	env := doctor.Env{
		Root: root, Config: cfg, Version: version.Version,
		SearchPath: os.Getenv("PATH"),
	}
	env.Inventory = func() ([]inventory.GPU, error) {
		inv, err := inventory.OpenSystem(inventory.Options{})
		if err != nil {
			return nil, err
		}
		defer inv.Close()
		return inv.GPUs()
	}
	if os.Geteuid() == 0 {
		env.ProbeKernel = devfilter.Probe
		env.InspectPins = devfilter.InspectPins
	} else {
		env.KernelSkip = "needs root (it loads small test programs into the kernel)"
	}
	switch {
	case os.Geteuid() != 0:
		env.SlurmdGSkip = "needs root, as the agent runs it"
	case root != "/" && root != "":
		env.SlurmdGSkip = "--root: slurmd -G runs on the node itself only"
	default:
		env.SlurmdG = func(binDir, slurmConf, node string) (slurm.SlurmdView, error) {
			bin, err := slurm.FindSlurmd(cfg.Slurmd, binDir, slurmConf)
			if err != nil {
				return slurm.SlurmdView{}, err
			}
			return (&slurm.Slurmd{Bin: bin, SlurmConf: slurmConf, Node: node}).GPUs(context.Background())
		}
	}
	rep := doctor.Run(env)
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := rep.WriteText(stdout); err != nil {
		return err
	}
	if !rep.OK {
		return exitStatus(exitFailure)
	}
	return nil
}
