// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"os"
	"strings"
)

// AutoDetectOrder is the AutoDetect layout's GPU table: Slurm's GPU index
// i is the fake device nvidia<AutoDetectOrder[i]>. It is the order of the
// recorded `autodetect-links` layout (agent/slurm/testdata/slurmd-G), which
// every release from 22.05 to 26.05 printed: no file says it, only the
// links in fake_gpus.conf do.
var AutoDetectOrder = []int{2, 3, 0, 1}

// fakeGPUType is the type fake_gpus.conf gives the GPUs; slurm.conf's
// untyped Gres= makes slurmd drop it, as in the recording.
const fakeGPUType = "tesla_t4"

// renderAutoDetectGres is the AutoDetect layout's gres.conf: no File=
// line, slurmd finds the GPUs itself.
func renderAutoDetectGres() string {
	return "# Written by the gpufence test harness: slurmd finds the GPUs (fake_gpus.conf beside slurm.conf).\nAutoDetect=nvml\n"
}

// renderFakeGPUs is the fake_gpus.conf Slurm's gres/gpu plugin reads
// instead of NVML (_get_system_gpu_list_fake, 22.05 to 26.05): one line per
// GPU in device minor order,
//
//	<type>|<cpu count>|<cpus>|<links>|<device file>
//
// whose links put -1 at the GPU's place in AutoDetectOrder: slurmd sorts
// the GPUs by where their own link (-1) is, as it does with NVML's NVLink
// matrix, and numbers them in that order.
func renderFakeGPUs(p confParams) string {
	var b strings.Builder
	for minor := 0; minor < len(AutoDetectOrder); minor++ {
		links := make([]string, len(AutoDetectOrder))
		for i, m := range AutoDetectOrder {
			links[i] = "0"
			if m == minor {
				links[i] = "-1"
			}
		}
		fmt.Fprintf(&b, "%s|%d|0-%d|%s|%s/dev/nvidia%d\n", fakeGPUType, p.CPUs, p.CPUs-1, strings.Join(links, ","), p.Root, minor)
	}
	return b.String()
}

// fakeGPUsConf is where slurmd looks for fake_gpus.conf: beside slurm.conf.
func (c *Cluster) fakeGPUsConf() string { return c.path("etc/fake_gpus.conf") }

// SetAutoDetect rewrites gres.conf as AutoDetect=nvml with no File= line
// and puts a fake_gpus.conf beside slurm.conf whose GPUs slurmd numbers in
// AutoDetectOrder (on), or restores the usual files and removes
// fake_gpus.conf (off: slurmd reads that file whenever it exists, whatever
// gres.conf says). slurm.conf's Gres= is untyped in this layout. Restarts
// slurmctld and slurmd, which read gres.conf only at start; no job may run;
// running agents keep the table they read at their start. On works on
// every release the harness runs (the recordings' README).
func (c *Cluster) SetAutoDetect(on bool) error {
	if on {
		switch {
		case c.st.GPUs != len(AutoDetectOrder):
			return fmt.Errorf("the AutoDetect layout needs GPUs=%d, the cluster has %d", len(AutoDetectOrder), c.st.GPUs)
		case c.st.MIG:
			return fmt.Errorf("the AutoDetect layout and the MIG layout exclude each other: SetMIG(false) first")
		case c.st.FakeDriver:
			return fmt.Errorf("the AutoDetect layout and the fake driver exclude each other: SetFakeDriver(false) first")
		}
	}
	for _, p := range []*Process{c.st.Slurmd, c.st.Slurmctld} {
		if err := p.Stop(); err != nil {
			return fmt.Errorf("stop %s: %w", p.Name, err)
		}
	}
	c.st.AutoDetect = on
	p := c.params()
	if on {
		if err := os.WriteFile(c.fakeGPUsConf(), []byte(renderFakeGPUs(p)), 0o644); err != nil {
			return err
		}
	} else if err := os.Remove(c.fakeGPUsConf()); err != nil && !os.IsNotExist(err) {
		return err
	}
	files := map[string]string{"etc/gres.conf": renderGresConf(p), "etc/slurm.conf": renderSlurmConf(p)}
	if p.PCluster && !p.AutoDetect {
		files["etc/"+pclusterGresFile] = renderPClusterGres(p)
	}
	for rel, text := range files {
		if err := os.WriteFile(c.path(rel), []byte(text), 0o644); err != nil {
			return err
		}
	}
	if err := c.startSlurmctld(); err != nil {
		return err
	}
	if err := c.startSlurmd(context.Background()); err != nil {
		return fmt.Errorf("restart slurmd with AutoDetect %v: %w\n%s", on, err, tail(c.path("logs/slurmd.log"), 20))
	}
	return c.saveState()
}

// SlurmdWrapper writes, and returns the path of, a script that runs the
// cluster's own slurmd the way the harness starts it: the release's binary
// (chrooted through gfroot for a Debian root) and, on this cgroup hybrid
// host, the LD_PRELOAD shim without which Slurm's cgroup/v2 plugin stops
// ("Hybrid mode is not supported"). The agent's `slurmd -G` needs both to
// see what the running slurmd sees; give the agent this path as its
// `slurmd` setting. Test only: it lies in <Root>/bin, root's and not
// writable by others, as the agent demands of the slurmd it runs.
func (c *Cluster) SlurmdWrapper() (string, error) {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Written by the gpufence test harness (tests/cluster): the cluster's slurmd as the harness runs it. Test only.\n")
	if c.st.Hybrid {
		fmt.Fprintf(&b, "LD_PRELOAD=%s\nexport LD_PRELOAD\n", shellQuote(c.shimPath()))
	}
	b.WriteString("exec")
	for _, a := range c.daemonArgv("slurmd") {
		b.WriteString(" " + shellQuote(a))
	}
	b.WriteString(" \"$@\"\n")
	p := c.path("bin/slurmd-harness")
	if err := os.WriteFile(p+".new", []byte(b.String()), 0o755); err != nil {
		return "", err
	}
	if err := os.Chmod(p+".new", 0o755); err != nil { // umask
		return "", err
	}
	return p, os.Rename(p+".new", p)
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
