// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// throwawayUser adds a system group and a user in it (and a second user in
// no such group), removed when the test ends.
func throwawayUser(t *testing.T) (group string, gid, inUID, outUID int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to add a throw-away user and group")
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Skip("no useradd")
	}
	var b [4]byte
	rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	group, in, out := "gfaud"+suffix, "gfrd"+suffix, "gfno"+suffix
	run := func(args ...string) {
		t.Helper()
		if o, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, o)
		}
	}
	run("groupadd", "--system", group)
	t.Cleanup(func() { exec.Command("groupdel", group).Run() })
	run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--gid", group, in)
	t.Cleanup(func() { exec.Command("userdel", in).Run() })
	run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", out)
	t.Cleanup(func() { exec.Command("userdel", out).Run() }) // removes its own group too
	g, err := user.LookupGroup(group)
	must(t, err)
	gid, _ = strconv.Atoi(g.Gid)
	for i, name := range []string{in, out} {
		u, err := user.Lookup(name)
		must(t, err)
		n, _ := strconv.Atoi(u.Uid)
		if i == 0 {
			inUID = n
		} else {
			outUID = n
		}
	}
	return group, gid, inUID, outUID
}

// readAs runs cat as uid with its primary group only: a forwarder's process.
func readAs(path string, uid int) (string, error) {
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil {
		return "", err
	}
	g, _ := strconv.Atoi(u.Gid)
	cmd := exec.Command("cat", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(g), Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestPrivilegedFileReadableByGroup(t *testing.T) {
	group, gid, inUID, outUID := throwawayUser(t)
	// Folders above the audit folder: passable by anyone, as /var/log is.
	base := t.TempDir()
	must(t, os.Chmod(base, 0o711))
	must(t, os.Chmod(filepath.Dir(base), 0o711))
	opts := testOptions(t)
	opts.File = filepath.Join(base, "gpufence", "audit.jsonl")
	opts.FileGroup = group
	p, err := New(opts, nil)
	must(t, err)
	p.Emit(sampleRecords()[0])
	waitFor(t, "record", func() bool { return p.Stats().Sinks["file"].Written == 1 })

	check := func(path string, perm os.FileMode) {
		t.Helper()
		st, err := os.Stat(path)
		must(t, err)
		sys := st.Sys().(*syscall.Stat_t)
		if st.Mode().Perm() != perm || sys.Uid != 0 || int(sys.Gid) != gid {
			t.Errorf("%s: %v %d:%d, want %v 0:%d", path, st.Mode().Perm(), sys.Uid, sys.Gid, perm, gid)
		}
	}
	check(filepath.Dir(opts.File), 0o750)
	check(opts.File, 0o640)
	if out, err := readAs(opts.File, inUID); err != nil || !strings.Contains(out, `"event":"agent_start"`) {
		t.Fatalf("a user of group %s cannot read the audit file: %v %s", group, err, out)
	}
	if out, err := readAs(opts.File, outUID); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("a user outside group %s read the audit file: %v %s", group, err, out)
	}
	// logrotate's create makes the new file root:root 0600; the reopen
	// gives it the group and mode again.
	must(t, os.Rename(opts.File, opts.File+".1"))
	must(t, os.WriteFile(opts.File, nil, 0o600))
	must(t, p.Reopen())
	check(opts.File, 0o640)
	p.Emit(sampleRecords()[1])
	must(t, p.Close())
	if out, err := readAs(opts.File, inUID); err != nil || !strings.Contains(out, `"event":"policy_applied"`) {
		t.Fatalf("after rotation, a user of group %s cannot read the audit file: %v %s", group, err, out)
	}
	// An unknown group is refused with its name.
	opts.FileGroup = "gfnosuchgroup"
	if _, err := New(opts, nil); err == nil || !strings.Contains(err.Error(), `file_group: group "gfnosuchgroup"`) {
		t.Fatalf("unknown group: %v", err)
	}
}
