// SPDX-License-Identifier: Apache-2.0

package pkgtest

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpufence/gpufence/tests/debroot"
)

// The Debian 12 root the packages are installed into: debootstrap's
// minbase with Slurm 22.05's daemons and clients (as on a node) and systemd
// (installed, not running: as in a node image being built); tests/debroot
// builds it once per machine.
const rootSuite = "bookworm"

// freshRoot unpacks the cached root of suite into a temporary folder.
func freshRoot(t *testing.T, suite string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("installing into a debootstrap root needs root (chroot, device nodes)")
	}
	need(t, "chroot", "tar")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	tarball, err := debroot.Tarball(ctx, suite, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := debroot.Unpack(ctx, tarball, root); err != nil {
		t.Fatal(err)
	}
	return root
}

// inRoot runs a shell script chrooted into root, as dpkg's and rpm's
// maintainer scripts run: no systemd, no /proc.
func inRoot(root, script string) (string, error) {
	cmd := exec.Command("chroot", root, "/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LC_ALL=C", "HOME=/root", "DEBIAN_FRONTEND=noninteractive"}
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

func mustInRoot(t *testing.T, root, script string) string {
	t.Helper()
	out, err := inRoot(root, script)
	if err != nil {
		t.Fatalf("in the root: %s: %v\n%s", script, err, out)
	}
	return out
}

// snapshot lists every path under root, with type and mode, except those
// that dpkg and rpm keep for themselves.
func snapshot(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	// run/systemd: systemd-analyze verify's own runtime files.
	skip := regexp.MustCompile(`^/(var/lib/dpkg|var/lib/rpm|usr/lib/sysimage/rpm|var/log/dpkg\.log|var/log/alternatives\.log|var/cache/ldconfig|root/\.rpmdb|tmp|run/systemd)(/|$)`)
	paths := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, root)
		if rel == "" || skip.MatchString(rel) {
			if d.IsDir() && rel != "" {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		paths[rel] = info.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

// leftovers lists paths in after that were not in before.
func leftovers(before, after map[string]fs.FileMode) []string {
	var left []string
	for p := range after {
		if _, ok := before[p]; !ok {
			left = append(left, p)
		}
	}
	sort.Strings(left)
	return left
}

// srunLoads makes the root's real Slurm 22.05 load the plugin: srun --help
// reads plugstack.conf, which includes the package's snippet, and loads
// every plugin it names (a required one that fails to load fails srun).
func srunLoads(root string) (string, error) {
	return inRoot(root, `set -e
mkdir -p /tmp/gf-slurm
cat > /tmp/gf-slurm/slurm.conf <<EOF
ClusterName=pkgtest
SlurmctldHost=localhost
PlugStackConfig=/tmp/gf-slurm/plugstack.conf
NodeName=localhost CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES
EOF
echo 'include /etc/slurm/plugstack.conf.d/*.conf' > /tmp/gf-slurm/plugstack.conf
SLURM_CONF=/tmp/gf-slurm/slurm.conf srun --help >/dev/null`)
}

func checkMode(t *testing.T, root, path string, want fs.FileMode) {
	t.Helper()
	info, err := os.Lstat(filepath.Join(root, path))
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	if info.Mode() != want {
		t.Errorf("%s has mode %v, want %v", path, info.Mode(), want)
	}
}

func checkGone(t *testing.T, root string, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s is still there", p)
		}
	}
}

func copyInto(t *testing.T, src, dir string) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, filepath.Base(src))
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestPrivilegedDebInstall installs the .deb with dpkg into a fresh Debian
// 12 root with slurmd, checks the maintainer scripts' work and that the real
// Slurm loads the linked plugin, reinstalls it (upgrade path), removes and
// purges it, and checks that nothing of it is left.
func TestPrivilegedDebInstall(t *testing.T) {
	p := packages(t)
	root := freshRoot(t, rootSuite)
	if got := mustInRoot(t, root, "slurmd -V"); !strings.Contains(got, "22.05") {
		t.Fatalf("the root's slurmd is %q, want 22.05", got)
	}
	before := snapshot(t, root)
	deb := "/tmp/" + filepath.Base(copyInto(t, p.deb, filepath.Join(root, "tmp")))

	out := mustInRoot(t, root, "dpkg -i "+deb)
	t.Logf("dpkg -i:\n%s", out)
	for _, msg := range []string{
		"linked /usr/lib/gpufence/spank_gpufence.so -> slurm-22.05/spank_gpufence.so (Slurm 22.05",
		"include /etc/slurm/plugstack.conf.d/*.conf",
		"Restart slurmd once",
		"/opt/slurm/etc/plugstack.conf.d/gpufence.conf",
	} {
		if !strings.Contains(out, msg) {
			t.Errorf("dpkg -i output lacks %q", msg)
		}
	}
	if regexp.MustCompile(`(?i)(warning|error|not found|syntax)`).MatchString(out) {
		t.Errorf("maintainer scripts complained:\n%s", out)
	}

	// Files where the layout says, with their modes.
	for path, mode := range want {
		checkMode(t, root, path, mode)
	}
	checkMode(t, root, "/lib/systemd/system/gpufence.service", 0o644)
	checkMode(t, root, "/var/lib/gpufence", fs.ModeDir|0o700)
	checkMode(t, root, "/var/spool/gpufence", fs.ModeDir|0o700)
	checkMode(t, root, "/var/log/gpufence", fs.ModeDir|0o750)
	if target, err := os.Readlink(filepath.Join(root, "usr/lib/gpufence/spank_gpufence.so")); err != nil || target != "slurm-22.05/spank_gpufence.so" {
		t.Errorf("plugin link -> %q (%v), want slurm-22.05/spank_gpufence.so", target, err)
	}
	// Enabled for the next boot (systemd does not run in the root, so
	// nothing is started).
	for _, l := range []string{"etc/systemd/system/multi-user.target.wants/gpufence.service", "etc/systemd/system/sockets.target.wants/gpufence.socket"} {
		if _, err := os.Lstat(filepath.Join(root, l)); err != nil {
			t.Errorf("not enabled: %v", err)
		}
	}
	if out := mustInRoot(t, root, "gpufence version"); !strings.HasPrefix(out, "gpufence ") {
		t.Errorf("gpufence version: %q", out)
	}

	// The real Slurm loads the linked plugin, and refuses the one built for
	// another release: the link matters.
	if out, err := srunLoads(root); err != nil {
		t.Errorf("srun --help with the package's plugstack snippet: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/lib/gpufence/slurm-24.11")); err == nil {
		mustInRoot(t, root, "/usr/lib/gpufence/link-plugin 24.11")
		out, err := srunLoads(root)
		if err == nil || !strings.Contains(out, "spank_gpufence.so") {
			t.Errorf("srun loaded the 24.11 plugin into Slurm 22.05 (%v):\n%s", err, out)
		} else {
			t.Logf("Slurm 22.05 refuses the 24.11 plugin, as it should:\n%s", tail(out, 3))
		}
		if out := mustInRoot(t, root, "/usr/lib/gpufence/link-plugin 2>&1"); !strings.Contains(out, "slurm-22.05") {
			t.Errorf("link-plugin did not relink 22.05: %s", out)
		}
	}

	installedE2E(t, root)

	if out, err := inRoot(root, "systemd-analyze verify --man=no /lib/systemd/system/gpufence.socket /lib/systemd/system/gpufence.service"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify in the root: %v\n%s", err, out)
	}

	// Reinstall: postinst configure with the old version (the upgrade path).
	out = mustInRoot(t, root, "dpkg -i "+deb)
	if strings.Contains(out, "Restart slurmd once") {
		t.Error("an upgrade repeats the first-install notice")
	}

	// What the agent would leave: purge removes it too.
	for _, f := range []string{"var/log/gpufence/audit.jsonl", "var/lib/gpufence/state.json", "var/spool/gpufence/failopen.jsonl"} {
		writeFile(t, filepath.Join(root, f), "{}\n", 0o600)
	}
	// Removal detaches a filter the agent pinned: prerm deletes the pin
	// folder (and only a folder inside bpffs, never the mount). A bpffs of
	// our own at the root's /sys/fs/bpf stands for the node's.
	bpf := filepath.Join(root, "sys/fs/bpf")
	mounted := false
	if err := os.MkdirAll(bpf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("bpf", bpf, "bpf", 0, "mode=0700"); err != nil {
		t.Logf("cannot mount a bpffs (%v): the unpin step is not checked", err)
	} else {
		mounted = true
		t.Cleanup(func() { syscall.Unmount(bpf, syscall.MNT_DETACH) })
		for _, d := range []string{"gpufence/links", "other-tool"} {
			if err := os.MkdirAll(filepath.Join(bpf, d), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		// An admin's pin_dir at the mount itself must not wipe the mount.
		f, err := os.OpenFile(filepath.Join(root, "etc/gpufence/agent.yaml"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(f, "pin_dir: /sys/fs/bpf")
		f.Close()
	}
	out = mustInRoot(t, root, "dpkg -r gpufence")
	t.Logf("dpkg -r:\n%s", out)
	if mounted {
		if _, err := os.Stat(filepath.Join(bpf, "gpufence")); err == nil {
			t.Error("dpkg -r left the pinned filter /sys/fs/bpf/gpufence")
		}
		if _, err := os.Stat(filepath.Join(bpf, "other-tool")); err != nil {
			t.Errorf("dpkg -r removed another tool's pins: %v", err)
		}
		if err := syscall.Unmount(bpf, 0); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(filepath.Join(root, "sys/fs"))
	}
	if !strings.Contains(out, "still names /usr/lib/gpufence/spank_gpufence.so") {
		t.Error("dpkg -r does not warn that the kept plugstack snippet names a removed plugin")
	}
	checkGone(t, root, "/usr/sbin/gpufence", "/usr/lib/gpufence", "/lib/systemd/system/gpufence.service")
	if _, err := os.Stat(filepath.Join(root, "etc/gpufence/agent.yaml")); err != nil {
		t.Errorf("dpkg -r removed a conffile: %v", err)
	}
	out = mustInRoot(t, root, "dpkg -P gpufence")
	t.Logf("dpkg -P:\n%s", out)
	if left := leftovers(before, snapshot(t, root)); len(left) > 0 {
		t.Errorf("left after purge: %v", left)
	}
}

// TestPrivilegedRPMInstall installs the .rpm with rpm --root into a fresh
// copy of the same Debian root (its /bin/sh runs the scriptlets), checks
// the files and the plugin link, and erases it. --nodeps: the root's glibc
// is a Debian package the rpm database does not know, so the rpm's
// libc.so.6(GLIBC_2.34)(64bit) requirement cannot be resolved there.
func TestPrivilegedRPMInstall(t *testing.T) {
	p := packages(t)
	need(t, "rpm")
	root := freshRoot(t, rootSuite)
	// On RPM distributions the filesystem package owns /usr/share/licenses;
	// the Debian root stands in for it.
	if err := os.MkdirAll(filepath.Join(root, "usr/share/licenses"), 0o755); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, root)
	if out, err := run("/", "rpm", "--root", root, "--initdb"); err != nil {
		t.Fatalf("rpm --initdb: %v\n%s", err, out)
	}
	out, err := run("/", "rpm", "--root", root, "-i", "--nodeps", p.rpm)
	t.Logf("rpm -i:\n%s", out)
	if err != nil {
		t.Fatalf("rpm -i: %v", err)
	}
	for _, msg := range []string{"linked /usr/lib/gpufence/spank_gpufence.so -> slurm-22.05/spank_gpufence.so", "systemctl enable --now", "Restart slurmd once"} {
		if !strings.Contains(out, msg) {
			t.Errorf("rpm -i output lacks %q", msg)
		}
	}
	if regexp.MustCompile(`(?i)(warning|error|scriptlet failed)`).MatchString(out) {
		t.Errorf("rpm complained:\n%s", out)
	}
	for path, mode := range want {
		checkMode(t, root, path, mode)
	}
	checkMode(t, root, "/usr/lib/systemd/system/gpufence.service", 0o644)
	// systemctl preset decides; Debian's presets (this root) enable.
	_, err = os.Lstat(filepath.Join(root, "etc/systemd/system/multi-user.target.wants/gpufence.service"))
	t.Logf("after systemctl preset, gpufence.service enabled: %v", err == nil)
	checkMode(t, root, "/var/lib/gpufence", fs.ModeDir|0o700)
	checkMode(t, root, "/var/log/gpufence", fs.ModeDir|0o750)
	if target, err := os.Readlink(filepath.Join(root, "usr/lib/gpufence/spank_gpufence.so")); err != nil || target != "slurm-22.05/spank_gpufence.so" {
		t.Errorf("plugin link -> %q (%v), want slurm-22.05/spank_gpufence.so", target, err)
	}
	if out, err := srunLoads(root); err != nil {
		t.Errorf("srun --help with the package's plugstack snippet: %v\n%s", err, out)
	}
	q, _ := run("/", "rpm", "--root", root, "-ql", "gpufence")
	if !strings.Contains(q, "/usr/sbin/gpufence") || strings.Contains(q, "/usr/lib/gpufence/spank_gpufence.so\n") {
		t.Errorf("rpm -ql gpufence:\n%s", q)
	}

	out, err = run("/", "rpm", "--root", root, "-e", "gpufence")
	t.Logf("rpm -e:\n%s", out)
	if err != nil || strings.Contains(out, "warning") {
		t.Errorf("rpm -e: %v\n%s", err, out)
	}
	// RPM keeps what the package did not install: the folders that
	// systemd-tmpfiles made (the agent's state, spool and audit trail).
	var left []string
	for _, l := range leftovers(before, snapshot(t, root)) {
		if l != "/var/lib/gpufence" && l != "/var/spool/gpufence" && l != "/var/log/gpufence" {
			left = append(left, l)
		}
	}
	if len(left) > 0 {
		t.Errorf("left after rpm -e: %v", left)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/lib/gpufence")); err == nil {
		t.Error("/usr/lib/gpufence is left")
	}
}

// installedE2E runs the end-to-end isolation test (real Slurm, real kernel)
// against the files dpkg put into root, through the suite's one switch,
// GPUFENCE_INSTALL_ROOT: the installed binary and the plugin link
// link-plugin made, not the build tree.
func installedE2E(t *testing.T, root string) {
	t.Helper()
	start := time.Now()
	// srun and sbatch run as the test user and load the plugin from the
	// root: open up the test's own temporary folders above it.
	for d := root; d != filepath.Clean(os.TempDir()) && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-count=1", "-v", "-run", "^TestPrivilegedIsolation$", "./tests/e2e")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "GPUFENCE_INSTALL_ROOT="+root)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("e2e isolation test against the installed package: %v\n%s", err, tail(string(out), 60))
	}
	using := "testing " + filepath.Join(root, "usr/sbin/gpufence") + " and " + filepath.Join(root, "usr/lib/gpufence/spank_gpufence.so")
	if !strings.Contains(string(out), using) || !strings.Contains(string(out), "--- PASS: TestPrivilegedIsolation") {
		t.Fatalf("the e2e run did not test the installed files (want %q and a PASS):\n%s", using, tail(string(out), 60))
	}
	t.Logf("e2e TestPrivilegedIsolation passed against the installed package in %s", time.Since(start).Round(time.Second))
}

// TestPrivilegedDebInstallNewerSlurm installs the .deb into Debian roots
// with newer Slurm releases (trixie: 24.11; GPUFENCE_PKG_SUITES adds others,
// e.g. sid, which changes daily and so is not in CI) and checks that the
// install links the plugin built for that release and that its srun loads
// it: each slurm-X.Y build works in its own Slurm, not only 22.05's.
func TestPrivilegedDebInstallNewerSlurm(t *testing.T) {
	p := packages(t)
	suites := strings.Fields(os.Getenv("GPUFENCE_PKG_SUITES"))
	if len(suites) == 0 {
		suites = []string{"trixie"}
	}
	for _, suite := range suites {
		t.Run(suite, func(t *testing.T) {
			root := freshRoot(t, suite)
			v := mustInRoot(t, root, "slurmd -V")
			mm := regexp.MustCompile(`(\d+)\.(\d+)`).FindString(v)
			if mm == "" {
				t.Fatalf("slurmd -V in %s: %q", suite, v)
			}
			deb := "/tmp/" + filepath.Base(copyInto(t, p.deb, filepath.Join(root, "tmp")))
			out := mustInRoot(t, root, "dpkg -i "+deb)
			want := "slurm-" + mm + "/spank_gpufence.so"
			if target, err := os.Readlink(filepath.Join(root, "usr/lib/gpufence/spank_gpufence.so")); err != nil || target != want {
				t.Fatalf("%s (%s): plugin link -> %q (%v), want %s\n%s", suite, strings.TrimSpace(v), target, err, want, out)
			}
			if out, err := srunLoads(root); err != nil {
				t.Fatalf("%s: srun %s does not load the %s plugin: %v\n%s", suite, mm, mm, err, out)
			}
			// The check can fail: the 22.05 build is refused by this srun.
			mustInRoot(t, root, "/usr/lib/gpufence/link-plugin 22.05")
			if out, err := srunLoads(root); err == nil {
				t.Fatalf("%s: srun %s loaded the 22.05 plugin:\n%s", suite, mm, out)
			}
			t.Logf("%s: %s links and loads %s, and refuses slurm-22.05", suite, strings.TrimSpace(v), want)
			mustInRoot(t, root, "dpkg -P gpufence")
		})
	}
}
