// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/slurm"
)

// atLeast reports whether v is release major.minor or newer.
func (v SlurmVersion) atLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// checkLayout checks Slurm's cgroup layout as this node's release makes it:
// where the slurmstepd scope is (CgroupSlice, Slurm 25.11), what it is named
// (<node>_slurmstepd.scope when Slurm is built with multiple-slurmd support,
// as Debian's is; else slurmstepd.scope), how job cgroups are named (the job's
// SLUID from 26.05, job_<id> before or with CgroupJobIdPaths=yes), and the
// cgroup.conf keys the release does not know (slurmd does not start) or
// dropped.
func (r *run) checkLayout() Check {
	c := newCheck("slurm-layout", "Slurm's cgroup layout for its release (scope, CgroupSlice, job cgroup names)")
	s := r.slurm
	switch {
	case s.Err != nil:
		c.skip("slurm.conf unreadable (see slurm-conf)")
		return c
	case s.CgroupErr != nil:
		c.skip("cgroup.conf unreadable (see slurm-cgroup)")
		return c
	case !r.haveSlurm:
		c.skip("Slurm's release is unknown (see slurm-plugin): its layout is not checked")
		return c
	}
	v := r.slurmV
	c.add("Slurm %s", v)

	if _, ok := get(s.CgroupLines, "CgroupAutomount"); ok && v.atLeast(23, 11) {
		c.warn("Remove CgroupAutomount from "+s.Cgroup+".",
			"cgroup.conf sets CgroupAutomount, which Slurm 23.11 removed: slurmd logs an error for it at every start")
	}
	slice, hasSlice := get(s.CgroupLines, "CgroupSlice")
	if hasSlice && !v.atLeast(25, 11) {
		c.fail("Remove CgroupSlice from "+s.Cgroup+" (Slurm 25.11 added it), or upgrade Slurm.",
			"cgroup.conf sets CgroupSlice=%s, which Slurm %s does not know: slurmd cannot parse cgroup.conf and does not start", slice, v.Release())
	}
	jip, hasJIP := get(s.CgroupLines, "CgroupJobIdPaths")
	if hasJIP && !(v.atLeast(26, 6) || (v.Major == 26 && v.Minor == 5 && v.Micro >= 2)) {
		c.fail("Remove CgroupJobIdPaths from "+s.Cgroup+" (Slurm 26.05.2 added it), or upgrade Slurm.",
			"cgroup.conf sets CgroupJobIdPaths, which Slurm %s does not know: slurmd cannot parse cgroup.conf and does not start", v)
	}
	if !hasSlice || !v.atLeast(25, 11) {
		slice = "system.slice"
	}
	slice = strings.Trim(slice, "/")

	mount, ok := get(s.CgroupLines, "CgroupMountpoint")
	if !ok {
		mount = "/sys/fs/cgroup"
		for _, m := range r.mounts {
			if m.FSType == "cgroup2" {
				mount = m.MountPoint
				break
			}
		}
	}
	mount = filepath.Clean(mount)
	node := r.env.Config.NodeName
	want := []string{
		filepath.Join(mount, slice, node+"_slurmstepd.scope"),
		filepath.Join(mount, slice, "slurmstepd.scope"),
	}
	c.add("slurmd makes its scope at %s (built with multiple-slurmd support, as Debian's packages are) or %s", want[0], want[1])

	// The agent's own rule (jobcgroup.Find): only where slurmd makes it,
	// root's, holding Slurm's processes; a cgroup bearing the name
	// anywhere else is not Slurm's.
	cfgScope := r.env.Config.Scope
	where := r.where(mount, node, slice)
	auto := jobcgroup.Find(where)
	found := auto
	if cfgScope != "" {
		// The processes the first look listed prove the configured scope too.
		where.Configured = r.cfgPath(cfgScope)
		where.Procs = func() ([]jobcgroup.Proc, error) { return auto.Procs, nil }
		found = jobcgroup.Find(where)
	}
	var ignored []string
	unroot := func(s string) string {
		if r.env.Root == "" || r.env.Root == "/" {
			return s
		}
		return strings.ReplaceAll(s, filepath.Clean(r.env.Root), "")
	}
	for _, cand := range auto.Candidates {
		line := r.nodePath(cand.Path)
		if cand.Proof != "" {
			line += " (" + cand.Proof + ")"
		}
		if cand.Refused != "" {
			line += ": " + unroot(cand.Refused)
			if !cand.Expected {
				ignored = append(ignored, r.nodePath(cand.Path))
			}
		}
		c.add("cgroup named like Slurm's scope: %s", line)
	}
	pidFile, _ := get(s.Lines, "SlurmdPidFile")
	if sd, err := found.Slurmd(r.env.path(mount), r.env.path(slurm.Settings{SlurmdPidFile: pidFile}.SlurmdPid(node))); err != nil {
		c.warn("Check SlurmdPidFile in slurm.conf: the agent takes this node's slurmd from it.", "%s", unroot(err.Error()))
	} else if sd != "" {
		c.add("slurmd runs in %s, outside the scope (systemd's unit): the agent attaches the filter there too, every GPU for root only (its sbcast child runs as the user)", r.nodePath(sd))
	}
	inSlice := r.nodePath(auto.Scope)
	picked := r.nodePath(found.Scope)
	switch {
	case found.Err != nil:
		c.fail("Remove the cgroup that is not Slurm's scope (stop its processes first), or set scope in /etc/gpufence/agent.yaml to the one slurmd made: the agent attaches to neither and refuses GPU steps outside the scope it is on.",
			"%s", unroot(found.Err.Error()))
	case cfgScope != "" && picked == "":
		c.fail("Set scope in /etc/gpufence/agent.yaml to the scope slurmd made, or remove it: the agent finds the scope itself.",
			"the configured scope %s does not exist", cfgScope)
	case cfgScope != "" && inSlice != "" && cfgScope != inSlice:
		c.warn("Remove scope from /etc/gpufence/agent.yaml (the agent finds Slurm's scope itself), or set it to "+inSlice+".",
			"the configured scope %s is not the one Slurm %s uses here, %s", cfgScope, v.Release(), inSlice)
	case picked == "" && otherNode(auto) != "":
		c.warn("Set node_name in /etc/gpufence/agent.yaml to slurmd's node name (slurmd -N), or set scope to "+r.nodePath(otherNode(auto))+".",
			"no scope for node_name %s, but %s, named for another node: the agent takes only its own node's scope", node, r.nodePath(otherNode(auto)))
	case picked == "" && len(ignored) > 0 && len(ignored) == len(auto.Candidates) && !inUserSubtree(where.Mount, auto):
		c.warn(fmt.Sprintf("Stop the slurmstepds of %s and restart slurmd, which then makes its scope in %s (see CgroupSlice in cgroup.conf(5)).", strings.Join(ignored, " "), slice),
			"no scope in %s, the slice this cgroup.conf gives, but %s: a scope left from before CgroupSlice changed", filepath.Join(mount, slice), strings.Join(ignored, " "))
	case picked == "":
		c.info("no slurmstepd scope yet: slurmd makes one at its start")
	}
	if len(ignored) > 0 && found.Err == nil && picked != "" {
		c.warn("Find who made "+strings.Join(ignored, " ")+" (its owner) and remove it; the agent ignores it.",
			"%d cgroup(s) named like Slurm's scope that are not Slurm's: %s", len(ignored), strings.Join(ignored, " "))
	}

	switch {
	case v.atLeast(26, 5) && strings.EqualFold(jip, "yes"):
		c.add("job cgroups are job_<id> (CgroupJobIdPaths=yes)")
	case v.atLeast(26, 5):
		c.add("job cgroups are named by the job's SLUID (e.g. %s/sEKNKTV3WPV500/step_0); gpufence places each step by its processes' own cgroups, never by a name made from the job id, so both namings work", want[1])
	default:
		c.add("job cgroups are job_<id>")
	}
	if cd, _ := get(s.CgroupLines, "ConstrainDevices"); strings.EqualFold(cd, "yes") && v.atLeast(25, 5) {
		c.add("ConstrainDevices=yes: Slurm %s fails a step whose own device program cannot be attached; gpufence's filter on the scope (a multi-attach link) never stops Slurm's attaching below it", v.Release())
	}
	if c.Verdict == "" {
		where := inSlice
		if where == "" {
			where = filepath.Join(mount, slice)
		}
		c.ok("layout of Slurm %s: scope %s%s", v.Release(), where, map[bool]string{true: ", job cgroups by SLUID", false: ""}[v.atLeast(26, 5) && !strings.EqualFold(jip, "yes")])
	}
	return c
}

// nodePath turns a path below Root back into the node's path.
func (r *run) nodePath(p string) string {
	if r.env.Root == "" || r.env.Root == "/" {
		return p
	}
	if rel, err := filepath.Rel(filepath.Clean(r.env.Root), p); err == nil && !strings.HasPrefix(rel, "..") {
		return "/" + rel
	}
	return p
}

// cfgPath maps a configured node path below Root ("" stays "").
func (r *run) cfgPath(p string) string {
	if p == "" {
		return ""
	}
	return r.env.path(p)
}

// where is where slurmd makes its scope on the node doctor looks at. On a
// fixture (Root set) the slice is found below Root, owned by the fixture's
// admin, and no Slurm process is known.
func (r *run) where(mount, node, slice string) jobcgroup.Where {
	w := jobcgroup.Where{Mount: r.env.path(mount), Node: node, Slice: slice}
	if r.env.Root != "" && r.env.Root != "/" {
		w.Base = w.Mount
		w.Procs = func() ([]jobcgroup.Proc, error) { return nil, nil }
		var st syscall.Stat_t
		if syscall.Stat(r.env.Root, &st) == nil {
			w.Owner = st.Uid
		}
	}
	return w
}

// otherNode is a scope in the slice slurmd uses named for another node
// (node_name differs from slurmd's), "" if none.
func otherNode(f jobcgroup.Found) string {
	if len(f.Expected) == 0 {
		return ""
	}
	for _, c := range f.Candidates {
		if !c.Expected && filepath.Dir(c.Path) == filepath.Dir(f.Expected[0]) && strings.HasSuffix(c.Path, "_slurmstepd.scope") {
			return c.Path
		}
	}
	return ""
}

// inUserSubtree reports whether a cgroup named like a scope lies in a
// user's delegated subtree: never a scope left by Slurm.
func inUserSubtree(mount string, f jobcgroup.Found) bool {
	for _, c := range f.Candidates {
		if rel, err := filepath.Rel(mount, c.Path); err == nil && jobcgroup.UserSubtree(rel) != "" {
			return true
		}
	}
	return false
}
