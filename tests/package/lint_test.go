// SPDX-License-Identifier: Apache-2.0

package pkgtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPackageLint runs lintian on the .deb, rpmlint on the .rpm (with the
// filters of packaging/rpmlintrc) and systemd-analyze verify on the units.
// Errors fail; lintian and rpmlint warnings are logged.
func TestPackageLint(t *testing.T) {
	p := packages(t)
	root := repoRoot(t)

	t.Run("lintian", func(t *testing.T) {
		need(t, "lintian")
		out, err := run(root, "lintian", "--display-info", "--pedantic", "--tag-display-limit", "0", p.deb)
		t.Logf("lintian:\n%s", out)
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "E: ") {
				t.Errorf("lintian error: %s", l)
			}
		}
		if err != nil && !strings.Contains(out, "E: ") {
			// Exit status 2 also means errors; anything else is a failure
			// of lintian itself.
			t.Errorf("lintian: %v", err)
		}
	})

	t.Run("rpmlint", func(t *testing.T) {
		need(t, "rpmlint", "rpm2cpio", "cpio")
		// nfpm's rpm payload has absolute paths (goreleaser/nfpm#1122) and
		// rpmlint unpacks it with `rpm2cpio | cpio -id` in a temporary
		// folder: run as root that writes the package into /. A cpio that
		// strips the leading / keeps it in rpmlint's folder.
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "cpio"), "#!/bin/sh\nexec /usr/bin/cpio --no-absolute-filenames --quiet \"$@\"\n", 0o755)
		// Fedora and RHEL compress man pages with gzip (rpmlint's default
		// expects bzip2, openSUSE's choice).
		writeFile(t, filepath.Join(dir, "rpmlint.toml"), "CompressExtension = \"gz\"\n", 0o644)
		before := hostHas()
		cmd := exec.Command("rpmlint", "-c", filepath.Join(dir, "rpmlint.toml"), "-r", filepath.Join(root, "packaging/rpmlintrc"), p.rpm)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"))
		b, err := cmd.CombinedOutput()
		out := string(b)
		t.Logf("rpmlint:\n%s", out)
		if after := hostHas(); after != before {
			t.Fatalf("rpmlint wrote the package into this machine's / (%s exists now): remove it by hand", after)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, ": E: ") {
				t.Errorf("rpmlint error: %s", l)
			}
		}
		if !regexp.MustCompile(` 0 errors, \d+ warnings`).MatchString(out) {
			t.Errorf("rpmlint did not report 0 errors (%v)", err)
		}
	})

	t.Run("systemd-analyze", func(t *testing.T) {
		need(t, "systemd-analyze", "dpkg-deb")
		// verify needs the units' dependencies (sysinit.target, ...) and
		// ExecStart/ExecReload's programs under --root: the unpacked .deb
		// plus this machine's systemd units and kill.
		r := t.TempDir()
		if out, err := run(root, "dpkg-deb", "-x", p.deb, r); err != nil {
			t.Fatalf("dpkg-deb -x: %v\n%s", err, out)
		}
		if out, err := run(root, "cp", "-an", "/lib/systemd/system/.", filepath.Join(r, "lib/systemd/system/")); err != nil {
			t.Fatalf("copy the host's units: %v\n%s", err, out)
		}
		if out, err := run(root, "install", "-D", "/bin/kill", filepath.Join(r, "bin/kill")); err != nil {
			t.Fatalf("copy kill: %v\n%s", err, out)
		}
		out, err := run(root, "systemd-analyze", "verify", "--man=no", "--root="+r,
			"/lib/systemd/system/gpufence.socket", "/lib/systemd/system/gpufence.service")
		// verify exits 0 on unknown keys and bad values; it prints them.
		if err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	})
}

// hostHas names the first of the package's own folders that exists on this
// machine, "" when none does.
func hostHas() string {
	for _, p := range []string{"/usr/lib/gpufence", "/etc/gpufence", "/usr/share/gpufence", "/usr/share/doc/gpufence"} {
		if _, err := os.Lstat(p); err == nil {
			return p
		}
	}
	return ""
}
