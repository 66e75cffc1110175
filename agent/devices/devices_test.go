// SPDX-License-Identifier: Apache-2.0

package devices

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

const procDevices = `Character devices:
  1 mem
195 nvidia-frontend
195 nvidia
237 nvidia-caps
510 nvidia-uvm

Block devices:
  7 loop
195 notchar
`

func TestCharMajors(t *testing.T) {
	m, err := CharMajors(strings.NewReader(procDevices))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint32{"mem": 1, "nvidia-frontend": 195, "nvidia": 195, "nvidia-caps": 237, "nvidia-uvm": 510}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %d, want %d", k, m[k], v)
		}
	}
	if _, ok := m["notchar"]; ok {
		t.Error("block device parsed as char")
	}
	if _, err := CharMajors(strings.NewReader("Character devices:\nxx mem\n")); err == nil {
		t.Error("bad major accepted")
	}
}

func TestResolveByName(t *testing.T) {
	dir := t.TempDir()
	gpus, err := Resolve([]slurm.GPU{{Index: 0, Path: filepath.Join(dir, "nvidia3")}}, 195, 0)
	if err != nil {
		t.Fatal(err)
	}
	if gpus[0].Major != 195 || gpus[0].Minor != 3 {
		t.Errorf("got %d:%d, want 195:3", gpus[0].Major, gpus[0].Minor)
	}
	if _, err := Resolve([]slurm.GPU{{Index: 0, Path: filepath.Join(dir, "gpu-a")}}, 195, 0); err == nil {
		t.Error("absent file without a minor in its name accepted")
	}
	if _, err := Resolve([]slurm.GPU{{Index: 0, Path: dir + "/nvidia1"}, {Index: 1, Path: dir + "/x/nvidia1"}}, 195, 0); err == nil {
		t.Error("two GPUs on one minor accepted")
	}
}

func TestPrivilegedResolveStat(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod of device nodes needs root")
	}
	dir := t.TempDir()
	mk := func(name string, major, minor uint32) string {
		p := filepath.Join(dir, name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The name says 0 but the node is 195:2: the node wins.
	gpus, err := Resolve([]slurm.GPU{{Index: 0, Path: mk("nvidia0", 195, 2)}}, 195, 0)
	if err != nil || gpus[0].Minor != 2 {
		t.Fatalf("got %+v, %v; want minor 2", gpus, err)
	}
	for _, tc := range []struct {
		path, want string
	}{
		{mk("other", 1, 3), "not the NVIDIA major"},
		{mk("ctl", 195, 255), "above the GPU range"},
	} {
		if _, err := Resolve([]slurm.GPU{{Path: tc.path}}, 195, 0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.path, err, tc.want)
		}
	}
	if _, err := Resolve([]slurm.GPU{{Path: dir}}, 195, 0); err == nil || !strings.Contains(err.Error(), "not a character device") {
		t.Errorf("directory accepted: %v", err)
	}
}

func TestCapsMajorConstantsMatchFilter(t *testing.T) {
	if MaxCapsMinor != devfilter.MaxCapsMinor || FirstCapsAccessMinor != devfilter.FirstCapsAccessMinor {
		t.Fatalf("devices caps bounds %d..%d differ from the filter's %d..%d",
			FirstCapsAccessMinor, MaxCapsMinor, devfilter.FirstCapsAccessMinor, devfilter.MaxCapsMinor)
	}
}

// mig is a gres record as slurm.ReadGres returns in GresConf.GPUs it.
func mig(index int, src string, files ...string) slurm.GPU {
	return slurm.GPU{Index: index, Path: files[0], Files: files, MIG: true, Source: src}
}

func whole(index int, src, path string) slurm.GPU {
	return slurm.GPU{Index: index, Path: path, Files: []string{path}, Source: src}
}

// TestResolveMIGByName resolves files the driver has not created yet, by
// their names.
func TestResolveMIGByName(t *testing.T) {
	d := t.TempDir()
	caps := func(n int) string { return filepath.Join(d, "nvidia-caps", "nvidia-cap"+strconv.Itoa(n)) }
	gpu := func(n int) string { return filepath.Join(d, "nvidia"+strconv.Itoa(n)) }
	got, err := Resolve([]slurm.GPU{
		whole(0, "g:1", gpu(0)),
		mig(1, "g:2", gpu(1), caps(148), caps(147)),
		mig(2, "g:3", caps(156), gpu(1), caps(157)),
	}, 195, 237)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		minor uint32
		path  string
		caps  []uint32
	}{{0, gpu(0), nil}, {1, gpu(1), []uint32{147, 148}}, {1, gpu(1), []uint32{156, 157}}}
	for i, w := range want {
		g := got[i]
		if g.Major != 195 || g.Minor != w.minor || g.Path != w.path || !slices.Equal(g.CapsMinors(), w.caps) {
			t.Errorf("gpu %d = %d:%d %s caps %v, want 195:%d %s caps %v", i, g.Major, g.Minor, g.Path, g.CapsMinors(), w.minor, w.path, w.caps)
		}
	}
	if got[1].Caps[0].Path != caps(147) {
		t.Errorf("caps path = %s, want %s", got[1].Caps[0].Path, caps(147))
	}

	for _, tc := range []struct {
		name      string
		gpus      []slurm.GPU
		capsMajor uint32
		want      string
	}{
		{"caps major unknown", []slurm.GPU{mig(0, "g:4", gpu(0), caps(12))}, 0, "gpu 0 (g:4): " + caps(12) + " does not exist and the nvidia-caps major is unknown"},
		{"caps in File=", []slurm.GPU{whole(0, "g:5", caps(12))}, 237, "gpu 0 (g:5): File=" + caps(12) + " is an nvidia-caps device"},
		{"MIG config", []slurm.GPU{mig(0, "g:6", gpu(0), caps(1))}, 237, "is the MIG config capability"},
		{"MIG monitor", []slurm.GPU{mig(0, "g:6", gpu(0), caps(12), caps(2))}, 237, "is the MIG monitor capability"},
		{"fabric-mgmt", []slurm.GPU{mig(0, "g:6", gpu(0), caps(0))}, 237, "is the nvlink fabric-mgmt capability"},
		{"above the bitmap", []slurm.GPU{mig(0, "g:7", gpu(0), caps(4352))}, 237, "minor 4352, above 4351"},
		{"no GPU", []slurm.GPU{mig(0, "g:8", caps(12), caps(13))}, 237, "gpu 0 (g:8): no GPU device"},
		{"two GPUs", []slurm.GPU{mig(0, "g:9", gpu(0), gpu(1))}, 237, "is a second GPU device"},
		{"slice with a file that is neither", []slurm.GPU{mig(0, "g:10", gpu(0), filepath.Join(d, "nvidia-modeset"))}, 237, "does not exist and its name does not give a minor"},
		{"same slice twice", []slurm.GPU{mig(0, "g:11", gpu(0), caps(12), caps(13)), mig(1, "g:12", gpu(0), caps(13), caps(12))}, 237, "gpu 1 (g:12): the same MIG slice (caps [12 13]) as gpu 0"},
		{"whole then split", []slurm.GPU{whole(0, "g:13", gpu(0)), mig(1, "g:14", gpu(0), caps(12))}, 237, "gpu 1 (g:14): its parent GPU 195:0 is given out whole as gpu 0"},
		{"split then whole", []slurm.GPU{mig(0, "g:13", gpu(0), caps(12)), whole(1, "g:14", gpu(0))}, 237, "gpu 1 (g:14): device 195:0 is the parent GPU of MIG slice gpu 0"},
		{"a GI shared across GPUs", []slurm.GPU{mig(0, "g:15", gpu(0), caps(12), caps(13)), mig(1, "g:16", gpu(1), caps(12), caps(14))}, 237, "is also a capability of a slice of GPU 195:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Resolve(tc.gpus, 195, tc.capsMajor); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
	// Two compute instances of one GPU instance share its access minor.
	if _, err := Resolve([]slurm.GPU{mig(0, "g:17", gpu(0), caps(12), caps(13)), mig(1, "g:18", gpu(0), caps(12), caps(14))}, 195, 237); err != nil {
		t.Errorf("two compute instances of one GPU instance: %v", err)
	}
}

func TestPrivilegedResolveMIGStat(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod of device nodes needs root")
	}
	dir := t.TempDir()
	mk := func(name string, major, minor uint32) string {
		p := filepath.Join(dir, name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Names say one thing, the nodes another: the nodes win.
	parent, gi, ci := mk("nvidia7", 195, 1), mk("nvidia-cap1", 237, 138), mk("weird", 237, 139)
	got, err := Resolve([]slurm.GPU{mig(0, "g:1", parent, gi, ci)}, 195, 237)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Minor != 1 || !slices.Equal(got[0].CapsMinors(), []uint32{138, 139}) {
		t.Errorf("got %d caps %v, want 1 caps [138 139]", got[0].Minor, got[0].CapsMinors())
	}
	other := mk("other", 236, 12)
	for _, tc := range []struct {
		capsMajor uint32
		want      string
	}{
		{237, "is device 236:12, not the NVIDIA major 195 nor the nvidia-caps major 237"},
		{0, "is device 236:12, not the NVIDIA major 195"},
	} {
		if _, err := Resolve([]slurm.GPU{mig(0, "g:2", parent, other)}, 195, tc.capsMajor); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("caps major %d: err = %v, want %q", tc.capsMajor, err, tc.want)
		}
	}
	named := mk("nvidia-cap12", 236, 12)
	if _, err := Resolve([]slurm.GPU{mig(0, "g:3", parent, named)}, 195, 0); err == nil || !strings.Contains(err.Error(), "the nvidia-caps major is unknown") {
		t.Errorf("caps node with an unknown caps major: %v", err)
	}
}
