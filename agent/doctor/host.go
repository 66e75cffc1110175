// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/mountinfo"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry = mountinfo.Mount

func readMountinfo(path string) ([]mountEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mounts, err := mountinfo.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return mounts, nil
}

// mountOf returns the mount that holds path: the longest mount point
// containing it, the last such line when mounts are stacked.
func mountOf(mounts []mountEntry, path string) (mountEntry, bool) {
	path = filepath.Clean(path)
	best, found := mountEntry{}, false
	for _, m := range mounts {
		if !within(m.MountPoint, path) {
			continue
		}
		if !found || len(m.MountPoint) >= len(best.MountPoint) {
			best, found = m, true
		}
	}
	return best, found
}

func within(dir, p string) bool {
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func (r *run) checkCgroup() Check {
	c := newCheck("cgroup", "cgroup mode and mount")
	if r.mountsErr != nil {
		c.fail("Run gpufence doctor on the node itself, where /proc is mounted.", "cannot read the mount table: %v", r.mountsErr)
		return c
	}
	var v2 []string
	var v1 []string
	for _, m := range r.mounts {
		switch m.FSType {
		case "cgroup2":
			v2 = append(v2, m.MountPoint)
		case "cgroup":
			v1 = append(v1, fmt.Sprintf("%s (%s)", m.MountPoint, v1Controllers(m.Options)))
		}
	}
	if len(v2) > 0 {
		c.add("cgroup2 mounted at %s", strings.Join(v2, ", "))
	}
	if len(v1) > 0 {
		c.add("cgroup v1 hierarchies: %s", strings.Join(v1, ", "))
	}
	const unify = "Boot with systemd.unified_cgroup_hierarchy=1 (and without cgroup_no_v1 exceptions) so that the host has cgroup v2 only."
	switch {
	case len(v2) == 0:
		c.fail(unify, "no cgroup v2 hierarchy (cgroup v1 only): the device filter attaches to cgroup v2 and Slurm's steps must live there")
	case slices.Contains(v2, "/sys/fs/cgroup") && len(v1) == 0:
		c.ok("cgroup v2 only, at /sys/fs/cgroup")
	case slices.Contains(v2, "/sys/fs/cgroup"):
		c.warn(unify, "cgroup v2 at /sys/fs/cgroup, but cgroup v1 hierarchies are mounted too: Slurm's cgroup/v2 plugin refuses processes that have v1 cgroups")
	default:
		c.add("gpufence uses the cgroup v2 hierarchy wherever it is mounted, but Slurm's steps are only there when slurmd runs CgroupPlugin=cgroup/v2 with CgroupMountpoint=%s, which Slurm refuses on a hybrid host unless it is made to see only the v2 line of /proc/self/cgroup", v2[0])
		c.warn(unify, "hybrid cgroups: cgroup v2 at %s beside cgroup v1 controllers", v2[0])
	}
	return c
}

// v1Controllers picks the controller names from a v1 mount's options.
func v1Controllers(opts string) string {
	var out []string
	for _, o := range strings.Split(opts, ",") {
		switch {
		case o == "rw" || o == "ro" || strings.HasPrefix(o, "release_agent") || o == "clone_children" || o == "noprefix" || o == "xattr":
		default:
			out = append(out, o)
		}
	}
	return strings.Join(out, ",")
}

func (r *run) checkKernel() Check {
	c := newCheck("kernel", "kernel features of the device filter")
	if b, err := os.ReadFile(r.env.path("/proc/sys/kernel/osrelease")); err == nil {
		c.add("kernel %s", strings.TrimSpace(string(b)))
	}
	cfgMode := r.env.Config.Mode
	c.add("configured mode: %s", cfgMode)
	if cfgMode != config.ModeAuto {
		r.mode = devfilter.Mode(cfgMode)
	}
	if r.env.ProbeKernel == nil {
		c.skip("not probed: %s", r.env.KernelSkip)
		return c
	}
	mode, err := r.env.ProbeKernel()
	if err != nil {
		c.fail("Run a kernel with BPF_PROG_TYPE_CGROUP_DEVICE and BPF ring buffers (5.8 or later, CONFIG_CGROUP_BPF=y, CONFIG_BPF_SYSCALL=y).", "the device filter cannot load: %v", err)
		return c
	}
	c.add("CGROUP_DEVICE programs, ring buffers: available")
	r.mode = mode
	if cfgMode != config.ModeAuto {
		r.mode = devfilter.Mode(cfgMode)
	}
	switch mode {
	case devfilter.ModeScope:
		c.add("bpf_get_current_ancestor_cgroup_id for device programs: available")
	default:
		c.add("bpf_get_current_ancestor_cgroup_id for device programs: missing; cgroup storage and task helpers: available")
	}
	switch {
	case cfgMode == config.ModeScope && mode != devfilter.ModeScope:
		c.fail("Set mode: auto (or per-cgroup) in the agent configuration, or run a kernel that offers bpf_get_current_ancestor_cgroup_id to device programs.",
			"mode: scope is configured but this kernel supports only %s mode: the agent cannot load its filter", mode)
	case mode == devfilter.ModeScope && cfgMode == config.ModePerCgroup:
		c.warn("Set mode: auto in the agent configuration to use scope mode.", "this kernel supports scope mode, but mode: per-cgroup is configured (jobs never registered are then not denied by the kernel)")
	case mode == devfilter.ModeScope:
		c.ok("scope mode: one filter on Slurm's scope decides per job")
	default:
		c.warn("Run a kernel whose device programs have bpf_get_current_ancestor_cgroup_id (6.1 or later) for scope mode.",
			"per-cgroup fallback mode: a job cgroup that was never registered is not denied by the kernel (the plugin refuses such steps instead)")
	}
	return c
}

func (r *run) checkBPFFS() Check {
	c := newCheck("bpffs", "bpf file system for the pinned filter")
	dir := r.env.Config.PinDir
	if dir == "" {
		c.warn("Set pin_dir (default /sys/fs/bpf/gpufence) so that enforcement survives an agent restart.",
			"pin_dir is empty: nothing is pinned, so the filter is detached whenever the agent stops")
		return c
	}
	c.add("pin_dir: %s", dir)
	if r.mountsErr != nil {
		c.fail("Run gpufence doctor on the node itself, where /proc is mounted.", "cannot read the mount table: %v", r.mountsErr)
		return c
	}
	m, found := mountOf(r.mounts, dir)
	if m.FSType != "bpf" {
		mount := "mount -t bpf bpf " + devfilter.DefaultBPFFS
		if r.env.systemd() {
			mount = "systemctl start sys-fs-bpf.mount (or " + mount + ")"
		}
		if found {
			c.add("%s is on %s (%s mounted at %s)", dir, m.FSType, m.Source, m.MountPoint)
		}
		switch {
		case !within(devfilter.DefaultBPFFS, dir):
			c.fail(fmt.Sprintf("Mount bpffs at %s (mount -t bpf bpf %[1]s) or set pin_dir below %s.", filepath.Dir(dir), devfilter.DefaultBPFFS),
				"%s is not on a bpf file system, and the agent mounts bpffs only at %s", dir, devfilter.DefaultBPFFS)
		case r.sock.Listening:
			c.fail("Mount bpffs on the host ("+mount+") and restart the agent, so that its pins are visible to the whole node.",
				"the agent socket answers but %s is not a bpf file system here: the agent's filter is not pinned where the node sees it", devfilter.DefaultBPFFS)
		default:
			c.warn("Mount bpffs at boot: "+mount+".",
				"no bpffs at %s: the agent mounts it when it starts, the pins last until reboot", devfilter.DefaultBPFFS)
		}
		return c
	}
	c.add("bpffs mounted at %s", m.MountPoint)
	c.ok("%s is on bpffs", dir)
	if r.env.InspectPins == nil {
		names, err := os.ReadDir(r.env.path(dir))
		switch {
		case os.IsNotExist(err):
			c.add("nothing pinned yet (%s does not exist)", dir)
		case err != nil:
			c.add("cannot list %s: %v", dir, err)
		default:
			var ns []string
			for _, n := range names {
				ns = append(ns, n.Name())
			}
			c.add("pinned: %s", strings.Join(ns, " "))
		}
		return c
	}
	v, err := r.env.InspectPins(r.env.path(dir))
	if err != nil {
		c.warn("Run gpufence status for the details; stop the agent and remove "+dir+" if the pins are stale.", "the pinned filter is unreadable: %v", err)
		return c
	}
	if len(v.Pins) == 0 {
		c.add("nothing pinned yet")
		return c
	}
	c.add("pinned: %s", strings.Join(v.Pins, " "))
	desc := fmt.Sprintf("mode %s, layout %d, %d policy entries", v.Mode, v.Version, len(v.Entries))
	if v.Link != nil {
		desc += fmt.Sprintf(", link %d on cgroup %d", v.Link.ID, v.Link.CgroupID)
	}
	if v.SlurmdLink != nil {
		desc += fmt.Sprintf(", link %d on slurmd's cgroup %d", v.SlurmdLink.ID, v.SlurmdLink.CgroupID)
	}
	c.add("filter: %s", desc)
	if v.SlurmdLink != nil && v.SlurmdLink.CgroupID == 0 {
		// systemd made slurmd.service again (a slurmd restart); the agent
		// re-attaches as it sees the new cgroup made.
		c.warn("Run gpufence status: if it still names no link on slurmd's cgroup, restart the agent (systemctl restart gpufence).",
			"the pinned link %d on slurmd's cgroup is defunct: that cgroup was removed (a slurmd restart under systemd); until the agent attaches to the new one, a process there that runs as a user (sbcast's child) is not narrowed", v.SlurmdLink.ID)
	}
	for _, e := range v.Errors {
		c.warn("Run gpufence status for the details.", "part of the pinned filter is unreadable: %s", e)
	}
	if v.Mode == devfilter.ModeScope && v.Link != nil && v.Link.CgroupID == 0 {
		// A link on a removed scope filters nothing: jobs in the scope
		// made since are not narrowed by it. The agent re-attaches before
		// it answers a step, so this is a failure, never a note.
		c.fail("Restart the agent (systemctl restart gpufence): it attaches the filter to the current scope before it answers a step.", "the pinned scope link %d is defunct: Slurm's scope was removed since, so the pinned filter guards no job", v.Link.ID)
	}
	return c
}
