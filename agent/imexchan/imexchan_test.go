// SPDX-License-Identifier: Apache-2.0

package imexchan

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const chr = os.ModeDevice | os.ModeCharDevice

func TestChannels(t *testing.T) {
	dev := func(maj, min uint32) uint64 { return unix.Mkdev(maj, min) }
	for _, tt := range []struct {
		name string
		ents []Entry
		want []uint32
		err  string
	}{
		{"empty: Slurm made the mount, no channel", nil, nil, ""},
		{"one channel", []Entry{{"channel7", chr, dev(230, 7)}}, []uint32{7}, ""},
		{"channel 0", []Entry{{"channel0", chr, dev(230, 0)}}, []uint32{0}, ""},
		{"high channel", []Entry{{"channel2047", chr, dev(230, 2047)}}, []uint32{2047}, ""},
		{"other major", []Entry{{"channel7", chr, dev(195, 7)}}, nil, "major 195"},
		{"name and minor differ", []Entry{{"channel7", chr, dev(230, 8)}}, nil, "not the node Slurm names channel8"},
		{"leading zero", []Entry{{"channel07", chr, dev(230, 7)}}, nil, "not the node"},
		{"two channels", []Entry{{"channel1", chr, dev(230, 1)}, {"channel2", chr, dev(230, 2)}}, nil, "holds 2"},
		{"a file", []Entry{{"channel1", 0, 0}}, nil, "not a char device"},
		{"a block device", []Entry{{"channel1", os.ModeDevice, dev(230, 1)}}, nil, "not a char device"},
		{"a symlink", []Entry{{"channel1", os.ModeSymlink, 0}}, nil, "not a char device"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Channels(tt.ents, 230)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestMountAt(t *testing.T) {
	host := "22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n" +
		"23 1 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw,size=1k\n"
	slurm := host + "501 23 0:77 / /dev/nvidia-caps-imex-channels rw,nosuid,noexec master:2 - tmpfs tmpfs rw,size=0k,mode=755\n"
	for _, tt := range []struct {
		name, text, fstype string
		found              bool
		err                string
	}{
		{"host namespace: none", host, "", false, ""},
		{"Slurm's tmpfs", slurm, "tmpfs", true, ""},
		{"topmost wins", slurm + "502 501 0:78 / /dev/nvidia-caps-imex-channels rw - ext4 /dev/sda1 rw\n", "ext4", true, ""},
		{"a deeper path is not it", host + "503 23 0:79 / /dev/nvidia-caps-imex-channels/x rw - tmpfs tmpfs rw\n", "", false, ""},
		{"escaped blank", host + "504 23 0:80 / /dev/a\\040b rw - tmpfs tmpfs rw\n", "", false, ""},
		{"optional fields", host + "505 23 0:81 / /dev/nvidia-caps-imex-channels rw shared:3 master:2 - tmpfs tmpfs rw\n", "tmpfs", true, ""},
		{"garbage", "not a mountinfo line\n", "", false, "not in the kernel's format"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fstype, found, err := MountAt(strings.NewReader(tt.text), Dir)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || fstype != tt.fstype || found != tt.found {
				t.Fatalf("got %q %v %v; want %q %v", fstype, found, err, tt.fstype, tt.found)
			}
		})
	}
	if fstype, found, err := MountAt(strings.NewReader("504 23 0:80 / /dev/a\\040b rw - tmpfs tmpfs rw\n"), "/dev/a b"); err != nil || !found || fstype != "tmpfs" {
		t.Errorf("escaped mount point: %q %v %v, want tmpfs found", fstype, found, err)
	}
}

// childEnv makes the test binary a child that does what slurmstepd does:
// a mount namespace of its own, a tmpfs on the directory, one channel
// node; then it waits on stdin.
const childEnv = "GPUFENCE_IMEXCHAN_TEST_CHILD"

// init keeps a child's main goroutine on the main thread: unshare(2)
// changes the calling thread only, and the parent reads the namespace of
// /proc/<pid>, the main thread's. Without it, a goroutine that moved
// between threads under load mounted its tmpfs in the host's namespace
// (and the test found no mount in the child's).
func init() {
	if os.Getenv(childEnv) != "" {
		runtime.LockOSThread()
	}
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(child(spec))
	}
	os.Exit(m.Run())
}

func child(spec string) int {
	var dir string
	var major, minor uint32
	var node string
	if _, err := fmt.Sscanf(spec, "%s %d %d %s", &dir, &major, &minor, &node); err != nil {
		fmt.Fprintln(os.Stderr, "child spec:", err)
		return 2
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		fmt.Fprintln(os.Stderr, "unshare:", err)
		return 2
	}
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		fmt.Fprintln(os.Stderr, "mount /:", err)
		return 2
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=0,mode=0755"); err != nil {
		fmt.Fprintln(os.Stderr, "mount tmpfs:", err)
		return 2
	}
	if node != "-" {
		if err := unix.Mknod(filepath.Join(dir, node), unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
			fmt.Fprintln(os.Stderr, "mknod:", err)
			return 2
		}
	}
	fmt.Println("ready")
	var b [1]byte
	os.Stdin.Read(b[:])
	return 0
}

// startStepd runs a child that plays slurmstepd's switch setup in its own
// namespace and returns its pid; it ends with the test.
func startStepd(t *testing.T, dir string, major, minor uint32, node string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %s", childEnv, dir, major, minor, node))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	ready := make(chan error, 1)
	go func() {
		var b [6]byte
		_, err := out.Read(b[:])
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("child: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("child not ready")
	}
	return cmd.Process.Pid
}

// TestPrivilegedRead: the channel made in another process's private mount
// namespace is read through /proc/<pid>; the agent's own namespace, where
// the directory is empty, has none; a node that is not Slurm's is refused.
func TestPrivilegedRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (mount namespaces, tmpfs, device nodes)")
	}
	dir := t.TempDir()
	r := Reader{Dir: dir}
	pid := startStepd(t, dir, 231, 5, "channel5")
	got, err := r.Read(pid, 231)
	if err != nil || !slices.Equal(got, []uint32{5}) {
		t.Fatalf("Read(stepd) = %v, %v; want [5]", got, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the node leaked into the test's namespace: %v", ents)
	}
	if _, err := r.Read(os.Getpid(), 231); !errors.Is(err, ErrNoMount) {
		t.Errorf("Read(self) err = %v, want ErrNoMount", err)
	}
	if _, err := r.Read(startStepd(t, dir, 231, 6, "channel5"), 231); err == nil || !strings.Contains(err.Error(), "not the node Slurm names") {
		t.Errorf("Read(misnamed node) err = %v", err)
	}
	if got, err := r.Read(startStepd(t, dir, 0, 0, "-"), 231); err != nil || len(got) != 0 {
		t.Errorf("Read(empty mount) = %v, %v; want none", got, err)
	}
}
