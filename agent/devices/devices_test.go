package devices

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/slurm"
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
	gpus, err := Resolve([]slurm.GPU{{Index: 0, Path: filepath.Join(dir, "nvidia3")}}, 195)
	if err != nil {
		t.Fatal(err)
	}
	if gpus[0].Major != 195 || gpus[0].Minor != 3 {
		t.Errorf("got %d:%d, want 195:3", gpus[0].Major, gpus[0].Minor)
	}
	if _, err := Resolve([]slurm.GPU{{Index: 0, Path: filepath.Join(dir, "gpu-a")}}, 195); err == nil {
		t.Error("absent file without a minor in its name accepted")
	}
	if _, err := Resolve([]slurm.GPU{{Index: 0, Path: dir + "/nvidia1"}, {Index: 1, Path: dir + "/x/nvidia1"}}, 195); err == nil {
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
	gpus, err := Resolve([]slurm.GPU{{Index: 0, Path: mk("nvidia0", 195, 2)}}, 195)
	if err != nil || gpus[0].Minor != 2 {
		t.Fatalf("got %+v, %v; want minor 2", gpus, err)
	}
	for _, tc := range []struct {
		path, want string
	}{
		{mk("other", 1, 3), "not the NVIDIA major"},
		{mk("ctl", 195, 255), "above the GPU range"},
	} {
		if _, err := Resolve([]slurm.GPU{{Path: tc.path}}, 195); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.path, err, tc.want)
		}
	}
	if _, err := Resolve([]slurm.GPU{{Path: dir}}, 195); err == nil || !strings.Contains(err.Error(), "not a character device") {
		t.Errorf("directory accepted: %v", err)
	}
}
