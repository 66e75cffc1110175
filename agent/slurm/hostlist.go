// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"fmt"
	"strconv"
	"strings"
)

// Bounds of one host list expression, whatever its length: a node name or
// device file list is far smaller, and without them a short line
// ("n[0-65535],n[0-65535],…" or a long prefix) would expand to gigabytes.
const (
	maxHostlistNames = 1 << 16
	maxHostlistBytes = 4 << 20
)

// hostGroup is one top-level part of a host list: prefix, then one of the
// numbers of ranges, then suffix; no ranges for a plain name.
type hostGroup struct {
	prefix, suffix string
	ranges         []hostRange
}

// hostRange is lo..hi, printed zero-padded to width when width > 0.
type hostRange struct {
	lo, hi, width int
}

func (r hostRange) format(i int) string {
	return fmt.Sprintf("%0*d", r.width, i)
}

// ExpandHostlist expands Slurm's bracket notation ("node[1-3,7]",
// "/dev/nvidia[0-3]") into its members, in order, keeping leading zeros
// ("gpu[08-10]" gives gpu08 gpu09 gpu10). Top-level commas separate
// expressions. At most one bracket group per expression is supported, which is
// all gres.conf File= and NodeName= use in practice. An expression of more
// than 65536 names or 4 MiB is refused.
func ExpandHostlist(expr string) ([]string, error) {
	groups, err := parseHostlist(expr)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, g := range groups {
		if g.ranges == nil {
			out = append(out, g.prefix)
			continue
		}
		for _, r := range g.ranges {
			for i := r.lo; i <= r.hi; i++ {
				out = append(out, g.prefix+r.format(i)+g.suffix)
			}
		}
	}
	return out, nil
}

// hostlistContains reports whether name is a member of expr, as
// slices.Contains(ExpandHostlist(expr), name) would, without expanding it.
func hostlistContains(expr, name string) (bool, error) {
	groups, err := parseHostlist(expr)
	if err != nil {
		return false, err
	}
	for _, g := range groups {
		if g.ranges == nil {
			if name == g.prefix {
				return true, nil
			}
			continue
		}
		if len(name) < len(g.prefix)+len(g.suffix) || !strings.HasPrefix(name, g.prefix) || !strings.HasSuffix(name, g.suffix) {
			continue
		}
		num := name[len(g.prefix) : len(name)-len(g.suffix)]
		if !allDigits(num) || len(num) > 18 {
			continue
		}
		i, _ := strconv.Atoi(num)
		for _, r := range g.ranges {
			if r.lo <= i && i <= r.hi && r.format(i) == num {
				return true, nil
			}
		}
	}
	return false, nil
}

// parseHostlist checks expr and splits it into groups.
func parseHostlist(expr string) ([]hostGroup, error) {
	var groups []hostGroup
	names, size := 0, 0
	for _, part := range splitTopLevel(expr) {
		if part == "" {
			continue
		}
		open := strings.IndexByte(part, '[')
		if open < 0 {
			if strings.ContainsRune(part, ']') {
				return nil, fmt.Errorf("unbalanced ']' in %s", quoteShort(part))
			}
			names, size = names+1, size+len(part)
			if names > maxHostlistNames || size > maxHostlistBytes {
				return nil, tooLarge(expr)
			}
			groups = append(groups, hostGroup{prefix: part})
			continue
		}
		closing := strings.IndexByte(part[open:], ']')
		if closing < 0 {
			return nil, fmt.Errorf("missing ']' in %s", quoteShort(part))
		}
		closing += open
		g := hostGroup{prefix: part[:open], suffix: part[closing+1:]}
		body := part[open+1 : closing]
		if strings.ContainsRune(g.prefix, ']') {
			return nil, fmt.Errorf("unbalanced ']' in %s", quoteShort(part))
		}
		if strings.ContainsAny(g.suffix, "[]") {
			return nil, fmt.Errorf("more than one bracket group in %s is not supported", quoteShort(part))
		}
		for _, rng := range strings.Split(body, ",") {
			lo, hi, found := strings.Cut(rng, "-")
			if !found {
				hi = lo
			}
			// Digits only (Atoi alone takes a sign), and few enough that
			// Atoi cannot overflow.
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if !allDigits(lo) || !allDigits(hi) || len(lo) > 18 || len(hi) > 18 || err1 != nil || err2 != nil || b < a {
				return nil, fmt.Errorf("bad range %s in %s", quoteShort(rng), quoteShort(part))
			}
			r := hostRange{lo: a, hi: b}
			if len(lo) > 1 && lo[0] == '0' {
				r.width = len(lo)
			}
			// Count before expanding: b-a+1 names of at most the
			// longer of the widths.
			n := b - a + 1
			if n > maxHostlistNames-names {
				return nil, tooLarge(expr)
			}
			names += n
			size += n * (len(g.prefix) + len(g.suffix) + max(r.width, len(hi)))
			if size > maxHostlistBytes {
				return nil, tooLarge(expr)
			}
			g.ranges = append(g.ranges, r)
		}
		groups = append(groups, g)
	}
	return groups, nil
}

func tooLarge(expr string) error {
	return fmt.Errorf("host list %s expands to more than %d names or %d bytes", quoteShort(expr), maxHostlistNames, maxHostlistBytes)
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// quoteShort quotes s for a message, control bytes escaped and a long value
// cut.
func quoteShort(s string) string {
	const max = 80
	if len(s) > max {
		return strconv.Quote(s[:max]) + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return strconv.Quote(s)
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
