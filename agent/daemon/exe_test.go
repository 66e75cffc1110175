// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// The exe helper: the test binary, under whatever name it was exec'd,
// opens GPUFENCE_TEST_EXE_OPEN, prints the errno's name, then either execs
// GPUFENCE_TEST_EXE_THEN or waits for stdin to close, so that the process
// lives, running this file, while the agent looks at it.
func init() {
	path := os.Getenv("GPUFENCE_TEST_EXE_OPEN")
	if path == "" {
		return
	}
	res := "OK"
	if fd, err := unix.Open(path, unix.O_RDWR, 0); err != nil {
		res = unix.ErrnoName(err.(unix.Errno))
	} else {
		unix.Close(fd)
	}
	fmt.Println(res)
	if then := os.Getenv("GPUFENCE_TEST_EXE_THEN"); then != "" {
		err := syscall.Exec(then, []string{filepath.Base(then), "60"}, nil)
		fmt.Fprintln(os.Stderr, "exec:", err)
		os.Exit(1)
	}
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// gatedRecorder holds, in Emit, the gpu_access record of one device minor
// until opened: the agent's attribution stage waits there, and the
// kernel's next events queue behind it, so a test can act before the agent
// reads /proc for them.
type gatedRecorder struct {
	*audittest.Recorder
	minor           uint32
	entered, opened chan struct{}
	once            sync.Once
}

func (g *gatedRecorder) Emit(r audit.Record) {
	if r.Event == audit.EventGPUAccess && r.Device != nil && r.Device.Minor == g.minor {
		g.once.Do(func() { close(g.entered) })
		<-g.opened
	}
	g.Recorder.Emit(r)
}

// exeTool is a copy of the test binary that an unprivileged user may run,
// and fake GPUs that user may reach, in a folder of the test's own.
type exeTool struct {
	dir, path string
}

func newExeTool(t *testing.T) exeTool {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpufence-exe-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	x := exeTool{dir: dir, path: filepath.Join(dir, "mytool")}
	if err := os.WriteFile(x.path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, m := range []uint32{0, 1, 3} {
		node := filepath.Join(dir, fmt.Sprintf("nvidia%d", m))
		if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(195, m))); err != nil {
			t.Fatal(err)
		}
		// Past the umask: the user opens it read-write.
		if err := os.Chmod(node, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	return x
}

// exeProc is a helper process in a task cgroup, as the job user (nobody).
type exeProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	pid   uint32
}

// startExe starts argv as nobody in cgroup dir with the helper's
// environment and waits for its open's errno, which must be EPERM.
func (tr *tree) startExe(dir string, env []string, argv ...string) exeProc {
	tr.t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	cmd.Stderr = testWriter{tr.t}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tr.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tr.t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		tr.t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if got := strings.TrimSpace(line); got != "EPERM" {
		tr.t.Fatalf("%v: open gave %q (%v), want EPERM", argv, got, err)
	}
	return exeProc{cmd: cmd, stdin: stdin, pid: uint32(cmd.Process.Pid)}
}

// record waits for the gpu_access record of pid.
func (tr *tree) record(pid uint32) audit.Record {
	tr.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, r := range tr.rec.Records(audit.EventGPUAccess) {
			if r.PID == pid {
				return r
			}
		}
		if time.Now().After(deadline) {
			tr.t.Fatalf("no gpu_access record of pid %d", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// isFile says whether the record's exe_dev/exe_ino (the file as the kernel
// saw it at the access) is the file at path here.
func isFile(t *testing.T, r audit.Record, path string) bool {
	t.Helper()
	ma, mi, ok := strings.Cut(r.ExeDev, ":")
	major, err1 := strconv.ParseUint(ma, 10, 32)
	minor, err2 := strconv.ParseUint(mi, 10, 32)
	if !ok || err1 != nil || err2 != nil || r.ExeIno == 0 {
		t.Errorf("record has no exe_dev/exe_ino: %+v", r)
		return false
	}
	same, err := devfilter.SameExe(path, "/proc/self/mountinfo", devfilter.ExeID{Ino: r.ExeIno, Major: uint32(major), Minor: uint32(minor)})
	if err != nil {
		t.Fatal(err)
	}
	return same
}

// TestPrivilegedExeBindMountSpoof is issue 18's attack 4 under the real
// filter and the agent's real event path: an unprivileged job user makes a
// user and mount namespace of their own (unshare -Urm), binds their own
// program over /usr/bin/true there and execs /usr/bin/true, which opens a
// GPU the job was not given. /proc/<pid>/exe then reads "/usr/bin/true"
// and is the file the kernel saw; only the node's /usr/bin/true is another
// file. The record must not call /usr/bin/true the program: it carries the
// kernel's device and inode of the user's file, and the path only as the
// namespace's. The same program run by its own path is still verified,
// and one that opens and then execs another is still "changed".
func TestPrivilegedExeBindMountSpoof(t *testing.T) {
	tr := newTree(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skipf("skipping: no unshare: %v", err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	if sleep, err = filepath.EvalSymlinks(sleep); err != nil {
		t.Fatal(err)
	}
	var trueSt unix.Stat_t
	if err := unix.Stat("/usr/bin/true", &trueSt); err != nil {
		t.Skipf("skipping: no /usr/bin/true to bind over: %v", err)
	}
	x := newExeTool(t)
	gate := &gatedRecorder{Recorder: tr.rec, minor: 1, entered: make(chan struct{}), opened: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(gate.opened) }) }
	mode, _ := devfilter.Probe()
	d, _ := tr.daemonWithRecorder(mode, nil, gate)
	// Before the daemon's own cleanup (cleanups run last first): Close
	// waits for the stage the gate may hold.
	t.Cleanup(release)

	task := tr.mkdir("job_1/step_0/user/task_0")
	stepd := tr.sleeper(tr.mkdir("job_1/step_0/slurm"))
	if r := call(d, 0, &pb.JobProlog{JobId: 1, Uid: 65534, JobGpus: ptr("2")}); r.Error != "" {
		t.Fatalf("prolog: %s", r.Error)
	}
	if r := call(d, stepd, &pb.StepStart{JobId: 1, StepId: 0, Uid: 65534, StepGpus: ptr("2")}); r.Error != "" {
		t.Fatalf("step start: %s", r.Error)
	}

	// The attack.
	spoof := tr.startExe(task, []string{"GPUFENCE_TEST_EXE_OPEN=" + filepath.Join(x.dir, "nvidia0")},
		"unshare", "-Urm", "sh", "-c", `mount --bind "$0" /usr/bin/true && exec /usr/bin/true`, x.path)
	if link, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", spoof.pid)); link != "/usr/bin/true" {
		t.Fatalf("the spoof runs %q, want /usr/bin/true: the attack did not happen", link)
	}
	r := tr.record(spoof.pid)
	t.Logf("spoofed: exe %q exe_status %q exe_now %q exe_namespace_path %q exe_mnt_ns %d exe %s/%d; message %q",
		r.Exe, r.ExeStatus, r.ExeNow, r.ExeNamespacePath, r.ExeMntNS, r.ExeDev, r.ExeIno, r.Message)
	if r.ExeStatus == audit.ExeVerified || r.Exe != "" {
		t.Errorf("the bind-mounted /usr/bin/true is recorded as verified program %q (exe_status %q): %+v", r.Exe, r.ExeStatus, r)
	}
	if !isFile(t, r, x.path) || r.ExeIno == trueSt.Ino {
		t.Errorf("record's exe_dev %s exe_ino %d, want the user's file %s (the node's /usr/bin/true is inode %d)", r.ExeDev, r.ExeIno, x.path, trueSt.Ino)
	}
	var ns unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/mnt", spoof.pid), &ns); err != nil {
		t.Fatal(err)
	}
	if r.ExeStatus != audit.ExeOtherNamespace || r.ExeNamespacePath != "/usr/bin/true" || r.ExeNow != "" || r.ExeMntNS != ns.Ino {
		t.Errorf("record: exe_status %q exe_namespace_path %q exe_now %q exe_mnt_ns %d, want other_namespace, /usr/bin/true, none, %d",
			r.ExeStatus, r.ExeNamespacePath, r.ExeNow, r.ExeMntNS, ns.Ino)
	}
	if !strings.Contains(r.Message, "/usr/bin/true") || !strings.Contains(r.Message, r.ExeDev) {
		t.Errorf("message %q does not say the path is the namespace's and name the file", r.Message)
	}

	// The same program by its own path; its record waits in the gate, and
	// the next process's event queues behind it.
	plain := tr.startExe(task, []string{"GPUFENCE_TEST_EXE_OPEN=" + filepath.Join(x.dir, "nvidia1")}, x.path)
	select {
	case <-gate.entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("no record of pid %d reached the recorder", plain.pid)
	}
	// Opens, then execs sleep before the agent reads its /proc.
	replaced := tr.startExe(task, []string{"GPUFENCE_TEST_EXE_OPEN=" + filepath.Join(x.dir, "nvidia3"), "GPUFENCE_TEST_EXE_THEN=" + sleep}, x.path)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if link, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", replaced.pid)); link == sleep {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not exec %s", replaced.pid, sleep)
		}
	}
	release()
	r = tr.record(plain.pid)
	if r.ExeStatus != audit.ExeVerified || r.Exe != x.path || !isFile(t, r, x.path) {
		t.Errorf("plain exec: exe %q exe_status %q (%s/%d), want verified %s", r.Exe, r.ExeStatus, r.ExeDev, r.ExeIno, x.path)
	}
	r = tr.record(replaced.pid)
	if r.ExeStatus != audit.ExeChanged || r.Exe != "" || r.ExeNow != sleep || !isFile(t, r, x.path) {
		t.Errorf("exec'd after the open: exe %q exe_status %q exe_now %q (%s/%d), want changed, exe_now %s, the file %s",
			r.Exe, r.ExeStatus, r.ExeNow, r.ExeDev, r.ExeIno, sleep, x.path)
	}
}
