// SPDX-License-Identifier: Apache-2.0

package status

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/statefile"
)

// shortDir is a folder whose socket paths fit sun_path.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gfst")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestProbeSocket(t *testing.T) {
	dir := shortDir(t)
	uid := uint32(os.Geteuid())

	if s := ProbeSocket(filepath.Join(dir, "none.sock")); !errors.Is(s.StatErr, unix.ENOENT) || s.IsSocket || s.Listening {
		t.Errorf("missing socket: %+v", s)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if s := ProbeSocket(file); s.StatErr != nil || s.IsSocket || s.Listening {
		t.Errorf("regular file: %+v", s)
	}

	// Bound, nobody listening: a socket left by an agent that died.
	stale := filepath.Join(dir, "stale.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: stale}); err != nil {
		t.Fatal(err)
	}
	s := ProbeSocket(stale)
	if !s.IsSocket || s.Listening || s.DialErr == nil || s.UID != uid {
		t.Errorf("stale socket: %+v", s)
	}
	if err := s.ListenerErr(uid); err == nil {
		t.Error("ListenerErr of a socket nobody listens on is nil")
	}
	if a := agentReport(s, uid); !a.SocketExists || a.Listening || a.Error == "" || a.Untrusted != "" {
		t.Errorf("stale socket report: %+v", a)
	}

	// This process listening: trusted as its own uid, not as another.
	live := filepath.Join(dir, "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s = ProbeSocket(live)
	if !s.Listening || !s.PeerKnown || s.PeerUID != uid || s.PeerPID != int32(os.Getpid()) || s.PeerComm == "" {
		t.Fatalf("live socket: %+v", s)
	}
	if err := s.ListenerErr(uid); err != nil {
		t.Errorf("ListenerErr(own uid %d) = %v", uid, err)
	}
	if err := s.OwnerErr(uid); err != nil {
		t.Errorf("OwnerErr(own uid %d) = %v", uid, err)
	}
	other := uid + 1
	if err := s.ListenerErr(other); err == nil || !strings.Contains(err.Error(), "not the agent") {
		t.Errorf("ListenerErr(uid %d) of a listener of uid %d = %v", other, uid, err)
	}
	a := agentReport(s, other)
	if a.Untrusted == "" || a.ListenerUID == nil || *a.ListenerUID != uid || a.WantUID != other {
		t.Errorf("report for another uid: %+v", a)
	}
	in := consistentInput(t)
	in.Agent = a
	if r := Build(in); r.OK || len(r.Problems) != 1 || !strings.HasPrefix(r.Problems[0], "agent: the socket ") {
		t.Errorf("listener of another uid: problems %q", r.Problems)
	}
}

// TestPrivilegedListenerOfAnotherUID: a socket file that is root's, on
// which a process of another uid listens (it called listen() after
// dropping its credentials), is not the agent's; status says so and
// reports the uid, and the agent's own uid is required for trust.
func TestPrivilegedListenerOfAnotherUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (listens as another uid)")
	}
	const nobody = 65534
	dir := shortDir(t)
	p := filepath.Join(dir, "agent.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: p}); err != nil {
		t.Fatal(err)
	}
	// The kernel records the listener's credentials at listen(). Drop
	// them on one OS thread only (raw syscalls, not Go's all-threads
	// setuid); the thread ends with the goroutine, still locked.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, nobody, nobody, nobody); e != 0 {
			errc <- e
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, nobody, nobody, nobody); e != 0 {
			errc <- e
			return
		}
		if uid, _, _ := unix.RawSyscall(unix.SYS_GETEUID, 0, 0, 0); uid != nobody {
			errc <- errors.New("credentials not dropped")
			return
		}
		errc <- unix.Listen(fd, 8)
	}()
	if err := <-errc; err != nil {
		t.Fatalf("listen as uid %d: %v", nobody, err)
	}
	if os.Geteuid() != 0 {
		t.Fatal("the test process lost root: the credentials were dropped process-wide")
	}

	s := ProbeSocket(p)
	if !s.Listening || !s.PeerKnown || s.PeerUID != nobody || s.UID != 0 {
		t.Fatalf("probe: %+v", s)
	}
	if err := s.OwnerErr(0); err != nil {
		t.Errorf("OwnerErr(0) of root's socket file = %v", err)
	}
	err = s.ListenerErr(0)
	if err == nil || !strings.Contains(err.Error(), "runs as uid 65534, not 0: not the agent") {
		t.Fatalf("ListenerErr(0) of a listener of uid %d = %v", nobody, err)
	}
	if err := s.ListenerErr(nobody); err != nil {
		t.Errorf("ListenerErr(%d) = %v", nobody, err)
	}
	in := consistentInput(t)
	in.Agent = agentReport(s, 0)
	r := Build(in)
	if r.OK || len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "runs as uid 65534, not 0") {
		t.Fatalf("problems %q, want the listener's uid", r.Problems)
	}
	var out strings.Builder
	Write(&out, r)
	if !strings.Contains(out.String(), "NOT THE AGENT") || strings.Contains(out.String(), "up (pid") {
		t.Errorf("text output:\n%s", out.String())
	}
}

// TestTableDevices: the state's GPU table resolves as the agent resolved
// it, and a table whose files are not GPUs is an error, not a guess.
func TestTableDevices(t *testing.T) {
	dir := t.TempDir()
	tbl := &statefile.GPUTable{GPUs: []statefile.TableGPU{
		{Index: 0, Files: []string{filepath.Join(dir, "nvidia3")}},
		{Index: 1, Files: []string{filepath.Join(dir, "nvidia1")}},
	}}
	devs, err := tableDevices(tbl, nil)
	if err != nil || len(devs) != 2 || devs[0].GPUMinor != 3 || devs[1].GPUMinor != 1 {
		t.Fatalf("tableDevices = %+v, %v", devs, err)
	}
	notDev := filepath.Join(dir, "nvidia2")
	if err := os.WriteFile(notDev, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tbl.GPUs = append(tbl.GPUs, statefile.TableGPU{Index: 2, Files: []string{notDev}})
	if devs, err := tableDevices(tbl, nil); err == nil || !strings.Contains(err.Error(), "not a character device") {
		t.Errorf("a regular file as GPU: %+v, %v", devs, err)
	}
	tbl.GPUs = []statefile.TableGPU{{Index: 0}}
	if _, err := tableDevices(tbl, nil); err == nil {
		t.Error("a GPU without files resolved")
	}
}
