// SPDX-License-Identifier: Apache-2.0

package jobcgroup

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// maxScopeDepth is how deep below the cgroup v2 mount FindScopes looks for
// Slurm's scope: <mount>/<slice>/<scope> by default; a CgroupSlice (Slurm
// 25.11) or the cgroup of PID 1 (Slurm puts its slice beside PID 1's cgroup,
// e.g. in a container) adds levels.
const maxScopeDepth = 4

// FindScopes lists the directories under mount that are Slurm's slurmstepd
// scope (IsScopeName), at any slice up to maxScopeDepth levels down, sorted.
// It never descends into a scope: the job trees below are Slurm's.
func FindScopes(mount string) []string {
	var found []string
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		if depth > maxScopeDepth {
			return
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if IsScopeName(e.Name()) {
				found = append(found, p)
				continue
			}
			walk(p, depth+1)
		}
	}
	walk(mount, 1)
	sort.Strings(found)
	return found
}

// FindScope returns Slurm's slurmstepd scope on this node: the configured
// one (only if it exists), else, among the scopes under mount wherever
// Slurm's CgroupSlice put them, this node's own (<node>_slurmstepd.scope,
// Slurm built with multiple-slurmd support, as Debian's packages are), else
// the only slurmstepd.scope, else the only scope of any name. "" when there
// is none or the choice is not clear: the agent then takes the scope from
// the first step's own cgroup.
func FindScope(mount, configured, node string) string {
	if configured != "" {
		if fi, err := os.Stat(configured); err == nil && fi.IsDir() {
			return configured
		}
		return ""
	}
	all := FindScopes(mount)
	pick := func(match func(string) bool) (string, bool) {
		var m []string
		for _, s := range all {
			if match(filepath.Base(s)) {
				m = append(m, s)
			}
		}
		if len(m) == 1 {
			return m[0], true
		}
		return "", len(m) > 1
	}
	if node != "" {
		if s, _ := pick(func(n string) bool { return n == node+"_slurmstepd.scope" }); s != "" {
			return s
		}
	}
	if s, many := pick(func(n string) bool { return n == "slurmstepd.scope" }); s != "" || many {
		return s
	}
	if len(all) == 1 && strings.HasSuffix(all[0], "_slurmstepd.scope") {
		return all[0]
	}
	return ""
}
