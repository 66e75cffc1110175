// SPDX-License-Identifier: Apache-2.0

package gpulist

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxIndex bounds what a GPU list may name; a node has far fewer GPUs.
// The C plugin's GF_MAX_GPU_INDEX (spank/plugin/renumber.h) is the same.
const MaxIndex = 1023

// Parse parses a GPU index list in the one grammar gpufence accepts
// (docs/architecture.md, "GPU lists"): exactly what Slurm writes into
// SLURM_JOB_GPUS and SLURM_STEP_GPUS, decimal indices without sign, blank or
// leading zero, joined by commas, strictly ascending, each at most
// MaxIndex ("0,2"). The empty string is the empty list. Ranges, blanks,
// repeats and any other spelling are errors. The C plugin's
// gf_parse_gpu_list accepts the same language; both are tested against
// testdata/gpulist.txt.
func Parse(s string) ([]int, error) {
	out := []int{}
	if s == "" {
		return out, nil
	}
	prev := -1
	for rest, n := s, 1; ; n++ {
		entry, tail, more := strings.Cut(rest, ",")
		v, err := parseIndex(entry)
		if err != nil {
			return nil, fmt.Errorf("GPU list %s: entry %d %s %w", quoteShort(s), n, quoteShort(entry), err)
		}
		if v <= prev {
			return nil, fmt.Errorf("GPU list %s: entry %d is %d after %d (Slurm writes each GPU once, in ascending order)", quoteShort(s), n, v, prev)
		}
		out = append(out, v)
		prev = v
		if !more {
			return out, nil
		}
		rest = tail
	}
}

// parseIndex reads one index as Slurm prints it with "%d".
func parseIndex(s string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("is empty (a stray comma?)")
	}
	v := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("is not a decimal GPU index (no signs, blanks or ranges)")
		}
		if v <= MaxIndex {
			v = v*10 + int(c-'0')
		}
	}
	switch {
	case len(s) > 1 && s[0] == '0':
		return 0, fmt.Errorf("has a leading zero")
	case v > MaxIndex:
		return 0, fmt.Errorf("is above %d", MaxIndex)
	}
	return v, nil
}

// FormatGPUList renders ascending indices as Slurm does ("0,2"): the
// inverse of ParseGPUList.
func Format(gpus []int) string {
	parts := make([]string, len(gpus))
	for i, g := range gpus {
		parts[i] = strconv.Itoa(g)
	}
	return strings.Join(parts, ",")
}

// ParseGresIDX parses the index set of a GRES allocation as slurmctld
// prints it in `scontrol show job -d` ("GRES=gpu:4(IDX:0-2,5)") and in
// gres_detail of its JSON: Slurm's bit_fmt, maximal runs of consecutive
// indices, ascending, a run of one written as its index ("5") and a longer
// one as "first-last". This is not the environment's grammar (ParseGPUList):
// Slurm writes ranges only here. "" is the empty set.
func ParseIDX(s string) ([]int, error) {
	out := []int{}
	if s == "" {
		return out, nil
	}
	prev := -2
	for rest, n := s, 1; ; n++ {
		item, tail, more := strings.Cut(rest, ",")
		lo, hi, isRange := strings.Cut(item, "-")
		a, err := parseIndex(lo)
		b := a
		if err == nil && isRange {
			b, err = parseIndex(hi)
			if err == nil && b <= a {
				err = fmt.Errorf("is not an ascending range of two or more")
			}
		}
		if err != nil {
			return nil, fmt.Errorf("GRES index set %s: item %d %s %w", quoteShort(s), n, quoteShort(item), err)
		}
		if a <= prev+1 {
			return nil, fmt.Errorf("GRES index set %s: item %d %s does not start above %d (Slurm writes maximal ascending runs)", quoteShort(s), n, quoteShort(item), prev+1)
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
		prev = b
		if !more {
			return out, nil
		}
		rest = tail
	}
}

// quoteShort quotes s for an error message, control bytes escaped and a
// long (hostile) value cut, so that neither reaches a terminal or a log raw.
func quoteShort(s string) string {
	const max = 40
	if len(s) > max {
		return strconv.Quote(s[:max]) + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return strconv.Quote(s)
}
