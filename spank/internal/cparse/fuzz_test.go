// SPDX-License-Identifier: Apache-2.0

package cparse

import (
	"encoding/binary"
	"fmt"
	"github.com/gpufence/gpufence/agent/gpulist"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/gpulist/gpulisttest"
)

// FuzzGPUList: the C plugin and the Go agent accept the same GPU lists and
// read the same indices from them, and the plugin renumbers exactly the
// values that are non-empty lists.
func FuzzGPUList(f *testing.F) {
	cases, err := gpulisttest.GPUListCases(gpuListTable)
	if err != nil {
		f.Fatal(err)
	}
	for _, c := range cases {
		f.Add(c.Input)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.IndexByte(s, 0) >= 0 {
			return // no C string or environment value holds a NUL
		}
		goList, goErr := gpulist.Parse(s)
		cList, cOK := ParseGPUList(s, MaxGPUIndex+1)
		if cOK != (goErr == nil) {
			t.Fatalf("%q: C ok=%v %v, Go %v %v", s, cOK, cList, goList, goErr)
		}
		if cOK && !slices.Equal(cList, toU32(goList)) {
			t.Fatalf("%q: C %v, Go %v", s, cList, goList)
		}
		r, out := Renumber(&s, allGPUs, 0, 8192)
		if want := cOK && s != ""; (r == Set) != want || (r != Set && r != Keep) || (want && out != s) {
			t.Fatalf("gf_renumber(%q, 0..%d) = %v %q; the value is a list: %v", s, MaxGPUIndex, r, out, want)
		}
	})
}

// FuzzRenumber checks gf_renumber against its contract, computed with the
// agent's parser: the value as a list (else KEEP), each entry's position in
// the step's GPUs, entries outside dropped, ERROR only when out is too small.
func FuzzRenumber(f *testing.F) {
	f.Add("1,3", []byte{1, 3}, uint8(0), uint16(64))
	f.Add("0,3", []byte{1, 3}, uint8(0), uint16(64))
	f.Add("1,3", []byte{1, 3}, uint8(ListFromEnv), uint16(64))
	f.Add("0", []byte{1}, uint8(ListFromEnv), uint16(64))
	f.Add("2", []byte{2}, uint8(SlurmLocal), uint16(64))
	f.Add("MIG-5f1c2d3e-4444-5555-6666-777788889999", []byte{0}, uint8(0), uint16(64))
	f.Add("0,1,2,3", []byte{0, 1, 2, 3}, uint8(0), uint16(7))
	f.Add("", []byte{}, uint8(0), uint16(0))
	f.Fuzz(func(t *testing.T, value string, gpuBytes []byte, flags uint8, outlen uint16) {
		if strings.IndexByte(value, 0) >= 0 {
			return
		}
		// The step's GPUs as the agent answers them: ascending, distinct,
		// two bytes each.
		var gpus []uint32
		for i := 0; i+1 < len(gpuBytes) && len(gpus) < 256; i += 2 {
			g := uint32(binary.LittleEndian.Uint16(gpuBytes[i:])) % (MaxGPUIndex + 1)
			if !slices.Contains(gpus, g) {
				gpus = append(gpus, g)
			}
		}
		slices.Sort(gpus)
		fl := int(flags & (SlurmLocal | ListFromEnv))
		ol := int(outlen % 8192)

		r, out := Renumber(&value, gpus, fl, ol)

		wantR, wantOut := renumberModel(value, gpus, fl, ol)
		if r != wantR || out != wantOut {
			t.Fatalf("gf_renumber(%q, %v, %d, outlen %d) = %v %q, want %v %q", value, gpus, fl, ol, r, out, wantR, wantOut)
		}
	})
}

func renumberModel(value string, gpus []uint32, flags, outlen int) (Result, string) {
	list, err := gpulist.Parse(value)
	if value == "" || err != nil || flags&SlurmLocal != 0 {
		return Keep, ""
	}
	var pos []string
	for _, e := range list {
		i := slices.Index(gpus, uint32(e))
		if i < 0 {
			if flags&ListFromEnv != 0 {
				return Keep, ""
			}
			continue
		}
		pos = append(pos, strconv.Itoa(i))
	}
	out := strings.Join(pos, ",")
	if len(out) >= outlen {
		return Error, ""
	}
	return Set, out
}

// FuzzConfigParse runs the plugstack argument parser on arguments split at
// NUL (no C argument holds one) and holds it to a model of its contract:
// defaults, then each key=value once, an unknown key, a repeat or a bad
// value refused with a message that names the option and says what is
// wrong, within the plugin's smallest error buffer.
func FuzzConfigParse(f *testing.F) {
	for _, args := range [][]string{
		nil,
		{"socket=/run/gpufence/agent.sock", "timeout=10"},
		{"socket=/x/a.sock", "timeout=3", "golib=/x/go.so", "failure=open", "spool=/x/s"},
		{"failure=closed", "failure=open"},
		{"timeout=0"}, {"timeout=3600"}, {"timeout=3601"}, {"timeout=-1"}, {"timeout=5s"},
		{"socket=relative"}, {"socket"}, {"=x"}, {"bogus=1"}, {"golib="},
		{"socket=/" + strings.Repeat("s", SocketSize)},
	} {
		f.Add(strings.Join(args, "\x00"), uint16(GFErrLen))
	}
	f.Fuzz(func(t *testing.T, joined string, errlen uint16) {
		var args []string
		if joined != "" {
			args = strings.Split(joined, "\x00")
		}
		el := GFErrLen
		if errlen%4 == 0 {
			el = int(errlen % 1024) // also tiny buffers: a message is cut, never overrun
		}
		cfg, err := ConfigParse(args, el)
		want, wantErr := configModel(args)
		switch {
		case (err == nil) != (wantErr == ""):
			t.Fatalf("%q: C %+v, %v; model %+v, %q", args, cfg, err, want, wantErr)
		case err == nil:
			if cfg != want {
				t.Fatalf("%q: C %+v, model %+v", args, cfg, want)
			}
		case el >= GFErrLen && err.Error() != wantErr:
			t.Fatalf("%q: C says\n\t%q\nmodel\n\t%q", args, err, wantErr)
		case el < GFErrLen && (len(err.Error()) >= max(el, 1) || !strings.HasPrefix(wantErr, err.Error())):
			t.Fatalf("%q: C says %q in %d bytes; model %q", args, err, el, wantErr)
		}
	})
}

// GFErrLen is the smallest error buffer the plugin passes gf_config_parse
// (GPUFENCE_ERR_LEN in spank/plugin/client.h).
const GFErrLen = 512

var options = []string{"socket", "timeout", "failure", "spool"}

// configModel is gf_config_parse as documented in args.h: golib=, of older
// versions, is skipped whatever its value.
func configModel(args []string) (Config, string) {
	cfg := Config{Socket: "/run/gpufence/agent.sock", TimeoutS: 5, Spool: "/var/spool/gpufence/failopen.jsonl"}
	seen := map[string]bool{}
	for _, a := range args {
		key, val, ok := strings.Cut(a, "=")
		if ok && key == "golib" {
			continue
		}
		if !ok || !slices.Contains(options, key) {
			return Config{}, fmt.Sprintf(`unknown option "%s" in plugstack.conf (known: socket, timeout, failure, spool)`, shown(a))
		}
		if seen[key] {
			return Config{}, fmt.Sprintf(`option "%s" given twice in plugstack.conf`, key)
		}
		seen[key] = true
		bad := fmt.Sprintf(`option "%s" in plugstack.conf: `, shown(a))
		switch key {
		case "socket", "spool":
			size := PathSize
			if key == "socket" {
				size = SocketSize
			}
			switch {
			case !strings.HasPrefix(val, "/"):
				return Config{}, bad + "not an absolute path"
			case len(val) >= size:
				return Config{}, bad + fmt.Sprintf("longer than %d bytes", size-1)
			}
			switch key {
			case "socket":
				cfg.Socket = val
			default:
				cfg.Spool = val
			}
		case "timeout":
			v, err := strconv.Atoi(val)
			if err != nil || strings.TrimLeft(val, "0123456789") != "" || v < 1 || v > 3600 {
				return Config{}, bad + "want whole seconds from 1 to 3600"
			}
			cfg.TimeoutS = v
		case "failure":
			if val != "closed" && val != "open" {
				return Config{}, bad + "want closed or open"
			}
			cfg.FailOpen = val == "open"
		}
	}
	return cfg, ""
}

// shown is how a message quotes an argument: a long one cut.
func shown(a string) string {
	if len(a) > ShownArg {
		return a[:ShownArg] + "..."
	}
	return a
}
