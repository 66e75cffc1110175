package slurm

import (
	"fmt"
	"strconv"
	"strings"
)

// ExpandHostlist expands Slurm's bracket notation ("node[1-3,7]",
// "/dev/nvidia[0-3]") into its members, in order, keeping leading zeros
// ("gpu[08-10]" gives gpu08 gpu09 gpu10). Top-level commas separate
// expressions. At most one bracket group per expression is supported, which is
// all gres.conf File= and NodeName= use in practice.
func ExpandHostlist(expr string) ([]string, error) {
	var out []string
	for _, part := range splitTopLevel(expr) {
		if part == "" {
			continue
		}
		open := strings.IndexByte(part, '[')
		if open < 0 {
			if strings.ContainsRune(part, ']') {
				return nil, fmt.Errorf("unbalanced ']' in %q", part)
			}
			out = append(out, part)
			continue
		}
		closing := strings.IndexByte(part[open:], ']')
		if closing < 0 {
			return nil, fmt.Errorf("missing ']' in %q", part)
		}
		closing += open
		prefix, body, suffix := part[:open], part[open+1:closing], part[closing+1:]
		if strings.ContainsAny(suffix, "[]") {
			return nil, fmt.Errorf("more than one bracket group in %q is not supported", part)
		}
		for _, rng := range strings.Split(body, ",") {
			lo, hi, found := strings.Cut(rng, "-")
			if !found {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a < 0 || b < a {
				return nil, fmt.Errorf("bad range %q in %q", rng, part)
			}
			if b-a > 1<<16 {
				return nil, fmt.Errorf("range %q in %q is too large", rng, part)
			}
			width := 0
			if len(lo) > 1 && lo[0] == '0' {
				width = len(lo)
			}
			for i := a; i <= b; i++ {
				out = append(out, fmt.Sprintf("%s%0*d%s", prefix, width, i, suffix))
			}
		}
	}
	return out, nil
}

// splitTopLevel splits on commas that are not inside brackets.
func splitTopLevel(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(parts, strings.TrimSpace(s[start:]))
}
