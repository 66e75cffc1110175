// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// slurmFacts is what slurm.conf and cgroup.conf say.
type slurmFacts struct {
	// Conf is slurm.conf as the node names it; Err why it could not be read.
	Conf  string
	Err   error
	Lines []slurm.Line
	// Cgroup is cgroup.conf beside slurm.conf; CgroupLines nil and
	// CgroupMissing true when it does not exist.
	Cgroup        string
	CgroupLines   []slurm.Line
	CgroupMissing bool
	CgroupErr     error
}

// get returns the last value of key, as Slurm lets a later line win.
func get(lines []slurm.Line, key string) (string, bool) {
	v, found := "", false
	for _, l := range lines {
		if s, ok := l.Get(key); ok {
			v, found = s, true
		}
	}
	return v, found
}

func readSlurm(e *Env) slurmFacts {
	f := slurmFacts{Conf: e.Config.SlurmConf}
	// Includes in slurm.conf are followed on the node's own paths; fixtures
	// use relative includes.
	f.Lines, f.Err = slurm.ReadLines(e.path(f.Conf))
	f.Cgroup = filepath.Join(filepath.Dir(f.Conf), "cgroup.conf")
	f.CgroupLines, f.CgroupErr = slurm.ReadLines(e.path(f.Cgroup))
	if errors.Is(f.CgroupErr, os.ErrNotExist) {
		f.CgroupMissing, f.CgroupErr = true, nil
	}
	return f
}

// otherSlurmConfs are where slurm.conf lives on other installs, for the fix.
var otherSlurmConfs = []string{
	"/etc/slurm/slurm.conf", "/opt/slurm/etc/slurm.conf", "/etc/slurm-llnl/slurm.conf",
	"/usr/local/etc/slurm.conf", "/run/slurm/conf/slurm.conf", "/var/spool/slurmd/conf-cache/slurm.conf",
}

func (r *run) checkSlurmConf() Check {
	c := newCheck("slurm-conf", "Slurm configuration of this node")
	s := r.slurm
	if s.Err != nil {
		fix := "Set slurm_conf in /etc/gpufence/agent.yaml (or SLURM_CONF) to this node's slurm.conf."
		for _, o := range otherSlurmConfs {
			if o != s.Conf && r.env.exists(o) {
				fix = fmt.Sprintf("Set slurm_conf: %s in /etc/gpufence/agent.yaml (found there).", o)
				break
			}
		}
		c.fail(fix, "cannot read slurm.conf %s: %v", s.Conf, unwrapPath(s.Err, r.env))
		return c
	}
	cluster, _ := get(s.Lines, "ClusterName")
	c.add("slurm.conf: %s (%d settings lines)", s.Conf, len(s.Lines))
	node := r.env.Config.NodeName
	var nodes []string
	found := false
	for _, l := range s.Lines {
		v, ok := l.Get("NodeName")
		if !ok || strings.EqualFold(v, "DEFAULT") {
			continue
		}
		nodes = append(nodes, v)
		if names, err := slurm.ExpandHostlist(v); err == nil {
			for _, n := range names {
				found = found || n == node
			}
		}
	}
	switch {
	case found:
		c.ok("cluster %q, node %s is a NodeName in slurm.conf", cluster, node)
	case len(nodes) == 0:
		c.info("cluster %q; slurm.conf names no nodes (configless or included elsewhere): node_name %s not checked", cluster, node)
	default:
		c.add("NodeName lines: %s", strings.Join(nodes, " "))
		c.warn("Set node_name in /etc/gpufence/agent.yaml to the name slurmd runs as (slurmd -N); ignore this on a login node.",
			"node_name %s is not among slurm.conf's nodes: gres.conf lines for this node will not match", node)
	}
	return c
}

// unwrapPath turns an error about a path below Root back into the node's
// path, so the report names what an administrator sees.
func unwrapPath(err error, e *Env) string {
	s := err.Error()
	if e.Root != "" && e.Root != "/" {
		s = strings.ReplaceAll(s, filepath.Clean(e.Root), "")
	}
	return s
}

func (r *run) checkSlurmCgroup() Check {
	c := newCheck("slurm-cgroup", "Slurm's cgroup settings (ConstrainDevices, CgroupPlugin, ProctrackType, TaskPlugin)")
	s := r.slurm
	if s.Err != nil {
		c.skip("slurm.conf unreadable (see slurm-conf)")
		return c
	}
	if s.CgroupErr != nil {
		c.fail("Fix cgroup.conf: slurmd does not start with a broken one.", "cannot read %s: %v", s.Cgroup, unwrapPath(s.CgroupErr, r.env))
		return c
	}
	if s.CgroupMissing {
		c.add("no %s: Slurm's defaults apply", s.Cgroup)
	}

	proctrack, ok := get(s.Lines, "ProctrackType")
	if !ok {
		proctrack = "proctrack/cgroup"
		c.add("ProctrackType unset: Slurm's default proctrack/cgroup")
	} else {
		c.add("ProctrackType=%s", proctrack)
	}
	task, ok := get(s.Lines, "TaskPlugin")
	if ok {
		c.add("TaskPlugin=%s", task)
	} else {
		c.add("TaskPlugin unset: Slurm's default (no task/cgroup)")
	}
	cgPlugin, ok := get(s.CgroupLines, "CgroupPlugin")
	if !ok {
		cgPlugin = "autodetect"
	}
	mp, ok := get(s.CgroupLines, "CgroupMountpoint")
	if !ok {
		mp = "/sys/fs/cgroup"
	}
	c.add("CgroupPlugin=%s, CgroupMountpoint=%s", cgPlugin, mp)
	cd, _ := get(s.CgroupLines, "ConstrainDevices")
	constrain := strings.EqualFold(cd, "yes")

	if !strings.EqualFold(proctrack, "proctrack/cgroup") {
		c.fail("Set ProctrackType=proctrack/cgroup in slurm.conf and restart Slurm.",
			"ProctrackType=%s: gpufence needs proctrack/cgroup so that every step has its own cgroup v2 directory", proctrack)
	}
	switch v := strings.ToLower(cgPlugin); v {
	case "cgroup/v2":
	case "autodetect":
		if m, found := mountOf(r.mounts, mp); r.mountsErr == nil && (!found || m.FSType != "cgroup2" || filepath.Clean(m.MountPoint) != filepath.Clean(mp)) {
			c.fail("Set CgroupPlugin=cgroup/v2 in cgroup.conf (and CgroupMountpoint to the cgroup2 mount) and restart slurmd.",
				"CgroupPlugin=autodetect picks cgroup/v1 here: %s is not a cgroup2 mount", mp)
		}
	default:
		c.fail("Set CgroupPlugin=cgroup/v2 in cgroup.conf and restart slurmd.", "CgroupPlugin=%s: gpufence needs Slurm's cgroup/v2 plugin", cgPlugin)
	}
	if !strings.Contains(task, "task/cgroup") {
		c.warn("Add task/cgroup to TaskPlugin in slurm.conf (e.g. TaskPlugin=task/affinity,task/cgroup) and restart Slurm.",
			"TaskPlugin without task/cgroup: tasks are not placed in their step's task cgroups")
	}
	if constrain {
		if strings.Contains(task, "cgroup") {
			c.add("Slurm numbers CUDA_VISIBLE_DEVICES locally itself, so the plugin leaves it as it is")
		}
		if r.mode == devfilter.ModePerCgroup {
			c.warn("Use scope mode (mode: auto on a kernel that offers bpf_get_current_ancestor_cgroup_id to device programs), or ConstrainDevices=no.",
				"ConstrainDevices=yes with per-cgroup mode: Slurm's own device programs on the job and step cgroups make any other attach there fail (EPERM); only scope mode runs alongside them")
		}
		c.ok("ConstrainDevices=yes, noted as compatible: Slurm's device program and gpufence's (attached on the scope above it) must both allow an access")
	} else {
		c.ok("ConstrainDevices=%s: gpufence is the device isolation", orDefault(cd, "no (default)"))
	}
	return c
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

var nvidiaDev = regexp.MustCompile(`/nvidia([0-9]+)$`)

func (r *run) checkGres() Check {
	c := newCheck("gres", "gres.conf against the device nodes")
	if r.slurm.Err != nil {
		c.skip("slurm.conf unreadable (see slurm-conf)")
		return c
	}
	gres := filepath.Join(filepath.Dir(r.slurm.Conf), "gres.conf")
	node := r.env.Config.NodeName
	major, majorSrc := r.env.Config.NvidiaMajor, "nvidia_major in the configuration"
	var capsMajor uint32
	driver := false
	if b, err := os.ReadFile(r.env.path("/proc/devices")); err == nil {
		if m, err := devices.CharMajors(strings.NewReader(string(b))); err == nil {
			for _, n := range []string{"nvidia-frontend", "nvidia"} {
				if v, ok := m[n]; ok {
					driver = true
					if major == 0 {
						major, majorSrc = v, n+" in /proc/devices"
					}
					break
				}
			}
			capsMajor = m["nvidia-caps"]
		}
	}
	if major == 0 {
		major, majorSrc = devices.DefaultNvidiaMajor, "the default (no NVIDIA driver in /proc/devices)"
	}
	c.add("NVIDIA major %d, from %s", major, majorSrc)
	if capsMajor != 0 {
		c.add("nvidia-caps major %d, from /proc/devices", capsMajor)
	}
	gpus, err := slurm.ReadGresGPUs(r.env.path(gres), node)
	switch {
	case errors.Is(err, os.ErrNotExist):
		c.info("no %s: no GPU configured, every job gets no GPU", gres)
		return c
	case errors.Is(err, slurm.ErrNoGPUs):
		if lines, lerr := slurm.ReadLines(r.env.path(gres)); lerr == nil {
			if v, ok := get(lines, "AutoDetect"); ok && !strings.EqualFold(v, "off") {
				c.warn("List the GPUs with File= lines in gres.conf (AutoDetect may stay on).",
					"gres.conf sets AutoDetect=%s but lists no File= GPU for node %s: GPUs that only autodetection finds are unknown to gpufence and jobs given one are refused", v, node)
				return c
			}
		}
		c.info("no GPU with File= in %s for node %s: every job gets no GPU", gres, node)
		return c
	case err != nil:
		c.fail("Fix gres.conf: the agent does not start with this error.", "%s", unwrapPath(err, r.env))
		return c
	}

	// Each file against its name: wrong ones first, they have the most
	// precise fix.
	var okPaths []string
	mig := 0
	for _, g := range gpus {
		files := g.Files
		if len(files) == 0 {
			files = []string{g.Path}
		}
		if g.MIG {
			mig++
		}
		for _, f := range files {
			if p, ok := r.checkDevFile(&c, g.Index, f, major, capsMajor, driver); ok {
				okPaths = append(okPaths, p)
			}
		}
	}
	// Then what the agent itself refuses (devices.Resolve, on the files
	// below Root): duplicates, MIG records, caps devices.
	mapped := make([]slurm.GPU, len(gpus))
	for i, g := range gpus {
		mapped[i] = g
		mapped[i].Path = r.env.path(g.Path)
		mapped[i].Files = nil
		for _, f := range g.Files {
			mapped[i].Files = append(mapped[i].Files, r.env.path(f))
		}
	}
	table, err := devices.Resolve(mapped, major, capsMajor)
	if err == nil {
		r.gresTable = table
	} else {
		c.fail("Fix gres.conf or the device nodes: the agent refuses to start with this GPU table.", "the agent refuses this GPU table: %s", unwrapPath(err, r.env))
	}

	if len(okPaths) > 0 {
		c.add("matching device nodes: %s", strings.Join(okPaths, " "))
	}
	if c.Verdict == "" {
		what := fmt.Sprintf("%d GPU(s)", len(gpus))
		if mig > 0 {
			what += fmt.Sprintf(" (%d MIG slices)", mig)
		}
		c.ok("%s for node %s in %s, each device node of the right major with the minor its name says", what, node, gres)
	}
	return c
}

var capsDev = regexp.MustCompile(`/nvidia-cap([0-9]+)$`)

// checkDevFile checks one file of a gres record against its name: a GPU
// /dev/nvidiaN is major:N, a MIG capability nvidia-capN is capsMajor:N.
func (r *run) checkDevFile(c *Check, index int, f string, major, capsMajor uint32, driver bool) (string, bool) {
	where := fmt.Sprintf("GPU %d %s", index, f)
	wantMajor, kind := major, "NVIDIA"
	m := nvidiaDev.FindStringSubmatch(f)
	if cm := capsDev.FindStringSubmatch(f); cm != nil {
		m, wantMajor, kind = cm, capsMajor, "nvidia-caps"
	}
	var st unix.Stat_t
	err := unix.Stat(r.env.path(f), &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		if m == nil {
			c.fail("Point File= at the NVIDIA device nodes (/dev/nvidiaN).", "%s does not exist and its name does not give a minor", where)
			return "", false
		}
		hint := "the driver creates it on first use, e.g. through nvidia-modprobe"
		if !driver {
			hint = "no NVIDIA driver is loaded"
		}
		c.warn("Load the NVIDIA driver and create the device nodes (nvidia-smi or nvidia-modprobe -c N), or fix File= in gres.conf.",
			"%s does not exist (%s); the agent takes minor %s from the name", where, hint, m[1])
		return "", false
	case err != nil:
		c.fail("Make the device nodes readable to root.", "%s: %v", where, err)
		return "", false
	case st.Mode&unix.S_IFMT != unix.S_IFCHR:
		c.fail("Point File= at the NVIDIA character devices (/dev/nvidiaN).", "%s is not a character device", where)
		return "", false
	}
	maj, mnr := unix.Major(st.Rdev), unix.Minor(st.Rdev)
	bad := false
	if wantMajor != 0 && maj != wantMajor && (kind == "nvidia-caps" || maj != capsMajor || capsMajor == 0) {
		c.fail("Point File= at the NVIDIA GPU devices, or set nvidia_major to the driver's major.", "%s is device %d:%d, not the %s major %d", where, maj, mnr, kind, wantMajor)
		bad = true
	}
	if kind == "NVIDIA" && maj == major && mnr > devices.MaxGPUMinor {
		c.fail("List only GPU device nodes (/dev/nvidia0-253) in File=; nvidiactl and nvidia-modeset are not GPUs.", "%s has minor %d, above the GPU range 0-%d", where, mnr, devices.MaxGPUMinor)
		bad = true
	}
	if m != nil {
		if n, _ := strconv.ParseUint(m[1], 10, 32); uint32(n) != mnr {
			c.fail(fmt.Sprintf("Recreate the device node with the minor its name says (mknod %s c %d %s), or fix File=.", f, maj, m[1]),
				"%s has minor %d but its name says %s", where, mnr, m[1])
			bad = true
		}
	}
	if bad {
		return "", false
	}
	return fmt.Sprintf("%s=%d:%d", f, maj, mnr), true
}
