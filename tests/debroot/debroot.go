// SPDX-License-Identifier: Apache-2.0

// Package debroot makes Debian roots with debootstrap for the tests: the
// package tests install the .deb into one, and the cluster harness runs a
// Debian suite's own Slurm daemons from one (tests/slurmrel). A root is built
// once per machine and kept as a tarball in the cache; each use unpacks a
// fresh copy.
package debroot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// CacheBase is the tests' cache: GPUFENCE_TEST_CACHE, else
// /var/cache/gpufence-test, outside every path gpufence itself uses. An
// empty folder there measures a cold start without losing the warm cache.
func CacheBase() string {
	if d := os.Getenv("GPUFENCE_TEST_CACHE"); d != "" {
		return d
	}
	return "/var/cache/gpufence-test"
}

// CacheDir holds the root tarballs and debootstrap's .deb cache.
func CacheDir() string { return filepath.Join(CacheBase(), "roots") }

// Packages are installed into every root on top of debootstrap's minbase:
// Slurm's node daemon, controller, clients and headers (the cluster harness
// runs them; the package tests install next to them, as on a node) and
// systemd, installed but not running, as in a node image being built.
var Packages = []string{"slurmd", "slurmctld", "slurm-client", "libslurm-dev", "systemd", "procps"}

// Mirror is the Debian mirror to use: GPUFENCE_DEBIAN_MIRROR, else the one
// this machine's apt uses.
func Mirror() string {
	if m := os.Getenv("GPUFENCE_DEBIAN_MIRROR"); m != "" {
		return m
	}
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	for _, f := range files {
		data, _ := os.ReadFile(f)
		if m := regexp.MustCompile(`(?m)^URIs:\s*(\S+/debian)/?\s*$`).FindSubmatch(data); m != nil {
			return string(m[1])
		}
	}
	data, _ := os.ReadFile("/etc/apt/sources.list")
	if m := regexp.MustCompile(`(?m)^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s`).FindSubmatch(data); m != nil {
		return string(m[1])
	}
	return "http://deb.debian.org/debian"
}

// Tarball returns the cached root of suite, building it first when missing
// (a minute or more, once per machine). Callers in several test binaries at
// once share the cache: one builds, the others wait.
func Tarball(ctx context.Context, suite string, logf func(string, ...any)) (string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	mirror := Mirror()
	sum := sha256.Sum256([]byte(suite + "\n" + mirror + "\n" + strings.Join(Packages, ",")))
	tarball := filepath.Join(CacheDir(), suite+"-"+hex.EncodeToString(sum[:6])+".tar")
	if err := os.MkdirAll(filepath.Join(CacheDir(), "debs"), 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(CacheDir(), ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	if _, err := os.Stat(tarball); err == nil {
		return tarball, nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", fmt.Errorf("debootstrap is not installed (tests/deps.sh installs it): %w", err)
	}
	start := time.Now()
	build := tarball + ".d"
	os.RemoveAll(build)
	defer os.RemoveAll(build)
	args := []string{"--variant=minbase", "--cache-dir=" + filepath.Join(CacheDir(), "debs"),
		"--include=" + strings.Join(Packages, ","), suite, build, mirror}
	if out, err := run(ctx, "debootstrap", args...); err != nil {
		return "", fmt.Errorf("debootstrap %s: %v\n%s", strings.Join(args, " "), err, lastLines(out, 30))
	}
	if out, err := run(ctx, "tar", "--numeric-owner", "-C", build, "-cf", tarball+".tmp", "."); err != nil {
		return "", fmt.Errorf("tar: %v\n%s", err, out)
	}
	if err := os.Rename(tarball+".tmp", tarball); err != nil {
		return "", err
	}
	logf("built %s from %s in %s", tarball, mirror, time.Since(start).Round(time.Second))
	return tarball, nil
}

// Unpack unpacks a root tarball into dir, which must exist.
func Unpack(ctx context.Context, tarball, dir string) error {
	if out, err := run(ctx, "tar", "--numeric-owner", "-C", dir, "-xf", tarball); err != nil {
		return fmt.Errorf("unpack %s: %v\n%s", tarball, err, out)
	}
	return nil
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = "/"
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
