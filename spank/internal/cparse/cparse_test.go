// SPDX-License-Identifier: Apache-2.0

package cparse

import (
	"fmt"
	"github.com/gpufence/gpufence/agent/gpulist"
	"slices"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/gpulist/gpulisttest"
)

// gpuListTable is the table Go's gpulist.Parse is tested against.
const gpuListTable = "../../../agent/gpulist/testdata/gpulist.txt"

// allGPUs is 0..MaxGPUIndex: renumbering against it maps each index to
// itself, so it shows which values the plugin takes for index lists.
var allGPUs = func() []uint32 {
	g := make([]uint32, MaxGPUIndex+1)
	for i := range g {
		g[i] = uint32(i)
	}
	return g
}()

func TestMaxGPUIndex(t *testing.T) {
	if MaxGPUIndex != gpulist.MaxIndex {
		t.Fatalf("GF_MAX_GPU_INDEX is %d, gpulist.MaxIndex %d", MaxGPUIndex, gpulist.MaxIndex)
	}
}

// TestGPUListTable holds the C parser and the renumbering's choice of what
// to renumber to the table Go's parser is tested against.
func TestGPUListTable(t *testing.T) {
	cases, err := gpulisttest.GPUListCases(gpuListTable)
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, c := range cases {
		if strings.IndexByte(c.Input, 0) >= 0 {
			continue // C never sees past a NUL
		}
		ran++
		got, ok := ParseGPUList(c.Input, MaxGPUIndex+1)
		want := toU32(c.Want)
		switch {
		case ok != c.OK:
			t.Errorf("gpulist.txt:%d: gf_parse_gpu_list(%q) ok=%v %v, want ok=%v", c.Line, c.Input, ok, got, c.OK)
		case ok && !slices.Equal(got, want):
			t.Errorf("gpulist.txt:%d: gf_parse_gpu_list(%q) = %v, want %v", c.Line, c.Input, got, want)
		}
		r, out := Renumber(&c.Input, allGPUs, 0, 8192)
		wantR, wantOut := Keep, ""
		if c.OK && c.Input != "" {
			wantR, wantOut = Set, c.Input
		}
		if r != wantR || out != wantOut {
			t.Errorf("gpulist.txt:%d: gf_renumber(%q, 0..%d) = %v %q, want %v %q", c.Line, c.Input, MaxGPUIndex, r, out, wantR, wantOut)
		}
	}
	if ran < 50 {
		t.Fatalf("only %d cases of gpulist.txt ran", ran)
	}
}

func TestParseGPUListCapacity(t *testing.T) {
	if got, ok := ParseGPUList("0,1,2", 3); !ok || !slices.Equal(got, []uint32{0, 1, 2}) {
		t.Errorf("three entries, room for three: %v %v", got, ok)
	}
	if got, ok := ParseGPUList("0,1,2", 2); ok {
		t.Errorf("three entries, room for two: %v, want refused", got)
	}
	if got, ok := ParseGPUList("", 0); !ok || len(got) != 0 {
		t.Errorf("empty list, no room: %v %v", got, ok)
	}
}

func TestRenumber(t *testing.T) {
	str := func(s string) *string { return &s }
	tests := []struct {
		name  string
		value *string // nil: unset
		gpus  []uint32
		flags int
		want  string
	}{
		{"single GPU", str("2"), []uint32{2}, 0, "SET 0"},
		{"two GPUs", str("1,3"), []uint32{1, 3}, 0, "SET 0,1"},
		{"second of two", str("3"), []uint32{1, 3}, 0, "SET 1"},
		{"not allowed is dropped", str("0,3"), []uint32{1, 3}, 0, "SET 1"},
		{"nothing allowed", str("0"), nil, 0, "SET "},
		{"high indices", str("1022,1023"), []uint32{7, 1023}, 0, "SET 1"},
		// What Slurm sets under AutoDetect=nvml: left as it is.
		{"UUID untouched", str("GPU-8f6a1b2c-0000-1111-2222-333344445555"), []uint32{1}, 0, "KEEP"},
		{"MIG untouched", str("MIG-GPU-8f6a1b2c-0000-1111-2222-333344445555/1/0"), []uint32{1}, 0, "KEEP"},
		{"MIG UUID untouched", str("MIG-5f1c2d3e-4444-5555-6666-777788889999"), []uint32{1}, 0, "KEEP"},
		{"index and MIG untouched", str("0,MIG-5f1c2d3e-4444-5555-6666-777788889999"), []uint32{0, 1}, 0, "KEEP"},
		{"two MIG untouched", str("MIG-a/1/0,MIG-a/2/0"), []uint32{0, 1}, 0, "KEEP"},
		// Not Slurm's spelling of a list: left as it is.
		{"descending untouched", str("3,1"), []uint32{1, 3}, 0, "KEEP"},
		{"range untouched", str("0-1"), []uint32{0, 1}, 0, "KEEP"},
		{"space untouched", str("1, 3"), []uint32{1, 3}, 0, "KEEP"},
		{"leading zero untouched", str("01"), []uint32{1}, 0, "KEEP"},
		{"junk entry", str("1,x"), []uint32{1}, 0, "KEEP"},
		{"trailing comma", str("1,"), []uint32{1}, 0, "KEEP"},
		{"sign", str("-1"), []uint32{1}, 0, "KEEP"},
		{"overflow", str("4294967296"), []uint32{0}, 0, "KEEP"},
		{"above the grammar's bound", str("1024"), []uint32{1024}, 0, "KEEP"},
		{"Slurm already local", str("0"), []uint32{1}, SlurmLocal, "KEEP"},
		{"unset", nil, []uint32{1}, 0, "KEEP"},
		{"empty", str(""), []uint32{1}, 0, "KEEP"},
		{"list from env, all in it", str("1,3"), []uint32{1, 3}, ListFromEnv, "SET 0,1"},
		// Under ConstrainDevices=yes Slurm already wrote local indices; an
		// entry outside the global list shows the value is not global.
		{"list from env, local value", str("0"), []uint32{1}, ListFromEnv, "KEEP"},
		{"list from env, Slurm local wins", str("1"), []uint32{1}, ListFromEnv | SlurmLocal, "KEEP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, out := Renumber(tt.value, tt.gpus, tt.flags, 64)
			got := r.String()
			if r == Set {
				got += " " + out
			}
			if got != tt.want {
				t.Errorf("gf_renumber(%v, %v, %d) = %q, want %q", deref(tt.value), tt.gpus, tt.flags, got, tt.want)
			}
		})
	}
}

func TestRenumberBufferTooSmall(t *testing.T) {
	v := "0,1,2,3"
	for _, tt := range []struct {
		outlen int
		want   Result
	}{{0, Error}, {1, Error}, {7, Error}, {8, Set}} {
		if r, out := Renumber(&v, []uint32{0, 1, 2, 3}, 0, tt.outlen); r != tt.want || (r == Set && out != "0,1,2,3") {
			t.Errorf("outlen %d: %v %q, want %v", tt.outlen, r, out, tt.want)
		}
	}
}

func TestConfigParse(t *testing.T) {
	// golib= (the Go library of older versions) is ignored, whatever it says.
	cfg, err := ConfigParse([]string{"socket=/x/a.sock", "timeout=3", "golib=relative", "failure=open", "spool=/x/s", "golib=/x/go.so"}, 256)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Config{Socket: "/x/a.sock", TimeoutS: 3, FailOpen: true, Spool: "/x/s"}); cfg != want {
		t.Errorf("got %+v, want %+v", cfg, want)
	}
	cfg, err = ConfigParse(nil, 256)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Socket != "/run/gpufence/agent.sock" || cfg.TimeoutS != 5 || cfg.FailOpen || cfg.Spool != "/var/spool/gpufence/failopen.jsonl" {
		t.Errorf("defaults: %+v", cfg)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"timeout=0"}, `option "timeout=0" in plugstack.conf: want whole seconds from 1 to 3600`},
		{[]string{"timeout=3601"}, `want whole seconds from 1 to 3600`},
		{[]string{"timeout=+5"}, `want whole seconds from 1 to 3600`},
		{[]string{"socket=/" + strings.Repeat("s", SocketSize-1)}, fmt.Sprintf("longer than %d bytes", SocketSize-1)},
		{[]string{"spool=/" + strings.Repeat("g", PathSize-1)}, fmt.Sprintf("longer than %d bytes", PathSize-1)},
		{[]string{"golib"}, `unknown option "golib" in plugstack.conf (known: socket, timeout, failure, spool)`},
		// Found by FuzzConfigParse: strtol took blanks before the number.
		{[]string{"timeout= 1"}, `option "timeout= 1" in plugstack.conf: want whole seconds from 1 to 3600`},
		{[]string{"timeout=\t+1"}, `want whole seconds from 1 to 3600`},
		// Found by FuzzConfigParse: a long argument pushed the reason out
		// of the message; it is quoted cut now.
		{[]string{"x" + strings.Repeat("0", 2000)}, `unknown option "x` + strings.Repeat("0", ShownArg-1) + `..." in plugstack.conf (known:`},
		{[]string{"=x"}, `unknown option "=x"`},
		{[]string{"x"}, `unknown option "x"`},
	} {
		if _, err := ConfigParse(tt.args, 256); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%.80q: %.200v, want %q", tt.args, err, tt.want)
		}
	}
	if _, err := ConfigParse([]string{"socket=/" + strings.Repeat("s", SocketSize-2)}, 256); err != nil {
		t.Errorf("socket path of %d bytes: %v", SocketSize-1, err)
	}
}

func toU32(v []int) []uint32 {
	out := make([]uint32, len(v))
	for i, g := range v {
		out[i] = uint32(g)
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return "(unset)"
	}
	return fmt.Sprintf("%q", *s)
}
