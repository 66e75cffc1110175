// SPDX-License-Identifier: Apache-2.0

package gputable

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/slurm"
)

// rows makes a table of whole GPUs from device minors, in index order.
func rows(minors ...int) []slurm.GPU {
	out := []slurm.GPU{}
	for i, m := range minors {
		p := fmt.Sprintf("/dev/nvidia%d", m)
		out = append(out, slurm.GPU{Index: i, Path: p, Files: []string{p}})
	}
	return out
}

func paths(gpus []slurm.GPU) []string {
	var out []string
	for _, g := range gpus {
		out = append(out, strings.Join(g.Files, ","))
	}
	return out
}

func TestChoose(t *testing.T) {
	failed := errors.New("exit status 1: fatal: can't stat gres.conf file /dev/nvidia4")
	noGPUs := fmt.Errorf("gres.conf (node n1): %w", slurm.ErrNoGPUs)
	static := func(minors ...int) slurm.GresConf { return slurm.GresConf{GPUs: rows(minors...)} }
	auto := func(minors ...int) slurm.GresConf { return slurm.GresConf{GPUs: rows(minors...), AutoDetect: "nvml"} }
	view := func(minors ...int) slurm.SlurmdView {
		return slurm.SlurmdView{GPUs: rows(minors...), Command: "/usr/sbin/slurmd -G -f /etc/slurm/slurm.conf -N n1"}
	}
	for _, tt := range []struct {
		name                      string
		in                        Input
		want                      []string
		source, kind              string
		severity                  audit.Severity
		untrusted, detail, errStr string
	}{
		{name: "agree", in: Input{Gres: static(0, 1), Slurmd: view(0, 1)},
			want: []string{"/dev/nvidia0", "/dev/nvidia1"}, source: SourceSlurmd, severity: SeverityInfo, detail: "the same as gres.conf's"},
		{name: "both none", in: Input{GresErr: noGPUs, Slurmd: view()},
			want: nil, source: SourceSlurmd, severity: SeverityInfo},
		{name: "AutoDetect, no File= lines", in: Input{Gres: slurm.GresConf{AutoDetect: "nvml"}, GresErr: noGPUs, Slurmd: view(2, 3, 0, 1)},
			want: []string{"/dev/nvidia2", "/dev/nvidia3", "/dev/nvidia0", "/dev/nvidia1"}, source: SourceSlurmd, severity: SeverityInfo,
			detail: "slurmd's table (what it found, in its order) is the authority; gres.conf names 0; GPU index 0 is /dev/nvidia2 for slurmd -G, absent in gres.conf"},
		{name: "AutoDetect reorders listed files", in: Input{Gres: auto(0, 1), Slurmd: view(1, 0)},
			want: []string{"/dev/nvidia1", "/dev/nvidia0"}, source: SourceSlurmd, severity: SeverityInfo, detail: "GPU index 0 is /dev/nvidia1 for slurmd -G, /dev/nvidia0 in gres.conf"},
		{name: "slurmd drops GPUs slurm.conf does not count", in: Input{Gres: static(0, 1, 2, 3), Slurmd: view(0, 1)},
			want: []string{"/dev/nvidia0", "/dev/nvidia1"}, source: SourceSlurmd, severity: SeverityWarning, kind: "slurmd_fewer", detail: "gres.conf names 4: slurmd uses only the first 2"},
		{name: "static, an index is another device", in: Input{Gres: static(0, 1), Slurmd: view(1, 0)},
			want: []string{"/dev/nvidia1", "/dev/nvidia0"}, source: SourceSlurmd, severity: SeverityError, kind: "sources_differ",
			untrusted: "slurmd -G and gres.conf disagree on which device a GPU index is (GPU index 0 is /dev/nvidia1 for slurmd -G, /dev/nvidia0 in gres.conf)"},
		{name: "static, slurmd has more", in: Input{Gres: static(0), Slurmd: view(0, 1)},
			source: SourceSlurmd, severity: SeverityError, kind: "sources_differ", want: []string{"/dev/nvidia0", "/dev/nvidia1"},
			untrusted: "GPU index 1 is /dev/nvidia1 for slurmd -G, absent in gres.conf"},
		{name: "static, none for gres.conf", in: Input{GresErr: noGPUs, Slurmd: view(0)},
			source: SourceSlurmd, severity: SeverityError, kind: "sources_differ", want: []string{"/dev/nvidia0"}, untrusted: "absent in gres.conf"},
		{name: "gres.conf unreadable", in: Input{GresErr: errors.New("gres.conf:3: File: bad range"), Slurmd: view(0)},
			want: []string{"/dev/nvidia0"}, source: SourceSlurmd, severity: SeverityError, kind: "gres_unreadable", detail: "could not be read to cross-check them: gres.conf:3: File: bad range",
			untrusted: "gpufence cannot read gres.conf to cross-check slurmd's GPU table (gres.conf:3: File: bad range)"},
		{name: "slurmd failed, static", in: Input{Gres: static(0, 1), SlurmdErr: failed},
			want: []string{"/dev/nvidia0", "/dev/nvidia1"}, source: SourceGresConf, severity: SeverityWarning, kind: "slurmd_failed", detail: "without slurmd's cross-check: exit status 1"},
		{name: "slurmd failed, static, no GPU", in: Input{GresErr: noGPUs, SlurmdErr: failed},
			want: nil, source: SourceGresConf, severity: SeverityWarning, kind: "slurmd_failed"},
		{name: "slurmd failed, AutoDetect", in: Input{Gres: auto(0, 1), SlurmdErr: failed},
			want: []string{"/dev/nvidia0", "/dev/nvidia1"}, source: SourceGresConf, severity: SeverityError, kind: "slurmd_failed",
			untrusted: "gres.conf sets AutoDetect=nvml, so only slurmd knows which device each GPU index is, and slurmd -G failed (exit status 1"},
		{name: "slurmd failed, gres.conf unreadable", in: Input{GresErr: errors.New("bad line"), SlurmdErr: failed},
			errStr: "no GPU table: exit status 1: fatal: can't stat gres.conf file /dev/nvidia4; and bad line"},
		{name: "off", in: Input{Gres: static(0), SlurmdOff: true},
			want: []string{"/dev/nvidia0"}, source: SourceGresConf, severity: SeverityInfo, detail: "slurmd_gpu_table is off"},
		{name: "off, AutoDetect", in: Input{Gres: auto(1, 0), SlurmdOff: true},
			want: []string{"/dev/nvidia1", "/dev/nvidia0"}, source: SourceGresConf, severity: SeverityWarning, detail: "may order them by the driver's links"},
		{name: "off, gres.conf unreadable", in: Input{GresErr: errors.New("bad line"), SlurmdOff: true}, errStr: "bad line"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, o, err := Choose(tt.in)
			if tt.errStr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errStr) {
					t.Fatalf("err = %v, want %q", err, tt.errStr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g := paths(got); !slices.Equal(g, tt.want) {
				t.Errorf("table %v, want %v", g, tt.want)
			}
			if o.Source != tt.source || o.Severity != tt.severity || o.Kind != tt.kind {
				t.Errorf("origin %+v; want source %q severity %q kind %q", o, tt.source, tt.severity, tt.kind)
			}
			if (o.Untrusted == "") != (tt.untrusted == "") || !strings.Contains(o.Untrusted, tt.untrusted) {
				t.Errorf("untrusted %q, want %q", o.Untrusted, tt.untrusted)
			}
			if !strings.Contains(o.Detail, tt.detail) {
				t.Errorf("detail %q, want %q", o.Detail, tt.detail)
			}
			if (o.Severity == SeverityError) != (o.Untrusted != "") {
				t.Errorf("severity %s with untrusted %q", o.Severity, o.Untrusted)
			}
		})
	}
}

// TestChooseRecorded: the recorded outputs of every release with the
// layouts' own gres.conf give slurmd's order where AutoDetect reorders,
// and agree where the file is static.
func TestChooseRecorded(t *testing.T) {
	dir := "../slurm/testdata/slurmd-G"
	for _, tt := range []struct {
		layout, kind string
		untrusted    bool
		first        string
	}{
		{layout: "plain", first: "/nvidia0"},
		{layout: "mig", first: "/nvidia0"},
		{layout: "multitype", first: "/nvidia2"},
		{layout: "autodetect", first: "/nvidia0"},
		{layout: "autodetect-links", first: "/nvidia2"},
		{layout: "autodetect-files", first: "/nvidia2"},
		{layout: "autodetect-mig", first: "/nvidia0"},
		{layout: "fewer", kind: "slurmd_fewer", first: "/nvidia0"},
	} {
		gres, gerr := slurm.ReadGres(filepath.Join(dir, "layouts", tt.layout, "gres.conf"), "gfnode")
		outs, _ := filepath.Glob(filepath.Join(dir, "*", tt.layout+".stderr"))
		if len(outs) < 6 {
			t.Fatalf("%s: %d outputs", tt.layout, len(outs))
		}
		for _, p := range outs {
			b, _ := os.ReadFile(p)
			sd, _, err := slurm.ParseSlurmdTable(b)
			if err != nil {
				t.Fatal(err)
			}
			got, o, err := Choose(Input{Gres: gres, GresErr: gerr, Slurmd: slurm.SlurmdView{GPUs: sd}})
			if err != nil || o.Source != SourceSlurmd || o.Kind != tt.kind || (o.Untrusted != "") != tt.untrusted || len(got) == 0 || !strings.HasSuffix(got[0].Path, tt.first) {
				t.Errorf("%s: %v, %+v, first %v", p, err, o, paths(got))
			}
		}
	}
}

// TestRecheck: a reload that finds the same table keeps GPUs given out; one
// that finds another refuses them until restart, and agreeing again lifts
// that.
func TestRecheck(t *testing.T) {
	// Missing device files: their minors come from their names.
	gpus := rows(0, 1)
	for i := range gpus {
		gpus[i].Path = "/nonexistent" + gpus[i].Path
		gpus[i].Files = []string{gpus[i].Path}
	}
	swapped := []slurm.GPU{{Index: 0, Path: gpus[1].Path, Files: gpus[1].Files}, {Index: 1, Path: gpus[0].Path, Files: gpus[0].Files}}
	in := Input{Gres: slurm.GresConf{GPUs: gpus}, Slurmd: slurm.SlurmdView{GPUs: gpus}}
	tab, err := Build(in, 195, 0)
	if err != nil {
		t.Fatal(err)
	}
	if o := tab.Origin(); o.Source != SourceSlurmd || tab.Untrusted() != "" {
		t.Fatalf("origin %+v, untrusted %q", o, tab.Untrusted())
	}
	if msg, ok := tab.Recheck(in); !ok || !strings.Contains(msg, "unchanged") || tab.Untrusted() != "" {
		t.Fatalf("same table: %q %v, untrusted %q", msg, ok, tab.Untrusted())
	}
	changed := Input{Gres: slurm.GresConf{GPUs: swapped}, Slurmd: slurm.SlurmdView{GPUs: swapped}}
	if msg, ok := tab.Recheck(changed); ok || !strings.Contains(msg, "changed since the agent started: GPU index 0 is "+gpus[1].Path) {
		t.Fatalf("changed table: %q %v", msg, ok)
	}
	if !strings.Contains(tab.Untrusted(), "until the agent restarts") {
		t.Fatalf("untrusted %q after a change", tab.Untrusted())
	}
	disagree := Input{Gres: slurm.GresConf{GPUs: gpus}, Slurmd: slurm.SlurmdView{GPUs: swapped}}
	if msg, ok := tab.Recheck(disagree); ok || !strings.Contains(msg, "disagree") {
		t.Fatalf("sources disagree: %q %v", msg, ok)
	}
	if _, ok := tab.Recheck(in); !ok || tab.Untrusted() != "" {
		t.Fatalf("agreeing again: untrusted %q", tab.Untrusted())
	}
	// The table in use never changes.
	if g, _ := tab.GPU(0); g.Path != gpus[0].Path {
		t.Fatalf("GPU 0 is %s after rechecks", g.Path)
	}
}

// TestBuildResolves: the chosen table's files are resolved as before,
// whichever source gave them.
func TestBuildResolves(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes device nodes")
	}
	dir := t.TempDir()
	var gpus []slurm.GPU
	for i, m := range []uint32{2, 0} {
		p := filepath.Join(dir, fmt.Sprintf("nvidia%d", m))
		if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(195, m))); err != nil {
			t.Fatal(err)
		}
		gpus = append(gpus, slurm.GPU{Index: i, Path: p, Files: []string{p}, Source: fmt.Sprintf("slurmd -G line %d", i+1)})
	}
	tab, err := Build(Input{Gres: slurm.GresConf{AutoDetect: "nvml"}, GresErr: slurm.ErrNoGPUs, Slurmd: slurm.SlurmdView{GPUs: gpus}}, 195, 0)
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := tab.GPU(0); !ok || g.Minor != 2 {
		t.Fatalf("GPU 0: %+v", g)
	}
	if g, _, ok := tab.Of(195, 0, nil); !ok || g.Index != 1 {
		t.Fatalf("minor 0 is GPU %d, want 1", g.Index)
	}
}

// TestShareGPU: shard and mps devices are placed by the chosen source's
// shares (slurmd's when it is slurmd -G), and never on a GPU the table
// lacks.
func TestShareGPU(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	dir := t.TempDir()
	var gpus []slurm.GPU
	for i := range 2 {
		p := filepath.Join(dir, fmt.Sprintf("nvidia%d", i))
		if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(195, uint32(i)))); err != nil {
			t.Fatal(err)
		}
		gpus = append(gpus, slurm.GPU{Index: i, Path: p, Files: []string{p}})
	}
	in := Input{Gres: slurm.GresConf{GPUs: gpus, Shares: slurm.Shares{"shard": {0, 1}}},
		Slurmd: slurm.SlurmdView{GPUs: gpus, Shares: slurm.Shares{"shard": {1, -1}, "mps": {0, 5}}}}
	tab, err := Build(in, 195, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		kind string
		dev  int
		gpu  int
		ok   bool
	}{{"shard", 0, 1, true}, {"shard", 1, 0, false}, {"shard", 2, 0, false}, {"mps", 0, 0, true}, {"mps", 1, 0, false}, {"nic", 0, 0, false}} {
		g, ok := tab.ShareGPU(c.kind, c.dev)
		if ok != c.ok || (ok && g != c.gpu) {
			t.Errorf("%s device %d: GPU %d %v, want %d %v", c.kind, c.dev, g, ok, c.gpu, c.ok)
		}
	}
	in.SlurmdOff = true
	tab, err = Build(in, 195, 0)
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := tab.ShareGPU("shard", 1); !ok || g != 1 {
		t.Errorf("gres.conf's table: shard device 1 on GPU %d %v, want 1", g, ok)
	}
}
