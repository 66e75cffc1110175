// SPDX-License-Identifier: Apache-2.0

// Package containers gives the end-to-end tests the container runtimes
// GPU clusters run jobs in: NVIDIA's pyxis (a SPANK plugin) with enroot, and
// Apptainer, each built once per machine from its upstream release tarball
// (../shared/container-src, checked against its SHA256SUMS) into
// CacheDir()/<key> by build.sh, and a small local image (busybox and the
// gf-open prober) as a rootfs folder, an enroot SquashFS file and an
// Apptainer sandbox. Nothing comes from a registry.
package containers

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpufence/gpufence/tests/debroot"
	"github.com/gpufence/gpufence/tests/slurmrel"
)

// CacheDir holds the builds, one folder per tarball checksum and recipe
// (and, for pyxis, spank.h checksum), under the tests' cache.
func CacheDir() string { return filepath.Join(debroot.CacheBase(), "containers") }

// Tarballs are the release sources this package builds.
const (
	EnrootTarball    = "enroot-4.1.2.tar.xz"
	PyxisTarball     = "pyxis-0.24.0.tar.xz"
	ApptainerTarball = "apptainer-1.5.3.tar.xz"
)

// buildPackages are what the builds need besides what tests/deps.sh
// installs (gcc, make, libc6-dev, Go), found by building on Debian 12:
// enroot builds its own musl and needs nothing more to build; apptainer's
// mconfig needs libseccomp-dev (seccomp support, on by default).
var buildPackages = []string{"libseccomp-dev"}

// runPackages are what running them needs: enroot unpacks a .sqsh with
// unsquashfs and its hooks call getent, pwck, grpck, lsns, column (present
// on Debian 12 by default); mksquashfs makes the image; busybox-static is
// the image's userland; uidmap gives newuidmap for Apptainer's user
// namespace setup when subuids exist.
var runPackages = []string{"squashfs-tools", "busybox-static", "uidmap"}

// SourceDir is the folder of the runtimes' tarballs and SHA256SUMS:
// CONTAINER_SRC_DIR, else ../shared/container-src next to the repository.
func SourceDir() (string, error) {
	if d := os.Getenv("CONTAINER_SRC_DIR"); d != "" {
		return d, nil
	}
	root, err := slurmrel.ModuleRoot()
	if err != nil {
		return "", err
	}
	d := filepath.Clean(filepath.Join(root, "..", "shared", "container-src"))
	if _, err := os.Stat(filepath.Join(d, "SHA256SUMS")); err != nil {
		return "", fmt.Errorf("no container runtime sources: set CONTAINER_SRC_DIR to a folder with %s, %s, %s and their SHA256SUMS (looked in %s)",
			EnrootTarball, PyxisTarball, ApptainerTarball, d)
	}
	return d, nil
}

// Build is one runtime built into the cache.
type Build struct {
	Prefix string // <key>/prefix: bin/, lib/, etc/ (enroot), lib/slurm (pyxis)
	// Seconds is how long the build took on this machine when it was made
	// (the cache keeps it; a cached build costs nothing now).
	Seconds int
	// Fresh says whether this call built it.
	Fresh bool
}

// Ensure builds what (enroot, pyxis or apptainer) unless the cache has it.
// include is the folder holding slurm/spank.h of the Slurm release pyxis is
// loaded by; the others ignore it.
func Ensure(ctx context.Context, what, include string, logf func(string, ...any)) (*Build, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	tarball := map[string]string{"enroot": EnrootTarball, "pyxis": PyxisTarball, "apptainer": ApptainerTarball}[what]
	if tarball == "" {
		return nil, fmt.Errorf("unknown container runtime %q (enroot, pyxis, apptainer)", what)
	}
	if what == "pyxis" {
		if _, err := os.Stat(filepath.Join(include, "slurm", "spank.h")); err != nil {
			return nil, fmt.Errorf("pyxis is built against the loading Slurm release's spank.h: %w", err)
		}
	}
	dir, err := SourceDir()
	if err != nil {
		return nil, err
	}
	if err := EnsurePackages(ctx, logf); err != nil {
		return nil, err
	}
	root, err := slurmrel.ModuleRoot()
	if err != nil {
		return nil, err
	}
	args := []string{what, filepath.Join(dir, tarball), CacheDir()}
	if what == "pyxis" {
		args = append(args, include)
	}
	logf("%s: build of %s (cached in %s; minutes when not built yet)", what, tarball, CacheDir())
	cmd := exec.CommandContext(ctx, filepath.Join(root, "tests", "containers", "build.sh"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: build.sh: %v\n%s", what, err, stderr.String())
	}
	b := &Build{Prefix: strings.TrimSpace(stdout.String()), Fresh: strings.Contains(stderr.String(), " built in ")}
	s, err := os.ReadFile(filepath.Join(filepath.Dir(b.Prefix), ".built"))
	if err != nil {
		return nil, fmt.Errorf("%s: build.sh printed %q but left no .built: %w", what, b.Prefix, err)
	}
	b.Seconds, _ = strconv.Atoi(strings.TrimSpace(string(s)))
	logf("%s: %s (built in %d s%s; this call %s)", what, b.Prefix, b.Seconds, map[bool]string{true: " now", false: " earlier"}[b.Fresh], time.Since(t0).Round(time.Millisecond))
	return b, nil
}

// EnsurePackages installs the Debian packages the builds and the runtimes
// need, when missing (root only).
func EnsurePackages(ctx context.Context, logf func(string, ...any)) error {
	return slurmrel.InstallMissing(ctx, "running the container tests", append(append([]string{}, buildPackages...), runPackages...), logf)
}

// Busybox is the static busybox of Debian's busybox-static.
const Busybox = "/bin/busybox"

// applets are the commands the image's scripts use.
var applets = []string{"sh", "cat", "echo", "id", "ls", "mkdir", "mknod", "mount", "readlink", "sleep", "stat", "true", "umount"}

// MakeRootfs makes a minimal root filesystem in dir (which must not exist):
// busybox and its applets in /bin, gfOpen as /usr/local/bin/gf-open, the
// folders a runtime mounts over, and passwd/group files naming root (enroot's
// shadow hook adds the job user to them).
func MakeRootfs(dir, gfOpen string) error {
	if _, err := os.Lstat(dir); err == nil {
		return fmt.Errorf("rootfs %s exists already", dir)
	}
	for _, d := range []string{"bin", "usr/local/bin", "etc", "dev", "proc", "sys", "tmp", "run", "var/run", "var/lock", "root", "home", "mnt"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	if err := copyFile(Busybox, filepath.Join(dir, "bin", "busybox")); err != nil {
		return fmt.Errorf("busybox (package busybox-static): %w", err)
	}
	for _, a := range applets {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			return err
		}
	}
	if err := copyFile(gfOpen, filepath.Join(dir, "usr", "local", "bin", "gf-open")); err != nil {
		return fmt.Errorf("gf-open: %w", err)
	}
	files := map[string]string{
		"etc/passwd":  "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":   "root:x:0:\n",
		"etc/shadow":  "root:*:1::::::\n",
		"etc/gshadow": "root:*::\n",
	}
	for rel, text := range files {
		if err := os.WriteFile(filepath.Join(dir, rel), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Squash makes an enroot image (SquashFS, what pyxis takes as
// --container-image=PATH.sqsh) of rootfs. pseudo are mksquashfs pseudo
// file definitions ("dev/x c 666 0 0 195 2"): entries the image carries
// that the user who made it need not be able to create here, as an image
// built as root elsewhere would.
func Squash(ctx context.Context, rootfs, out string, pseudo ...string) error {
	args := []string{rootfs, out, "-noappend", "-quiet", "-no-progress", "-all-root"}
	for _, p := range pseudo {
		args = append(args, "-p", p)
	}
	if b, err := exec.CommandContext(ctx, "mksquashfs", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("mksquashfs %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return os.Chmod(out, 0o644)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	fi, err := os.Stat(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, fi.Mode().Perm()|0o555)
}

// EnrootSetup is one cluster's enroot: the cached build's libraries with
// this cluster's own configuration folder, so that its runtime, data and
// cache paths are the cluster's and the host's /etc/enroot is never read.
type EnrootSetup struct {
	Bin     string // folder holding enroot (for slurmd's PATH: pyxis runs "enroot")
	SysConf string // ENROOT_SYSCONF_PATH: enroot.conf, hooks/, mounts/
	Data    string // ENROOT_DATA_PATH base: per-user folders of created containers
}

// SetupEnroot writes an enroot for a cluster in dir (which must not exist)
// from the cached build b. conf are extra enroot.conf lines.
func SetupEnroot(b *Build, dir string, conf ...string) (*EnrootSetup, error) {
	if _, err := os.Lstat(dir); err == nil {
		return nil, fmt.Errorf("enroot folder %s exists already", dir)
	}
	e := &EnrootSetup{Bin: filepath.Join(dir, "bin"), SysConf: filepath.Join(dir, "etc"), Data: filepath.Join(dir, "data")}
	if err := os.MkdirAll(e.Bin, 0o755); err != nil {
		return nil, err
	}
	// The build's own sysconf folder holds the hooks and mounts upstream
	// ships; a copy lets the cluster's enroot.conf replace the build's.
	if out, err := exec.Command("cp", "-a", filepath.Join(b.Prefix, "etc", "enroot"), e.SysConf).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("copy enroot's configuration: %v %s", err, out)
	}
	// Upstream's 10-devices.sh (ENROOT_RESTRICT_DEV) binds /dev/mqueue,
	// /dev/log, /dev/tty and /dev/shm from the host without nofail; a
	// node without them (this test machine has no /dev/mqueue) would fail
	// every container start, so the cluster's copy makes them optional.
	hook := filepath.Join(e.SysConf, "hooks.d", "10-devices.sh")
	hb, err := os.ReadFile(hook)
	if err != nil {
		return nil, fmt.Errorf("enroot's device hook: %w", err)
	}
	var hl []string
	for _, l := range strings.Split(string(hb), "\n") {
		for _, d := range []string{"/dev/mqueue ", "/dev/log ", "/dev/tty ", "/dev/shm "} {
			if strings.HasPrefix(l, d) && !strings.Contains(l, "nofail") {
				l += ",nofail,silent"
			}
		}
		hl = append(hl, l)
	}
	if err := os.WriteFile(hook, []byte(strings.Join(hl, "\n")), 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{"runtime", "cache", "data", "config"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o1777); err != nil {
			return nil, err
		}
		if err := os.Chmod(filepath.Join(dir, d), 0o1777); err != nil {
			return nil, err
		}
	}
	lines := []string{
		"ENROOT_LIBRARY_PATH " + filepath.Join(b.Prefix, "lib", "enroot"),
		"ENROOT_SYSCONF_PATH " + e.SysConf,
		"ENROOT_RUNTIME_PATH " + filepath.Join(dir, "runtime") + "/user-$(id -u)",
		"ENROOT_CONFIG_PATH " + filepath.Join(dir, "config") + "/user-$(id -u)",
		"ENROOT_CACHE_PATH " + filepath.Join(dir, "cache") + "/user-$(id -u)",
		"ENROOT_DATA_PATH " + e.Data + "/user-$(id -u)",
		"ENROOT_TEMP_PATH " + filepath.Join(dir, "runtime"),
		// No FUSE here: a .sqsh is unpacked with unsquashfs.
		"ENROOT_NATIVE_OVERLAYFS no",
	}
	lines = append(lines, conf...)
	if err := os.WriteFile(filepath.Join(e.SysConf, "enroot.conf"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return nil, err
	}
	// enroot reads @sysconfdir@/enroot.conf, fixed at build time: the
	// cluster's copy of the script names the cluster's folder instead.
	script, err := os.ReadFile(filepath.Join(b.Prefix, "bin", "enroot"))
	if err != nil {
		return nil, err
	}
	old := filepath.Join(b.Prefix, "etc", "enroot") + "/enroot.conf"
	if !bytes.Contains(script, []byte(old)) {
		return nil, fmt.Errorf("%s does not read %s: the build's layout changed", filepath.Join(b.Prefix, "bin", "enroot"), old)
	}
	script = bytes.ReplaceAll(script, []byte(filepath.Join(b.Prefix, "etc", "enroot")), []byte(e.SysConf))
	if err := os.WriteFile(filepath.Join(e.Bin, "enroot"), script, 0o755); err != nil {
		return nil, err
	}
	// enroot's helpers (enroot-mount, enroot-nsenter, ...) are looked up
	// in PATH beside it.
	ents, err := os.ReadDir(filepath.Join(b.Prefix, "bin"))
	if err != nil {
		return nil, err
	}
	for _, ent := range ents {
		if ent.Name() == "enroot" {
			continue
		}
		if err := os.Symlink(filepath.Join(b.Prefix, "bin", ent.Name()), filepath.Join(e.Bin, ent.Name())); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// Pyxis is the SPANK plugin of a pyxis build.
func (b *Build) Pyxis() (string, error) {
	p := filepath.Join(b.Prefix, "lib", "slurm", "spank_pyxis.so")
	if _, err := os.Stat(p); err != nil {
		return "", err
	}
	return p, nil
}

// Apptainer is the apptainer binary of an Apptainer build.
func (b *Build) Apptainer() (string, error) {
	p := filepath.Join(b.Prefix, "bin", "apptainer")
	if _, err := os.Stat(p); err != nil {
		return "", err
	}
	return p, nil
}

// DeviceHook writes an enroot hook that bind-mounts devices (host paths)
// into every container at /dev/<base name>, as NVIDIA's 98-nvidia.sh hook
// does through nvidia-container-cli for NVIDIA_VISIBLE_DEVICES=all (CUDA
// images set it): each GPU's /dev/nvidiaN, nvidiactl and nvidia-uvm, all of
// them, whatever the job was allocated. Binds, not copies: the node is the
// host's, on a host mount. nvidia-container-cli also opens the devices
// (NVML) from the hook; with probe (gf-open) set the hook does so too and
// appends what it saw, and its cgroup, to log.
func (e *EnrootSetup) DeviceHook(devices []string, probe, log string) error {
	var b strings.Builder
	b.WriteString("#!/usr/bin/env bash\n# Written by the gpufence container tests: binds the node's (fake) NVIDIA devices.\nset -eu\n")
	for _, d := range append(append([]string{}, devices...), probe, log) {
		if d == "" {
			continue
		}
		if strings.ContainsAny(d, " \t\n$`\\'\"") || !filepath.IsAbs(d) {
			return fmt.Errorf("path %q: want an absolute path without blanks or shell characters", d)
		}
	}
	if probe != "" {
		fmt.Fprintf(&b, "{ echo \"hook uid $(id -u) pid $$\"; %s -env %s; } >> %s 2>&1 || true\n", probe, strings.Join(devices, " "), log)
	}
	b.WriteString("cat << EOF | enroot-mount --root \"${ENROOT_ROOTFS}\" -\n")
	for _, d := range devices {
		fmt.Fprintf(&b, "%s /dev/%s none x-create=file,bind,rw,nosuid,noexec,private\n", d, filepath.Base(d))
	}
	b.WriteString("EOF\n")
	return os.WriteFile(filepath.Join(e.SysConf, "hooks.d", "98-gpufence-test-nvidia.sh"), []byte(b.String()), 0o755)
}
