// SPDX-License-Identifier: Apache-2.0

package containers

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildRefuses: build.sh names what is wrong before building anything.
func TestBuildRefuses(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "pyxis-0.24.0.tar.xz")
	if err := os.WriteFile(good, []byte("not really a tarball"), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("not really a tarball"))
	other := filepath.Join(dir, "enroot-4.1.2.tar.xz")
	if err := os.WriteFile(other, []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	sums := fmt.Sprintf("%x  pyxis-0.24.0.tar.xz\n%x  enroot-4.1.2.tar.xz\n", sum, sum)
	if err := os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(sums), 0o644); err != nil {
		t.Fatal(err)
	}
	unlisted := filepath.Join(dir, "apptainer-1.5.3.tar.xz")
	if err := os.WriteFile(unlisted, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown runtime", []string{"docker", good, cache}, "unknown runtime docker"},
		{"wrong tarball", []string{"enroot", good, cache}, "is not a enroot tarball"},
		{"checksum mismatch", []string{"enroot", other, cache}, "does not match"},
		{"not listed", []string{"apptainer", unlisted, cache}, "is not listed in"},
		{"pyxis without spank.h", []string{"pyxis", good, cache, dir}, "no " + dir + "/slurm/spank.h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command("./build.sh", tc.args...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("build.sh %v: %v %q, want an error saying %q", tc.args, err, out, tc.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(cache, "pyxis-0.24.0")); err == nil {
		t.Error("a refused build left a folder in the cache")
	}
}

// TestDeviceHookRefusesShellText: a device path goes into a shell script,
// so anything the shell would read as more than a path is refused.
func TestDeviceHookRefusesShellText(t *testing.T) {
	e := &EnrootSetup{SysConf: t.TempDir()}
	if err := os.MkdirAll(filepath.Join(e.SysConf, "hooks.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/dev/nvidia0 /etc/shadow", "/dev/$(id)", "dev/nvidia0", "/dev/a`b`", "/dev/x'y"} {
		if err := e.DeviceHook([]string{p}, "", ""); err == nil {
			t.Errorf("DeviceHook(%q) accepted", p)
		}
	}
	if err := e.DeviceHook([]string{"/r/dev/nvidia0", "/r/dev/nvidiactl"}, "/r/bin/gf-open", "/r/work/hook.log"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(e.SysConf, "hooks.d", "98-gpufence-test-nvidia.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"/r/dev/nvidia0 /dev/nvidia0 none x-create=file,bind", "/r/dev/nvidiactl /dev/nvidiactl none", "/r/bin/gf-open -env /r/dev/nvidia0 /r/dev/nvidiactl; } >> /r/work/hook.log"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("hook lacks %q:\n%s", want, b)
		}
	}
}

// TestMakeRootfs: the image's userland and prober, and no second rootfs
// over a first.
func TestMakeRootfs(t *testing.T) {
	if _, err := os.Stat(Busybox); err != nil {
		t.Skipf("no %s (package busybox-static): %v", Busybox, err)
	}
	dir := filepath.Join(t.TempDir(), "rootfs")
	probe := filepath.Join(t.TempDir(), "gf-open")
	if err := os.WriteFile(probe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := MakeRootfs(dir, probe); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"bin/sh", "bin/mknod", "bin/mount", "usr/local/bin/gf-open", "etc/passwd", "dev", "tmp"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("rootfs lacks %s: %v", p, err)
		}
	}
	if err := MakeRootfs(dir, probe); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Errorf("second MakeRootfs over %s: %v", dir, err)
	}
}
