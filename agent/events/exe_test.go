// SPDX-License-Identifier: Apache-2.0

package events

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// TestJudgeExe: a path is called the program of the access only when the
// process is the same, its exe is the file the kernel saw and the agent's
// own mount namespace resolves the path to that file; otherwise the path
// is kept for what it is: the program run since (changed), the process's
// namespace's name (other_namespace), or an unconfirmed one.
func TestJudgeExe(t *testing.T) {
	errUnknown := fmt.Errorf("x: %w", devfilter.ErrExeUnknown)
	const p, ns = "/usr/bin/true", 4026532179
	for _, tc := range []struct {
		name string
		seen exeSeen
		want exeCheck
	}{
		{"gone", exeSeen{gone: true, path: p, same: true, named: true}, exeCheck{status: audit.ExeExited}},
		{"no link (a kernel thread)", exeSeen{pathErr: unix.ENOENT}, exeCheck{status: audit.ExeUnverified}},
		{"no identity to compare", exeSeen{path: p, sameErr: errUnknown}, exeCheck{now: p, status: audit.ExeUnverified}},
		{"exec while the agent looked", exeSeen{path: p, same: true, named: true, moved: true}, exeCheck{now: p, status: audit.ExeUnverified}},
		{"another file: exec'd since", exeSeen{path: p, same: false}, exeCheck{now: p, status: audit.ExeChanged}},
		{"another file, in a container", exeSeen{path: p, same: false, mntNS: ns}, exeCheck{now: p, status: audit.ExeChanged, mntNS: ns}},
		{"same file, path names it here", exeSeen{path: p, same: true, named: true}, exeCheck{exe: p, status: audit.ExeVerified}},
		{"same file, path names it here too, from a container", exeSeen{path: p, same: true, named: true, mntNS: ns}, exeCheck{exe: p, status: audit.ExeVerified, mntNS: ns}},
		// The attack: a bind mount in the user's own namespace.
		{"same file, another namespace's path", exeSeen{path: p, same: true, named: false, mntNS: ns}, exeCheck{nsPath: p, status: audit.ExeOtherNamespace, mntNS: ns}},
		{"same file, path names it nowhere here", exeSeen{path: "/x (deleted)", same: true, named: false}, exeCheck{now: "/x (deleted)", status: audit.ExeUnverified}},
		{"same file, path not comparable here", exeSeen{path: p, same: true, namedErr: errUnknown}, exeCheck{now: p, status: audit.ExeUnverified}},
		{"same file, path not comparable, another namespace", exeSeen{path: p, same: true, namedErr: errUnknown, mntNS: ns}, exeCheck{now: p, status: audit.ExeUnverified, mntNS: ns}},
		{"same file, path unreadable here", exeSeen{path: p, same: true, named: true, namedErr: unix.EACCES}, exeCheck{now: p, status: audit.ExeUnverified}},
	} {
		if got := judgeExe(tc.seen); got != tc.want {
			t.Errorf("%s: judgeExe = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestCheckExeBindMountSpoof drives checkExe against a real spoof: a
// process in a user and mount namespace of its own (unshare -Urm, which
// needs no privilege where user namespaces are allowed) binds a copy of
// sleep over /usr/bin/true and execs /usr/bin/true. /proc/<pid>/exe reads
// "/usr/bin/true" and is the copy; the node's /usr/bin/true is not.
func TestCheckExeBindMountSpoof(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skipf("skipping: no unshare: %v", err)
	}
	if _, err := os.Stat("/usr/bin/true"); err != nil {
		t.Skipf("skipping: no /usr/bin/true to bind over: %v", err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("skipping: no sleep: %v", err)
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	tool := filepath.Join(t.TempDir(), "mytool")
	if err := os.WriteFile(tool, b, 0o755); err != nil {
		t.Fatal(err)
	}
	// Where user namespaces are refused (user.max_user_namespaces 0, a
	// distribution's sysctl), there is no attack to test: startIn skips.
	pid := startIn(t, "unshare", "-Urm", "sh", "-c", `mount --bind "$0" /usr/bin/true && echo ok && exec /usr/bin/true 60`, tool)
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if link, _ := os.Readlink(filepath.Join(dir, "exe")); link == "/usr/bin/true" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not exec /usr/bin/true", pid)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "exe"), &st); err != nil {
		t.Fatal(err)
	}
	var ns unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "ns", "mnt"), &ns); err != nil {
		t.Fatal(err)
	}
	// The kernel's identity is the superblock's device; where stat shows
	// another (btrfs), SameExe finds the superblock's through mountinfo,
	// which this test does not redo: it then skips.
	id := devfilter.ExeID{Ino: st.Ino, Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev)}
	if same, err := devfilter.SameExe(tool, "/proc/self/mountinfo", id); errors.Is(err, devfilter.ErrExeUnknown) || !same {
		t.Skipf("skipping: stat's device of %s is not its superblock's here (%v)", tool, err)
	}
	ticks, ok := procStart(dir)
	if !ok {
		t.Fatal("no start time")
	}
	got := checkExe("/proc", devfilter.Event{TGID: uint32(pid), Exe: id, Start: time.Duration(ticks) * (time.Second / userHZ)})
	want := exeCheck{nsPath: "/usr/bin/true", status: audit.ExeOtherNamespace, mntNS: ns.Ino}
	if got != want {
		t.Errorf("checkExe of the bind-mounted /usr/bin/true = %+v, want %+v", got, want)
	}
}

// startIn starts argv, waits for its "ok" line, and stops it at the end.
func startIn(t *testing.T, argv ...string) int {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make([]byte, 3)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ok\n" {
		t.Skipf("skipping: %v did not start here (no user namespaces?): %q %v", argv, line, err)
	}
	return cmd.Process.Pid
}

// TestCheckExeNodeNamespace: the path is looked up in the node's mount
// namespace (PID 1's in the agent), not in the agent's own, which systemd
// makes private (PrivateTmp). A stand-in for PID 1 runs in a namespace of
// its own with a tmpfs over one folder; a program run from that folder
// here is, for that namespace, nowhere (other_namespace), one run from
// elsewhere is the same file there (verified, in another namespace than
// the node's); with no readable stand-in, the agent's own namespace
// decides.
func TestCheckExeNodeNamespace(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skipf("skipping: no unshare: %v", err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("skipping: no sleep: %v", err)
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hidden := filepath.Join(dir, "hidden")
	if err := os.Mkdir(hidden, 0o755); err != nil {
		t.Fatal(err)
	}
	inHidden, outside := filepath.Join(hidden, "mytool"), filepath.Join(dir, "mytool")
	for _, p := range []string{inHidden, outside} {
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	node := startIn(t, "unshare", "-Urm", "sh", "-c", `mount -t tmpfs none "$0" && echo ok && exec sleep 60`, hidden)
	var self unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &self); err != nil {
		t.Fatal(err)
	}
	ns := nodeNamespace("/proc", strconv.Itoa(node))
	if ns.ino == self.Ino {
		t.Fatalf("the stand-in's namespace is the test's: %+v", ns)
	}
	for _, tc := range []struct {
		name, prog string
		node       nodeNS
		want       func(path string) exeCheck
	}{
		{"hidden from the node", inHidden, ns, func(p string) exeCheck {
			return exeCheck{nsPath: p, status: audit.ExeOtherNamespace, mntNS: self.Ino}
		}},
		{"the same file on the node", outside, ns, func(p string) exeCheck {
			return exeCheck{exe: p, status: audit.ExeVerified, mntNS: self.Ino}
		}},
		{"no stand-in: the agent's own namespace", inHidden, nodeNamespace("/proc", "0"), func(p string) exeCheck {
			return exeCheck{exe: p, status: audit.ExeVerified}
		}},
	} {
		cmd := exec.Command(tc.prog, "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid
		dir := filepath.Join("/proc", strconv.Itoa(pid))
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if link, _ := os.Readlink(filepath.Join(dir, "exe")); link == tc.prog {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pid %d did not exec %s", pid, tc.prog)
			}
		}
		var st unix.Stat_t
		if err := unix.Stat(tc.prog, &st); err != nil {
			t.Fatal(err)
		}
		id := devfilter.ExeID{Ino: st.Ino, Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev)}
		if same, err := devfilter.SameExe(tc.prog, "/proc/self/mountinfo", id); err != nil || !same {
			t.Skipf("skipping: stat's device of %s is not its superblock's here (%v)", tc.prog, err)
		}
		ticks, _ := procStart(dir)
		got := judgeExe(seeExe("/proc", tc.node, devfilter.Event{TGID: uint32(pid), Exe: id, Start: time.Duration(ticks) * (time.Second / userHZ)}))
		cmd.Process.Kill()
		cmd.Wait()
		if want := tc.want(tc.prog); got != want {
			t.Errorf("%s: checkExe = %+v, want %+v", tc.name, got, want)
		}
	}
}

// checkExe reads /proc/<tgid>/exe, which comes after the access, and says
// whether it is still the program the kernel saw at the access: the same
// process (start time) running the same file (inode, superblock device),
// under a path that names that file in the node's mount namespace. The
// path is read before and after the file is compared, so an exec in
// between is not taken for the program of the access.
func checkExe(proc string, ev devfilter.Event) exeCheck {
	return judgeExe(seeExe(proc, nodeNamespace(proc, "1"), ev))
}
