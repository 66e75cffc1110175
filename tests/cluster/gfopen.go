// SPDX-License-Identifier: Apache-2.0

package cluster

import "strings"

// OpenReport is the parsed output of tests/cmd/gf-open.
type OpenReport struct {
	Open   map[string]string // path -> OK, ENXIO, EPERM, … (last round wins)
	Env    map[string]string // only the variables that were set
	Unset  map[string]bool   // variables gf-open found unset
	Cgroup string            // the task's cgroup2 path, without "0::"
}

// ParseOpen parses gf-open's output; unknown lines (srun's own) are skipped.
func ParseOpen(out string) OpenReport {
	r := OpenReport{Open: map[string]string{}, Env: map[string]string{}, Unset: map[string]bool{}}
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "env "):
			kv := strings.TrimPrefix(l, "env ")
			if k, ok := strings.CutSuffix(kv, " (unset)"); ok {
				r.Unset[k] = true
			} else if k, v, ok := strings.Cut(kv, "="); ok {
				r.Env[k] = v
			}
		case strings.HasPrefix(l, "cgroup "):
			r.Cgroup = strings.TrimPrefix(strings.TrimPrefix(l, "cgroup "), "0::")
		case strings.HasPrefix(l, "/"):
			if p, res, ok := strings.Cut(l, " "); ok {
				r.Open[p] = res
			}
		}
	}
	return r
}
