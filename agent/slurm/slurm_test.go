// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestExpandHostlist(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "/dev/nvidia[0-3]", want: []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"}},
		{in: "node[1,3-4]", want: []string{"node1", "node3", "node4"}},
		{in: "gpu[08-10]", want: []string{"gpu08", "gpu09", "gpu10"}},
		{in: "a,b[1-2],c", want: []string{"a", "b1", "b2", "c"}},
		{in: "/dev/nvidia0", want: []string{"/dev/nvidia0"}},
		{in: "queue1-st-g5-[1-2]", want: []string{"queue1-st-g5-1", "queue1-st-g5-2"}},
		{in: "x[3-1]", wantErr: "bad range"},
		{in: "x[1-", wantErr: "missing ']'"},
		{in: "x]", wantErr: "unbalanced"},
		{in: "x[a]", wantErr: "bad range"},
		{in: "x[1]y[2]", wantErr: "more than one bracket"},
		{in: "x[+1]", wantErr: "bad range"},
		{in: "x[1-+3]", wantErr: "bad range"},
		{in: "x[ 1]", wantErr: "bad range"},
		{in: "a]b[1]", wantErr: "unbalanced"},
		{in: "n[0-65535]", want: nil},
		{in: "n[0-65535,0]", wantErr: "expands to more than 65536 names"},
		{in: "a[0-40000],b[0-40000]", wantErr: "expands to more than 65536 names"},
		{in: "/" + strings.Repeat("p", 200) + "[0-30000]", wantErr: "or 4194304 bytes"},
		{in: "n[0000000000000000001]", wantErr: "bad range"},
	}
	for _, tt := range tests {
		got, err := ExpandHostlist(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ExpandHostlist(%q) error = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if tt.want == nil {
			if err != nil || len(got) != 65536 {
				t.Errorf("ExpandHostlist(%q) = %d names, %v; want 65536", tt.in, len(got), err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ExpandHostlist(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestHostlistContains(t *testing.T) {
	for _, tt := range []struct {
		expr, name string
		want       bool
	}{
		{"n[1-3]", "n2", true},
		{"n[1-3]", "n4", false},
		{"n[1-3]", "n02", false},
		{"gpu[08-10]", "gpu09", true},
		{"gpu[08-10]", "gpu9", false},
		{"gpu[08-10]", "gpu10", true},
		{"n[8-12]", "n012", false},
		{"q1-st-g5-[1-2],login", "login", true},
		{"q1-st-g5-[1-2],login", "q1-st-g5-", false},
		{"a[1-3]b", "a2b", true},
		{"a[1-3]b", "a2", false},
		{"n[0-65535]", "n65535", true},
		{"n[1-3]", "n999999999999999999999999", false},
	} {
		got, err := hostlistContains(tt.expr, tt.name)
		if err != nil || got != tt.want {
			t.Errorf("hostlistContains(%q, %q) = %v, %v; want %v", tt.expr, tt.name, got, err, tt.want)
		}
	}
}

func TestReadLinesBounds(t *testing.T) {
	dir := t.TempDir()
	// Nine files, each including the next ten times: without a bound on
	// files the last would be read 10^8 times.
	write(t, dir, "f8.conf", "Key=value\n")
	for i := 7; i >= 0; i-- {
		write(t, dir, fmt.Sprintf("f%d.conf", i), strings.Repeat(fmt.Sprintf("include f%d.conf\n", i+1), 10))
	}
	if _, err := ReadLines(filepath.Join(dir, "f0.conf")); err == nil || !strings.Contains(err.Error(), "more than 256 files read") {
		t.Errorf("include tree of 10^8 files: %v", err)
	}
	self := write(t, dir, "self.conf", "include self.conf\n")
	if _, err := ReadLines(self); err == nil || !strings.Contains(err.Error(), "includes nested deeper than 8") {
		t.Errorf("self-including file: %v", err)
	}
	big := write(t, dir, "big.conf", strings.Repeat("Key="+strings.Repeat("v", 1019)+"\n", 10<<10))
	if _, err := ReadLines(write(t, dir, "two.conf", "include big.conf\ninclude big.conf\n")); err == nil || !strings.Contains(err.Error(), "more than 16777216 bytes") {
		t.Errorf("20 MiB with includes: %v", err)
	}
	if lines, err := ReadLines(big); err != nil || len(lines) != 10<<10 {
		t.Errorf("10 MiB: %d lines, %v", len(lines), err)
	}
}

func write(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadGresGPUs(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		extra   map[string]string
		node    string
		want    []string
		wantErr string
	}{
		{name: "range", body: "Name=gpu File=/dev/nvidia[0-3]\n", node: "n1",
			want: []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"}},
		{name: "file order kept without autodetect", body: "Name=gpu Type=a File=/dev/nvidia2\nName=gpu Type=b File=/dev/nvidia0\n", node: "n1",
			want: []string{"/dev/nvidia2", "/dev/nvidia0"}},
		{name: "autodetect sorts naturally", body: "AutoDetect=nvml\nName=gpu File=/dev/nvidia10\nName=gpu File=/dev/nvidia2\n", node: "n1",
			want: []string{"/dev/nvidia2", "/dev/nvidia10"}},
		{name: "node filter", body: "NodeName=n[1-2] Name=gpu File=/dev/nvidia[0-1]\nNodeName=n3 Name=gpu File=/dev/nvidia[0-7]\n# comment\n", node: "n2",
			want: []string{"/dev/nvidia0", "/dev/nvidia1"}},
		{name: "other gres ignored", body: "Name=mps Count=100 File=/dev/nvidia0\nName=gpu File=/dev/nvidia1 # one\n", node: "n1",
			want: []string{"/dev/nvidia1"}},
		{name: "include (ParallelCluster style)", body: "include pc_gres.conf\n", extra: map[string]string{"pc_gres.conf": "NodeName=q1-st-g4dn-[1-5] Name=gpu Type=t4 File=/dev/nvidia[0-0]\n"},
			node: "q1-st-g4dn-3", want: []string{"/dev/nvidia0"}},
		{name: "missing include", body: "include nothere.conf\n", node: "n1", wantErr: "nothere.conf"},
		{name: "no gpu for node", body: "NodeName=other Name=gpu File=/dev/nvidia0\n", node: "n1", wantErr: "no gpu with File="},
		{name: "duplicate", body: "Name=gpu File=/dev/nvidia0\nName=gpu File=/dev/nvidia0\n", node: "n1", wantErr: "listed twice"},
		{name: "bad line", body: "Name=gpu Junk\n", node: "n1", wantErr: "not key=value"},
		{name: "more GPUs than a list can name", body: "Name=gpu File=/dev/nvidia[0-1024]\n", node: "n1", wantErr: "more than 1024 GPUs for node n1"},
		{name: "1024 GPUs", body: "Name=gpu File=/dev/g[0-1023]\n", node: "n1", want: func() (p []string) {
			for i := range 1024 {
				p = append(p, fmt.Sprintf("/dev/g%d", i))
			}
			return p
		}()},
		{name: "MultipleFiles beyond a MIG slice", body: "Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap[1-64]\n", node: "n1", wantErr: "MultipleFiles names 65 files"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, b := range tt.extra {
				write(t, dir, n, b)
			}
			got, err := readGresFile(write(t, dir, "gres.conf", tt.body), tt.node)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var paths []string
			for i, g := range got {
				if g.Index != i {
					t.Errorf("gpu %s has index %d, want %d", g.Path, g.Index, i)
				}
				paths = append(paths, g.Path)
			}
			if !slices.Equal(paths, tt.want) {
				t.Errorf("paths = %v, want %v", paths, tt.want)
			}
		})
	}
}

func TestReadSettings(t *testing.T) {
	tests := []struct {
		slurm, cgroup string
		wantLocal     bool
		wantSlice     string
	}{
		{"ClusterName=c1\nTaskPlugin=task/affinity,task/cgroup\n", "ConstrainDevices=yes\n", true, ""},
		{"TaskPlugin=task/affinity,task/cgroup\n", "ConstrainDevices=no\nCgroupSlice=gpu.slice\n", false, "gpu.slice"},
		{"TaskPlugin=task/cgroup\n", "", false, ""},
		{"TaskPlugin=task/affinity\n", "ConstrainDevices=yes\n", false, ""},
		{"taskplugin=task/cgroup\n", "constraindevices=YES\ncgroupslice=\"batch.slice\"\n", true, "batch.slice"},
	}
	for _, tt := range tests {
		dir := t.TempDir()
		p := write(t, dir, "slurm.conf", tt.slurm)
		if tt.cgroup != "" {
			write(t, dir, "cgroup.conf", tt.cgroup)
		}
		s, err := ReadSettings(p)
		if err != nil {
			t.Fatal(err)
		}
		if s.LocalGPUIndices() != tt.wantLocal {
			t.Errorf("%q + %q: LocalGPUIndices = %v, want %v", tt.slurm, tt.cgroup, s.LocalGPUIndices(), tt.wantLocal)
		}
		if strings.HasPrefix(tt.slurm, "ClusterName=c1") && s.ClusterName != "c1" {
			t.Errorf("ClusterName = %q", s.ClusterName)
		}
		if s.GresConf != filepath.Join(dir, "gres.conf") {
			t.Errorf("GresConf = %s", s.GresConf)
		}
		if s.CgroupSlice != tt.wantSlice {
			t.Errorf("%q: CgroupSlice = %q, want %q", tt.cgroup, s.CgroupSlice, tt.wantSlice)
		}
	}
	if _, err := ReadSettings(filepath.Join(t.TempDir(), "none.conf")); err == nil {
		t.Error("missing slurm.conf gave no error")
	}
}

func TestReadGresGPUsMIG(t *testing.T) {
	type rec struct {
		index int
		path  string
		files string
		mig   bool
		typ   string
		line  int
	}
	tests := []struct {
		name    string
		body    string
		want    []rec
		wantErr string
	}{
		{name: "one whole GPU, one split into three slices (Slurm 21.08+ MultipleFiles)",
			body: "Name=gpu Type=a100 File=/dev/nvidia0\n" +
				"Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap147,/dev/nvidia-caps/nvidia-cap148\n" +
				"Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap156,/dev/nvidia-caps/nvidia-cap157\n" +
				"Name=gpu Type=2g.20gb MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap[165-166]\n",
			want: []rec{
				{0, "/dev/nvidia0", "/dev/nvidia0", false, "a100", 1},
				{1, "/dev/nvidia1", "/dev/nvidia1 /dev/nvidia-caps/nvidia-cap147 /dev/nvidia-caps/nvidia-cap148", true, "1g.10gb", 2},
				{2, "/dev/nvidia1", "/dev/nvidia1 /dev/nvidia-caps/nvidia-cap156 /dev/nvidia-caps/nvidia-cap157", true, "1g.10gb", 3},
				{3, "/dev/nvidia1", "/dev/nvidia1 /dev/nvidia-caps/nvidia-cap165 /dev/nvidia-caps/nvidia-cap166", true, "2g.20gb", 4},
			}},
		{name: "slices before a File= range: one index per record, one per file",
			body: "Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap12\nName=gpu File=/dev/nvidia[1-2]\n",
			want: []rec{
				{0, "/dev/nvidia0", "/dev/nvidia0 /dev/nvidia-caps/nvidia-cap12", true, "", 1},
				{1, "/dev/nvidia1", "/dev/nvidia1", false, "", 2},
				{2, "/dev/nvidia2", "/dev/nvidia2", false, "", 2},
			}},
		{name: "autodetect sorts records by their file strings",
			body: "AutoDetect=nvml\nName=gpu MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap139\nName=gpu File=/dev/nvidia0\n",
			want: []rec{
				{0, "/dev/nvidia0", "/dev/nvidia0", false, "", 3},
				{1, "/dev/nvidia1", "/dev/nvidia1 /dev/nvidia-caps/nvidia-cap139", true, "", 2},
			}},
		{name: "File and MultipleFiles on one line", body: "Name=gpu\nName=gpu File=/dev/nvidia0 MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap3\n",
			wantErr: "gres.conf:2: File and MultipleFiles are mutually exclusive"},
		{name: "MultipleFiles with one file", body: "Name=gpu MultipleFiles=/dev/nvidia0\n", wantErr: "gres.conf:1: MultipleFiles=/dev/nvidia0 names one file"},
		{name: "a file twice in one slice", body: "Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap3,/dev/nvidia-caps/nvidia-cap3\n",
			wantErr: "gres.conf:1: MultipleFiles lists /dev/nvidia-caps/nvidia-cap3 twice"},
		{name: "a GPU whole and split", body: "Name=gpu File=/dev/nvidia[0-1]\nName=gpu MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap138\n",
			wantErr: "gres.conf:2: /dev/nvidia1 is a whole GPU at"},
		{name: "bad range", body: "Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap[5-3]\n", wantErr: "gres.conf:1: MultipleFiles: bad range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := write(t, t.TempDir(), "gres.conf", tt.body)
			got, err := readGresFile(p, "n1")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d GPUs %+v, want %d", len(got), got, len(tt.want))
			}
			for i, w := range tt.want {
				g := got[i]
				wantSrc := fmt.Sprintf("%s:%d", p, w.line)
				if g.Index != w.index || g.Path != w.path || strings.Join(g.Files, " ") != w.files || g.MIG != w.mig || g.Type != w.typ || g.Source != wantSrc {
					t.Errorf("gpu %d = {index %d path %s files %v mig %v type %q source %s}, want %+v at %s",
						i, g.Index, g.Path, g.Files, g.MIG, g.Type, g.Source, w, wantSrc)
				}
			}
		})
	}
}

func TestIMEXSettings(t *testing.T) {
	for _, tt := range []struct {
		conf  string
		imex  bool
		major uint32
		err   string
	}{
		{"SwitchType=switch/nvidia_imex\n", true, 0, ""},
		{"SwitchType=switch/nvidia_imex\nSwitchParameters=imex_dev_major=230\n", true, 230, ""},
		{"switchtype=switch/nvidia_imex\nswitchparameters=imex_channel_count=64,imex_dev_major=231\n", true, 231, ""},
		{"SwitchType=switch/hpe_slingshot\n", false, 0, ""},
		{"ClusterName=c\n", false, 0, ""},
		{"SwitchParameters=imex_dev_major=x\n", false, 0, "not a char major"},
		{"SwitchParameters=imex_dev_major=0\n", false, 0, "not a char major"},
		{"SwitchParameters=imex_dev_major=4096\n", false, 0, "not a char major"},
	} {
		p := write(t, t.TempDir(), "slurm.conf", tt.conf)
		s, err := ReadSettings(p)
		if err != nil {
			t.Fatal(err)
		}
		if s.NvidiaIMEX() != tt.imex {
			t.Errorf("%q: NvidiaIMEX = %v", tt.conf, s.NvidiaIMEX())
		}
		m, err := s.IMEXDevMajor()
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: err %v, want %q", tt.conf, err, tt.err)
			}
			continue
		}
		if err != nil || m != tt.major {
			t.Errorf("%q: IMEXDevMajor = %d, %v; want %d", tt.conf, m, err, tt.major)
		}
	}
}

func TestSlurmdPid(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"", DefaultSlurmdPidFile},
		{"/run/slurmd.pid", "/run/slurmd.pid"},
		{"/run/slurmd-%n.pid", "/run/slurmd-gpu-7.pid"},
	} {
		if got := (Settings{SlurmdPidFile: tc.file}).SlurmdPid("gpu-7"); got != tc.want {
			t.Errorf("SlurmdPid with SlurmdPidFile=%q = %q, want %q", tc.file, got, tc.want)
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "slurm.conf"), []byte("SlurmdPidFile=/run/slurm/d.pid\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := ReadSettings(filepath.Join(dir, "slurm.conf"))
	if err != nil || s.SlurmdPidFile != "/run/slurm/d.pid" {
		t.Errorf("readSettings: SlurmdPidFile %q, %v", s.SlurmdPidFile, err)
	}
}

// readGresFile returns the GPU table of node from gres.conf at path (see
// ReadGres).
func readGresFile(path, node string) ([]GPU, error) {
	g, err := ReadGres(path, node)
	return g.GPUs, err
}
