// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpufence/gpufence/agent/jobcgroup"
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

	var found []string
	for _, p := range jobcgroup.FindScopes(r.env.path(mount)) {
		found = append(found, r.nodePath(p))
	}
	picked := ""
	cfgScope := r.env.Config.Scope
	if p := jobcgroup.FindScope(r.env.path(mount), r.cfgPath(cfgScope), node); p != "" {
		picked = r.nodePath(p)
	}
	if len(found) > 0 {
		c.add("slurmstepd scopes here: %s", strings.Join(found, " "))
	}
	// The scope in the slice: this node's name or the plain one first,
	// else one named for another node name (node_name differs from
	// slurmd's).
	inSlice := ""
	for _, f := range found {
		if filepath.Dir(f) == filepath.Join(mount, slice) && (inSlice == "" || f == want[0] || f == want[1]) {
			inSlice = f
		}
	}
	switch {
	case cfgScope != "" && picked == "":
		c.fail("Set scope in /etc/gpufence/agent.yaml to the scope slurmd made, or remove it: the agent finds the scope itself.",
			"the configured scope %s does not exist", cfgScope)
	case cfgScope != "" && inSlice != "" && cfgScope != inSlice:
		c.warn("Remove scope from /etc/gpufence/agent.yaml (the agent finds Slurm's scope itself), or set it to "+inSlice+".",
			"the configured scope %s is not the one Slurm %s uses here, %s", cfgScope, v.Release(), inSlice)
	case len(found) == 0:
		c.info("no slurmstepd scope yet: slurmd makes one at its start")
	case inSlice == "":
		c.warn(fmt.Sprintf("Stop the slurmstepds of %s and restart slurmd, which then makes its scope in %s (see CgroupSlice in cgroup.conf(5)).", strings.Join(found, " "), slice),
			"no scope in %s, the slice this cgroup.conf gives, but %s: a scope left from before CgroupSlice changed", filepath.Join(mount, slice), strings.Join(found, " "))
	case picked != inSlice:
		c.warn("Set scope: "+inSlice+" in /etc/gpufence/agent.yaml (node_name does not say which scope is this node's).",
			"several scopes (%s): the agent would take %q, not %s", strings.Join(found, " "), picked, inSlice)
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
