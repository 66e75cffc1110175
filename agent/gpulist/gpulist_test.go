// SPDX-License-Identifier: Apache-2.0

package gpulist

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/gpulist/gpulisttest"
)

// gpuListTable is the table the C plugin's parser is tested against too
// (spank/internal/cparse).
const gpuListTable = "testdata/gpulist.txt"

func TestParseGPUListTable(t *testing.T) {
	cases, err := gpulisttest.GPUListCases(gpuListTable)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		got, err := Parse(c.Input)
		switch {
		case c.OK && err != nil:
			t.Errorf("gpulist.txt:%d: Parse(%q): %v, want %v", c.Line, c.Input, err, c.Want)
		case c.OK && !slices.Equal(got, c.Want):
			t.Errorf("gpulist.txt:%d: Parse(%q) = %v, want %v", c.Line, c.Input, got, c.Want)
		case !c.OK && err == nil:
			t.Errorf("gpulist.txt:%d: Parse(%q) = %v, want an error", c.Line, c.Input, got)
		}
	}
}

func TestParseGPUListErrors(t *testing.T) {
	long := strings.Repeat("1", 5000)
	tests := []struct{ in, want string }{
		{"0-3", `entry 1 "0-3" is not a decimal GPU index`},
		{"1, 3", `entry 2 " 3" is not a decimal GPU index`},
		{"3,1", "entry 2 is 1 after 3 (Slurm writes each GPU once, in ascending order)"},
		{"1,1", "entry 2 is 1 after 1"},
		{"01", `entry 1 "01" has a leading zero`},
		{"1024", `entry 1 "1024" is above 1023`},
		{"0,,1", `entry 2 "" is empty`},
		{"\x1b[2J", `"\x1b[2J"`},
		{long, `... (5000 bytes)`},
	}
	for _, tt := range tests {
		_, err := Parse(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) error %v, want containing %q", tt.in, err, tt.want)
		}
		if err != nil && (strings.ContainsRune(err.Error(), 0x1b) || len(err.Error()) > 300) {
			t.Errorf("Parse(%.20q): error %.40q... has a control byte or is %d bytes", tt.in, err, len(err.Error()))
		}
	}
}

func TestParseGresIDX(t *testing.T) {
	tests := []struct {
		in   string
		want []int // nil: an error
	}{
		{"", []int{}},
		{"0", []int{0}},
		{"0-1", []int{0, 1}},
		{"0-2,5", []int{0, 1, 2, 5}},
		{"0,2", []int{0, 2}},
		{"1,3-4,7-9", []int{1, 3, 4, 7, 8, 9}},
		{"0-1023", nil}, // 1023 is fine, see below
		{"1023", []int{1023}},
		{"0,1", nil},   // Slurm writes 0-1
		{"0-1,2", nil}, // and 0-2
		{"2,0", nil},
		{"0-2,1", nil},
		{"3-1", nil},
		{"3-3", nil},
		{"0-1024", nil},
		{"0- 1", nil},
		{" 0", nil},
		{"0,", nil},
		{"-1", nil},
		{"1-", nil},
		{"1-2-3", nil},
		{"01", nil},
		{"N/A", nil},
		{"0x1", nil},
	}
	for _, tt := range tests {
		got, err := ParseIDX(tt.in)
		if tt.in == "0-1023" {
			if err != nil || len(got) != 1024 {
				t.Errorf("ParseIDX(0-1023) = %d indices, %v; want 1024", len(got), err)
			}
			continue
		}
		if tt.want == nil {
			if err == nil {
				t.Errorf("ParseIDX(%q) = %v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseIDX(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tt := range []struct {
		in        []int
		list, idx string
	}{
		{[]int{}, "", ""},
		{[]int{0}, "0", "0"},
		{[]int{0, 1}, "0,1", "0-1"},
		{[]int{0, 1, 2, 5, 7, 8}, "0,1,2,5,7,8", "0-2,5,7-8"},
	} {
		if got := Format(tt.in); got != tt.list {
			t.Errorf("Format(%v) = %q, want %q", tt.in, got, tt.list)
		}
		if got := formatGresIDX(tt.in); got != tt.idx {
			t.Errorf("formatGresIDX(%v) = %q, want %q", tt.in, got, tt.idx)
		}
	}
}

// FuzzParseGPUList: the grammar has one spelling per list, so whatever
// parses formats back to exactly its input; any list formats to a string
// that parses back to it; and the result is bounded by the grammar, not by
// the input's length.
func FuzzParseGPUList(f *testing.F) {
	cases, err := gpulisttest.GPUListCases(gpuListTable)
	if err != nil {
		f.Fatal(err)
	}
	for _, c := range cases {
		f.Add(c.Input)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := Parse(s)
		if err != nil {
			if got != nil {
				t.Fatalf("Parse(%q) gave %v with error %v", s, got, err)
			}
			if len(err.Error()) > 512 {
				t.Fatalf("Parse(%.40q...): error of %d bytes", s, len(err.Error()))
			}
			return
		}
		if len(got) > MaxIndex+1 {
			t.Fatalf("ParseGPUList gave %d indices", len(got))
		}
		if back := Format(got); back != s {
			t.Fatalf("Parse(%q) = %v, formats back to %q", s, got, back)
		}
		checkSet(t, got)
		if idx, err := ParseIDX(formatGresIDX(got)); err != nil || !slices.Equal(idx, got) {
			t.Fatalf("GRES IDX round trip of %v: %v, %v", got, idx, err)
		}
	})
}

// FuzzParseGresIDX: the same properties for slurmctld's range notation.
func FuzzParseGresIDX(f *testing.F) {
	for _, s := range []string{"", "0", "0-1", "0-2,5", "1,3-4,7-9", "0-1023", "0,1", "3-1", "N/A", "0-1,2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseIDX(s)
		if err != nil {
			if got != nil {
				t.Fatalf("ParseIDX(%q) gave %v with error %v", s, got, err)
			}
			return
		}
		if back := formatGresIDX(got); back != s {
			t.Fatalf("ParseIDX(%q) = %v, formats back to %q", s, got, back)
		}
		checkSet(t, got)
		if list, err := Parse(Format(got)); err != nil || !slices.Equal(list, got) {
			t.Fatalf("GPU list round trip of %v: %v, %v", got, list, err)
		}
	})
}

// checkSet fails unless gpus is strictly ascending within the bounds.
func checkSet(t *testing.T, gpus []int) {
	t.Helper()
	for i, g := range gpus {
		if g < 0 || g > MaxIndex || (i > 0 && g <= gpus[i-1]) {
			t.Fatalf("%v: not strictly ascending within 0..%d", gpus, MaxIndex)
		}
	}
}

// formatGresIDX renders ascending indices as Slurm's bit_fmt does
// ("0-2,5"): the inverse of ParseGresIDX.
func formatGresIDX(gpus []int) string {
	var b strings.Builder
	for i := 0; i < len(gpus); {
		j := i
		for j+1 < len(gpus) && gpus[j+1] == gpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(gpus[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(gpus[j]))
		}
		i = j + 1
	}
	return b.String()
}
