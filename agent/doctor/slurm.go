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

	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/gputable"
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
	c := newCheck("gres", "Slurm's GPU table (slurmd -G, gres.conf) against the device nodes")
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
	conf, gerr := slurm.ReadGres(r.env.path(gres), node)
	gpus, done := r.gpuTable(&c, gres, conf, gerr)
	if done {
		return c
	}
	if gpus == nil {
		// slurmd -G not run: gres.conf alone, as the agent reads it then.
		gpus = conf.GPUs
		switch err := gerr; {
		case errors.Is(err, os.ErrNotExist):
			c.info("no %s: no GPU configured, every job gets no GPU", gres)
			return c
		case errors.Is(err, slurm.ErrNoGPUs):
			if v := conf.AutoDetect; v != "" {
				c.warn("Run gpufence doctor as root on the node itself (it runs slurmd -G, where the agent takes the table from), or list the GPUs with File= lines in gres.conf.",
					"gres.conf sets AutoDetect=%s but lists no File= GPU for node %s, and slurmd -G was not run: the agent's GPU table is slurmd's, not known here", v, node)
				return c
			}
			c.info("no GPU with File= in %s for node %s: every job gets no GPU", gres, node)
			return c
		case err != nil:
			c.fail("Fix gres.conf: the agent does not start with this error.", "%s", unwrapPath(err, r.env))
			return c
		}
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

// gpuTable asks slurmd for its GPU table (slurmd -G) as the agent does,
// chooses the agent's table as the agent does (gputable.Choose) and notes
// where it came from. It returns the table, nil when slurmd -G was not
// run (off, or not on this node), and done when the check is over.
func (r *run) gpuTable(c *Check, gres string, conf slurm.GresConf, gerr error) (gpus []slurm.GPU, done bool) {
	cfg := r.env.Config
	in := gputable.Input{GresConf: gres, Gres: conf, GresErr: gerr}
	switch {
	case cfg.SlurmdGPUTable == config.SlurmdGPUTableOff:
		c.add("slurmd_gpu_table is off: the agent's GPU table is gres.conf's alone")
		return nil, false
	case r.env.SlurmdG == nil:
		c.add("slurmd -G not run (%s): gres.conf alone is checked", orDefault(r.env.SlurmdGSkip, "not asked"))
		return nil, false
	}
	in.Slurmd, in.SlurmdErr = r.env.SlurmdG(cfg.SlurmBinDir, cfg.SlurmConf, cfg.NodeName)
	gpus, o, err := gputable.Choose(in)
	if err != nil {
		c.fail("Fix gres.conf, or whatever stops slurmd -G (run it by hand to see): the agent does not start without a GPU table.", "%s", unwrapPath(err, r.env))
		return nil, true
	}
	if o.Slurmd != "" {
		c.add("ran %s (%s)", o.Slurmd, in.Slurmd.Took.Round(time.Millisecond))
	}
	c.add("the agent's GPU table: %s: %s", o.Source, o.Detail)
	for _, g := range gpus {
		c.add("GPU %d: %s%s", g.Index, strings.Join(g.Files, ","), map[bool]string{true: " (type " + g.Type + ")", false: ""}[g.Type != ""])
	}
	if cfg.SlurmdGPUTable == config.SlurmdGPUTableRequired && in.SlurmdErr != nil {
		c.fail("Fix what stops slurmd -G (run it by hand to see), or set slurmd_gpu_table: auto.", "slurmd_gpu_table is required and slurmd -G failed: %v", in.SlurmdErr)
		return nil, true
	}
	fix := map[string]string{
		"slurmd_failed":   fmt.Sprintf("Run slurmd -G -f %s -N %s by hand to see why it fails; set slurmd (its path) if this node's slurmd is elsewhere.", cfg.SlurmConf, cfg.NodeName),
		"sources_differ":  "Make gres.conf's File= lines name the devices in the order slurmd -G prints them (or use AutoDetect), and remove any fake_gpus.conf beside slurm.conf; then restart slurmd and the agent.",
		"slurmd_fewer":    "Make slurm.conf's Gres= count on this node's NodeName line match gres.conf.",
		"gres_unreadable": "Fix gres.conf so that gpufence can read it (the agent then cross-checks slurmd's table with it).",
	}[o.Kind]
	switch o.Severity {
	case gputable.SeverityError:
		c.fail(fix, "%s", o.Untrusted)
	case gputable.SeverityWarning:
		c.warn(fix, "%s", o.Detail)
	}
	if len(gpus) == 0 {
		c.info("no GPU in the agent's GPU table (%s) for node %s: every job gets no GPU", o.Source, cfg.NodeName)
		return nil, true
	}
	return gpus, false
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
