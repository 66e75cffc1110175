// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const recorded = "testdata/slurmd-G"

// gpuFiles is one expected GPU: its device files (the GPU first), its type.
type gpuFiles struct {
	files []string
	typ   string
}

// layoutWant is the table each recorded layout must give, written from the
// layout's own gres.conf and fake_gpus.conf (README.md), not from what
// slurmd printed. prefix is the layout's folder.
func layoutWant(layout string) ([]gpuFiles, bool) {
	d := "/var/tmp/gfg-slurmdg/" + layout + "/dev/"
	gpu := func(typ string, minors ...int) []gpuFiles {
		var out []gpuFiles
		for _, m := range minors {
			out = append(out, gpuFiles{[]string{fmt.Sprintf("%snvidia%d", d, m)}, typ})
		}
		return out
	}
	slices := func(typ string) []gpuFiles {
		var out []gpuFiles
		for _, c := range [][2]int{{138, 139}, {147, 148}, {156, 157}} {
			out = append(out, gpuFiles{[]string{d + "nvidia1", fmt.Sprintf("%snvidia-caps/nvidia-cap%d", d, c[0]), fmt.Sprintf("%snvidia-caps/nvidia-cap%d", d, c[1])}, typ})
		}
		return out
	}
	switch layout {
	case "plain", "mps", "autodetect", "shard", "shard-partial", "mps-partial":
		return gpu("", 0, 1, 2, 3), true
	case "shard-multitype":
		return append(gpu("t4", 2, 3), gpu("a100", 0, 1)...), true
	case "multitype":
		return append(gpu("t4", 2, 3), gpu("a100", 0, 1)...), true
	case "nodename":
		return gpu("", 2, 3, 0, 1), true
	case "mig":
		return append(gpu("a100", 0), slices("1g.10gb")...), true
	case "autodetect-mig":
		return append(gpu("a100", 0), slices("a100_1g.10gb")...), true
	case "autodetect-links":
		// Untyped in slurm.conf: slurmd drops the detected type.
		return gpu("", 2, 3, 0, 1), true
	case "autodetect-files":
		return gpu("tesla_t4", 2, 3, 0, 1), true
	case "autodetect-nvidia":
		var out []gpuFiles
		for m := 0; m < 4; m++ {
			out = append(out, gpuFiles{[]string{fmt.Sprintf("/dev/nvidia%d", m)}, "tesla_t4"})
		}
		return out, true
	case "fewer":
		return gpu("", 0, 1), true
	case "nogpu":
		return []gpuFiles{}, true
	}
	return nil, false
}

// TestParseSlurmdGRecorded parses every recorded slurmd -G output of every
// release and checks it against the layout's table.
func TestParseSlurmdGRecorded(t *testing.T) {
	outs, err := filepath.Glob(filepath.Join(recorded, "*", "*.stderr"))
	if err != nil || len(outs) == 0 {
		t.Fatalf("no recorded outputs under %s: %v", recorded, err)
	}
	releases := map[string]int{}
	for _, p := range outs {
		rel, layout := filepath.Base(filepath.Dir(p)), strings.TrimSuffix(filepath.Base(p), ".stderr")
		releases[rel]++
		t.Run(rel+"/"+layout, func(t *testing.T) {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseSlurmdG(b)
			if layout == "missing" {
				if err == nil || !strings.Contains(err.Error(), "can't stat gres.conf file /var/tmp/gfg-slurmdg/missing/dev/nvidia4") {
					t.Fatalf("got %v, %v; want slurmd's fatal error", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want, ok := layoutWant(layout)
			if !ok {
				t.Fatalf("layout %s has no expected table in this test", layout)
			}
			checkTable(t, got, want)
		})
	}
	for _, r := range []string{"22.05", "23.11", "24.05", "24.11", "25.11", "26.05"} {
		if releases[r] < 11 {
			t.Errorf("release %s: %d recorded outputs, want every layout", r, releases[r])
		}
	}
}

func checkTable(t *testing.T, got []GPU, want []gpuFiles) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d GPUs, want %d: %+v", len(got), len(want), got)
	}
	for i, g := range got {
		w := want[i]
		if g.Index != i || g.Path != w.files[0] || !slices.Equal(g.Files, w.files) || g.Type != w.typ || g.MIG != (len(w.files) > 1) {
			t.Errorf("GPU %d: index %d path %s files %v type %q MIG %v; want files %v type %q", i, g.Index, g.Path, g.Files, g.Type, g.MIG, w.files, w.typ)
		}
		if !strings.HasPrefix(g.Source, "slurmd -G line ") {
			t.Errorf("GPU %d: source %q", i, g.Source)
		}
	}
}

// TestGresConfAgreesWithSlurmd reads each recorded static layout's
// gres.conf with the agent's own reader and compares it with what every
// release's slurmd made of the same file; the layouts where slurmd knows
// more (AutoDetect, slurm.conf's counts) differ, and must.
func TestGresConfAgreesWithSlurmd(t *testing.T) {
	for _, tt := range []struct {
		layout string
		agree  bool
	}{
		{"plain", true}, {"multitype", true}, {"mig", true}, {"nodename", true}, {"mps", true},
		{"fewer", false}, {"autodetect-files", false},
	} {
		conf, err := ReadGres(filepath.Join(recorded, "layouts", tt.layout, "gres.conf"), "gfnode")
		if err != nil {
			t.Fatalf("%s: %v", tt.layout, err)
		}
		outs, _ := filepath.Glob(filepath.Join(recorded, "*", tt.layout+".stderr"))
		if len(outs) < 6 {
			t.Fatalf("%s: %d recorded outputs", tt.layout, len(outs))
		}
		for _, p := range outs {
			b, _ := os.ReadFile(p)
			sd, err := parseSlurmdG(b)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			same := len(sd) == len(conf.GPUs)
			for i := 0; same && i < len(sd); i++ {
				same = slices.Equal(sd[i].Files, conf.GPUs[i].Files) && sd[i].Type == conf.GPUs[i].Type && sd[i].MIG == conf.GPUs[i].MIG
			}
			if same != tt.agree {
				t.Errorf("%s: gres.conf reads as %v, slurmd printed %v; agree=%v, want %v", p, files(conf.GPUs), files(sd), same, tt.agree)
			}
		}
	}
}

func files(gpus []GPU) [][]string {
	var out [][]string
	for _, g := range gpus {
		out = append(out, g.Files)
	}
	return out
}

func TestParseSlurmdG(t *testing.T) {
	const (
		p22 = "slurmd: Gres Name=gpu Type=(null) Count=%s Index=0 ID=7696487 File=%s (null)\n"
		p26 = "[2026-12-01T11:28:37.391] Gres Name=gpu Type=a100 Count=1 Index=0 ID=7696487 File=%s Links=(null) Flags=HAS_FILE,HAS_TYPE\n"
	)
	for _, tt := range []struct {
		name, out string
		want      [][]string
		wantErr   string
	}{
		{name: "range", out: fmt.Sprintf(p22, "2", "/dev/nvidia[0-1]"), want: [][]string{{"/dev/nvidia0"}, {"/dev/nvidia1"}}},
		{name: "26.05 prefix", out: fmt.Sprintf(p26, "/dev/nvidia3"), want: [][]string{{"/dev/nvidia3"}}},
		{name: "no prefix", out: "Gres Name=gpu Type=(null) Count=1 Index=0 ID=1 File=/dev/nvidia0\n", want: [][]string{{"/dev/nvidia0"}}},
		{name: "MIG", out: fmt.Sprintf(p22, "1", "/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21"), want: [][]string{{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21"}}},
		{name: "other gres skipped", out: "slurmd: Gres Name=mps Type=(null) Count=100 Index=0 ID=7565421 File=/dev/nvidia0 (null)\n" + fmt.Sprintf(p22, "1", "/dev/nvidia0"), want: [][]string{{"/dev/nvidia0"}}},
		{name: "other lines ignored", out: "slurmd: warning: something\nslurmd: Gres Names are\n" + fmt.Sprintf(p22, "1", "/dev/nvidia0"), want: [][]string{{"/dev/nvidia0"}}},
		{name: "empty", out: "", want: [][]string{}},
		{name: "fatal", out: fmt.Sprintf(p22, "1", "/dev/nvidia0") + "slurmd: fatal: something broke\n", wantErr: "slurmd failed: fatal: something broke"},
		{name: "count mismatch", out: fmt.Sprintf(p22, "3", "/dev/nvidia[0-1]"), wantErr: "Count=3 with 2 device files"},
		{name: "count zero", out: fmt.Sprintf(p22, "0", "/dev/nvidia0"), wantErr: `Count="0" is not a positive number`},
		{name: "count huge", out: fmt.Sprintf(p22, "99999999999", "/dev/nvidia0"), wantErr: "is not a positive number"},
		{name: "too many GPUs", out: fmt.Sprintf(p22, "1025", "/dev/n[0-1024]"), wantErr: "more than 1024 GPUs"},
		{name: "no file", out: "slurmd: Gres Name=gpu Type=(null) Count=1 ID=7696487 (null)\n", wantErr: "without File="},
		{name: "relative file", out: fmt.Sprintf(p22, "1", "nvidia0"), wantErr: "not an absolute path"},
		{name: "unknown field", out: "slurmd: Gres Name=gpu Count=1 File=/dev/nvidia0 Color=red\n", wantErr: `unknown field "Color"`},
		{name: "field twice", out: "slurmd: Gres Name=gpu Count=1 File=/dev/nvidia0 File=/dev/nvidia1\n", wantErr: "field File twice"},
		{name: "stray word", out: "slurmd: Gres Name=gpu Count=1 File=/dev/nvidia0 extra\n", wantErr: `unexpected "extra"`},
		{name: "bad range", out: fmt.Sprintf(p22, "2", "/dev/nvidia[1-0]"), wantErr: "File: bad range"},
		{name: "device twice", out: fmt.Sprintf(p22, "1", "/dev/nvidia0") + fmt.Sprintf(p22, "1", "/dev/nvidia0"), wantErr: "listed twice"},
		{name: "whole and sliced", out: fmt.Sprintf(p22, "1", "/dev/nvidia0") + fmt.Sprintf(p22, "1", "/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21"), wantErr: "given out whole or split"},
		{name: "too many MIG files", out: fmt.Sprintf(p22, "1", "/dev/x[0-64]"), wantErr: "at most 64"},
		{name: "no file in the list", out: fmt.Sprintf(p22, "1", ","), wantErr: "names no device file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSlurmdG([]byte(tt.out))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, %v; want error %q", files(got), err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g := files(got); !slices.EqualFunc(g, tt.want, slices.Equal) {
				t.Fatalf("got %v, want %v", g, tt.want)
			}
		})
	}
}

func TestSlurmdPath(t *testing.T) {
	dir := t.TempDir()
	mk := func(p string) {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mk(dir + "/pc/sbin/slurmd")
	mk(dir + "/pc/bin/scontrol")
	mk(dir + "/flat/slurmd")
	for _, tt := range []struct {
		binDir, conf, want, wantErr string
	}{
		{binDir: dir + "/pc/bin", want: dir + "/pc/sbin/slurmd"},
		{binDir: dir + "/flat", want: dir + "/flat/slurmd"},
		{binDir: dir + "/none", wantErr: "no slurmd found"},
		{conf: dir + "/pc/etc/slurm.conf", want: dir + "/pc/sbin/slurmd"},
	} {
		got, err := SlurmdPath(tt.binDir, tt.conf)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("SlurmdPath(%q, %q) = %q, %v; want %q", tt.binDir, tt.conf, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("SlurmdPath(%q, %q) = %q, %v; want %q", tt.binDir, tt.conf, got, err, tt.want)
		}
	}
	// No slurm_bin_dir and no prefix layout: the system's, never PATH's.
	got, err := SlurmdPath("", "/etc/slurm/slurm.conf")
	if _, serr := os.Stat("/usr/sbin/slurmd"); serr == nil && (err != nil || got != "/usr/sbin/slurmd") {
		t.Errorf("SlurmdPath default = %q, %v; want /usr/sbin/slurmd", got, err)
	}
}

// TestTrustedBinarySystem checks the system's own binaries pass (a
// Debian slurmd is /usr/sbin/slurmd -> /etc/alternatives/slurmd ->
// /usr/sbin/slurmd-wlm).
func TestTrustedBinarySystem(t *testing.T) {
	for _, p := range []string{"/usr/sbin/slurmd", "/bin/sh"} {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := TrustedBinary(p); err != nil {
			t.Errorf("TrustedBinary(%s): %v", p, err)
		}
	}
	if err := TrustedBinary("usr/sbin/slurmd"); err == nil {
		t.Error("a relative path was trusted")
	}
}

func TestPrivilegedTrustedBinary(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes files owned by root and by another user")
	}
	base := t.TempDir() // root's, 0700, in the sticky /tmp
	mk := func(rel string, mode os.FileMode) string {
		p := filepath.Join(base, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	good := mk("ok/sbin/slurmd", 0o755)
	groupW := mk("gw/slurmd", 0o775)
	noExec := mk("nx/slurmd", 0o644)
	owned := mk("owned/slurmd", 0o755)
	os.Chown(owned, 65534, 65534)
	openDir := filepath.Join(base, "open")
	mk("open/slurmd", 0o755)
	os.Chmod(openDir, 0o777)
	sticky := filepath.Join(base, "sticky")
	mk("sticky/slurmd", 0o755)
	os.Chmod(sticky, os.ModeSticky|0o777)
	// A link through a folder anyone may write: the link can be replaced.
	os.Symlink(good, filepath.Join(openDir, "link"))
	os.Symlink(filepath.Join(openDir, "link"), filepath.Join(base, "ok", "via-open"))
	os.Symlink("sbin/slurmd", filepath.Join(base, "ok", "rel"))
	os.Symlink(good, filepath.Join(base, "ok", "abs"))
	for _, tt := range []struct {
		path, wantErr string
	}{
		{good, ""},
		{filepath.Join(base, "sticky", "slurmd"), ""},
		{filepath.Join(base, "ok", "rel"), ""},
		{filepath.Join(base, "ok", "abs"), ""},
		{filepath.Join(base, "ok", "..", "ok", "sbin", "slurmd"), ""},
		{groupW, "writable by group or others"},
		{noExec, "not executable"},
		{owned, "owned by uid 65534"},
		{filepath.Join(openDir, "slurmd"), "writable by group or others"},
		{filepath.Join(base, "ok", "via-open"), "writable by group or others"},
		{filepath.Join(base, "ok", "sbin"), "not a regular file"},
		{filepath.Join(base, "missing"), "no such file"},
	} {
		err := TrustedBinary(tt.path)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("TrustedBinary(%s) = %v, want %q", strings.TrimPrefix(tt.path, base), err, tt.wantErr)
		}
	}
}

// TestPrivilegedSlurmdG runs this machine's own slurmd -G on a layout of
// fake devices, with the real Slurm reading it.
func TestPrivilegedSlurmdG(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes device nodes and runs slurmd")
	}
	bin := "/usr/sbin/slurmd"
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no slurmd on this machine (%v); tests/deps.sh installs it", err)
	}
	d := t.TempDir()
	for _, sub := range []string{"etc", "dev", "state", "run", "logs"} {
		os.MkdirAll(filepath.Join(d, sub), 0o755)
	}
	for i := 0; i < 3; i++ {
		if err := unix.Mknod(filepath.Join(d, "dev", fmt.Sprintf("nvidia%d", i)), unix.S_IFCHR|0o600, int(unix.Mkdev(195, uint32(i)))); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(d, "etc", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// With the fake GPUs in PCI order nvidia2, nvidia0, nvidia1: Slurm's
	// order, which gres.conf does not say.
	write("gres.conf", "AutoDetect=nvml\n")
	write("fake_gpus.conf", fmt.Sprintf("t4|1|0|0,-1,0|%[1]s/nvidia0\nt4|1|0|0,0,-1|%[1]s/nvidia1\nt4|1|0|-1,0,0|%[1]s/nvidia2\n", filepath.Join(d, "dev")))
	// cgroup/v1: slurmd -G initializes the cgroup plugin, and v2 would
	// join the slurmstepd scope; v1's init touches nothing.
	write("cgroup.conf", "CgroupPlugin=cgroup/v1\n")
	write("slurm.conf", fmt.Sprintf(`ClusterName=gft
SlurmctldHost=gfnode(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
SlurmdSpoolDir=%[1]s/state
SlurmdPidFile=%[1]s/run/slurmd.pid
SlurmdLogFile=%[1]s/logs/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
GresTypes=gpu
NodeName=gfnode NodeAddr=127.0.0.1 CPUs=1 Gres=gpu:t4:3 State=UNKNOWN
PartitionName=debug Nodes=gfnode Default=YES
`, d))
	if v, _ := exec.Command(bin, "-V").Output(); !strings.HasPrefix(string(v), "slurm-wlm 22.05") && !strings.HasPrefix(string(v), "slurm 22.05") {
		// 23.11 and later need munged for slurmd -G.
		t.Skipf("%s is %s; this test runs 22.05, which needs no munged", bin, strings.TrimSpace(string(v)))
	}
	s := &Slurmd{Bin: bin, SlurmConf: filepath.Join(d, "etc", "slurm.conf"), Node: "gfnode"}
	v, err := s.GPUs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dev := filepath.Join(d, "dev")
	checkTable0(t, v.GPUs, []string{dev + "/nvidia2", dev + "/nvidia0", dev + "/nvidia1"}, "t4")
	t.Logf("%s took %s", v.Command, v.Took)

	// A node slurm.conf does not name: slurmd's own error.
	s.Node = "nosuchnode"
	if _, err := s.GPUs(context.Background()); err == nil || !strings.Contains(err.Error(), "exit status") {
		t.Errorf("unknown node: %v", err)
	}
	s.Node = "gfnode"
	s.SlurmConf = filepath.Join(d, "etc", "missing.conf")
	if _, err := s.GPUs(context.Background()); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing slurm.conf: %v", err)
	}
}

func checkTable0(t *testing.T, got []GPU, paths []string, typ string) {
	t.Helper()
	var want []gpuFiles
	for _, p := range paths {
		want = append(want, gpuFiles{[]string{p}, typ})
	}
	checkTable(t, got, want)
}

// TestPrivilegedSlurmdGTimeout: a slurmd that hangs is killed at the
// timeout, with what it printed last.
func TestPrivilegedSlurmdGTimeout(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the binary must be root's to be run")
	}
	d := t.TempDir()
	bin := filepath.Join(d, "slurmd")
	os.WriteFile(bin, []byte("#!/bin/sh\necho 'slurmd: error: Waiting for gres.conf file /dev/nvidia9' >&2\nsleep 30 & wait\n"), 0o755)
	conf := filepath.Join(d, "slurm.conf")
	os.WriteFile(conf, nil, 0o644)
	s := &Slurmd{Bin: bin, SlurmConf: conf, Node: "n1", Timeout: 300 * time.Millisecond}
	start := time.Now()
	_, err := s.GPUs(context.Background())
	if err == nil || !strings.Contains(err.Error(), "did not finish within 300ms") || !strings.Contains(err.Error(), "Waiting for gres.conf file /dev/nvidia9") {
		t.Fatalf("err = %v", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("returned after %s", el)
	}
	os.Chmod(d, 0o777)
	if _, err := s.GPUs(context.Background()); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Errorf("slurmd in a folder anyone may write: %v", err)
	}
}

// sharesWant places each recorded layout's shared GRES devices, written
// from the layout (README.md): slurmd makes one shared device per GPU, in
// the GPUs' order, Count=0 where gres.conf gives that GPU none.
var sharesWant = map[string]Shares{
	"mps":             {"mps": {0, 1, 2, 3}},
	"shard":           {"shard": {0, 1, 2, 3}},
	"shard-partial":   {"shard": {0, 1, 2, 3}},
	"mps-partial":     {"mps": {0, 1, 2, 3}},
	"shard-multitype": {"shard": {0, 1, 2, 3}},
}

// TestParseSlurmdShares: every recorded output places each shard and mps
// device on the GPU of its File=, and no other layout has shares.
func TestParseSlurmdShares(t *testing.T) {
	outs, _ := filepath.Glob(filepath.Join(recorded, "*", "*.stderr"))
	n := 0
	for _, p := range outs {
		layout := strings.TrimSuffix(filepath.Base(p), ".stderr")
		if layout == "missing" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		gpus, shares, err := ParseSlurmdTable(b)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		want := sharesWant[layout]
		if len(shares) != len(want) {
			t.Errorf("%s: shares %v, want %v", p, shares, want)
			continue
		}
		for k, w := range want {
			if !slices.Equal(shares[k], w) {
				t.Errorf("%s: %s devices on GPUs %v, want %v", p, k, shares[k], w)
			}
			// The placement is by file: device k is on the GPU of its file.
			for d, g := range shares[k] {
				if _, ok := shares.GPU(k, d); !ok || gpus[g].Index != g {
					t.Errorf("%s: %s device %d not placed", p, k, d)
				}
			}
			n++
		}
	}
	if n < 10 {
		t.Errorf("%d recorded outputs with shares, want every release's mps layout and the 22.05 and 25.11 shard layouts", n)
	}
	// In shard-multitype, GPU 0 is nvidia2 (t4): its shard device is 0 and
	// has Count=0; nvidia0 (a100, GPU 2) has shards: device 2.
	b, _ := os.ReadFile(filepath.Join(recorded, "25.11", "shard-multitype.stderr"))
	gpus, shares, err := ParseSlurmdTable(b)
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := shares.GPU("shard", 2); !ok || !strings.HasSuffix(gpus[g].Path, "/nvidia0") {
		t.Errorf("shard device 2 on GPU %d (%v), want nvidia0's", g, ok)
	}
}

func TestParseSlurmdSharesUnplaced(t *testing.T) {
	out := "slurmd: Gres Name=shard Type=(null) Count=10 Index=0 ID=1 File=/dev/nvidia7 (null)\n" +
		"slurmd: Gres Name=gpu Type=(null) Count=1 Index=0 ID=2 File=/dev/nvidia0 (null)\n" +
		"slurmd: Gres Name=shard Type=(null) Count=10 Index=0 ID=1 File=/dev/nvidia0 (null)\n"
	gpus, shares, err := ParseSlurmdTable([]byte(out))
	if err != nil || len(gpus) != 1 {
		t.Fatalf("%v %v %v", gpus, shares, err)
	}
	if _, ok := shares.GPU("shard", 0); ok {
		t.Errorf("shard device 0 (nvidia7, no GPU) placed: %v", shares)
	}
	if g, ok := shares.GPU("shard", 1); !ok || g != 0 {
		t.Errorf("shard device 1 on %d %v, want GPU 0", g, ok)
	}
	for _, bad := range []struct {
		k string
		d int
	}{{"shard", 2}, {"shard", -1}, {"mps", 0}} {
		if _, ok := shares.GPU(bad.k, bad.d); ok {
			t.Errorf("%s device %d placed", bad.k, bad.d)
		}
	}
	if _, _, err := ParseSlurmdTable([]byte("slurmd: Gres Name=mps Type=(null) Count=100 Index=0 ID=1 File=(null) (null)\n")); err == nil || !strings.Contains(err.Error(), "mps record without File=") {
		t.Errorf("mps without File=: %v", err)
	}
}

// TestReadGresShares: from gres.conf alone, shared device k is GPU k
// (slurmd makes them so), for each shared GRES the node's lines name.
func TestReadGresShares(t *testing.T) {
	for layout, want := range sharesWant {
		conf, err := ReadGres(filepath.Join(recorded, "layouts", layout, "gres.conf"), "gfnode")
		if err != nil {
			t.Fatalf("%s: %v", layout, err)
		}
		if len(conf.Shares) != len(want) {
			t.Errorf("%s: %v, want %v", layout, conf.Shares, want)
		}
		for k, w := range want {
			if !slices.Equal(conf.Shares[k], w) {
				t.Errorf("%s: %s %v, want %v", layout, k, conf.Shares[k], w)
			}
		}
	}
	conf, err := ReadGres(filepath.Join(recorded, "layouts", "plain", "gres.conf"), "gfnode")
	if err != nil || conf.Shares != nil {
		t.Errorf("plain: %v %v", conf.Shares, err)
	}
}

// parseSlurmdG is the GPUs of ParseSlurmdTable.
func parseSlurmdG(out []byte) ([]GPU, error) {
	gpus, _, err := ParseSlurmdTable(out)
	return gpus, err
}
