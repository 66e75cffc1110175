// SPDX-License-Identifier: Apache-2.0

// Package gpulisttest reads the table of GPU list cases
// (agent/gpulist/testdata/gpulist.txt) for the tests of both parsers of that
// grammar: Go's gpulist.Parse and the C plugin's (through
// spank/internal/cparse). Only tests import it.
package gpulisttest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// GPUListCase is one line of the table.
type GPUListCase struct {
	Line  int
	Input string
	OK    bool
	// Want is the parsed list when OK: ascending indices.
	Want []int
}

// GPUListCases reads the table at path (relative to a test's package:
// testdata/gpulist.txt from agent/gpulist). The expected lists are written
// out in the table, never derived from the input.
func GPUListCases(path string) ([]GPUListCase, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cases []GPUListCase
	for i, line := range strings.Split(string(data), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		quoted, want, ok := strings.Cut(line, "\t")
		if !ok {
			return nil, fmt.Errorf("gpulist.txt:%d: no tab", i+1)
		}
		in, err := strconv.Unquote(quoted)
		if err != nil {
			return nil, fmt.Errorf("gpulist.txt:%d: input %s: %w", i+1, quoted, err)
		}
		c := GPUListCase{Line: i + 1, Input: in}
		switch {
		case want == "error":
		case want == "ok":
			c.OK, c.Want = true, []int{}
		case strings.HasPrefix(want, "ok "):
			c.OK, c.Want = true, []int{}
			for _, f := range strings.Split(want[3:], ",") {
				v, err := strconv.Atoi(f)
				if err != nil {
					return nil, fmt.Errorf("gpulist.txt:%d: want %q: %w", i+1, want, err)
				}
				c.Want = append(c.Want, v)
			}
		default:
			return nil, fmt.Errorf("gpulist.txt:%d: want %q, not ok LIST or error", i+1, want)
		}
		cases = append(cases, c)
	}
	if len(cases) == 0 {
		return nil, fmt.Errorf("gpulist.txt has no cases")
	}
	return cases, nil
}
