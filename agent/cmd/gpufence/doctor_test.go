// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

var doctorIDs = []string{"cgroup", "kernel", "bpffs", "slurm-conf", "slurm-plugin", "plugstack", "slurm-cgroup", "slurm-layout", "gres", "nvml", "agent-socket", "audit"}

func TestDoctorUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"doctor", "--help"}, 0, "Exit status: 0 nothing failed"},
		{[]string{"doctor", "--bogus"}, 2, "gpufence doctor: unknown flag: --bogus\nRun 'gpufence doctor --help' for usage.\n"},
		{[]string{"doctor", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"doctor", "--config", "/nonexistent/agent.yaml"}, 2, "read config"},
		{[]string{"doctor", "--slurm-conf", "relative/slurm.conf"}, 2, "slurm_conf"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("%q: exit %d, want %d with %q\nstdout: %s\nstderr: %s", tc.args, code, tc.code, tc.out, &stdout, &stderr)
		}
	}
	var stdout, stderr bytes.Buffer
	run([]string{"doctor", "--help"}, &stdout, &stderr)
	for _, id := range doctorIDs {
		if !strings.Contains(stdout.String(), "  "+id+" ") {
			t.Errorf("--help does not describe check %s", id)
		}
	}
}

// doctorJSON is the stable JSON of `gpufence doctor --json`.
type doctorJSON struct {
	Version string `json:"version"`
	OK      bool   `json:"ok"`
	Checks  []struct {
		ID      string   `json:"id"`
		Title   string   `json:"title"`
		Verdict string   `json:"verdict"`
		Summary string   `json:"summary"`
		Detail  []string `json:"detail"`
		Fix     string   `json:"fix"`
	} `json:"checks"`
}

func (d doctorJSON) check(t *testing.T, id string) (verdict, summary string) {
	t.Helper()
	for _, c := range d.Checks {
		if c.ID == id {
			return c.Verdict, c.Summary + " | " + strings.Join(c.Detail, " | ")
		}
	}
	t.Fatalf("no check %s", id)
	return "", ""
}

// TestDoctorEmptyRoot runs the command on a root with nothing in it: every
// file check fails or is skipped, the exit status is 1, the JSON has every
// check in order with its stable fields.
func TestDoctorEmptyRoot(t *testing.T) {
	root := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run([]string{"doctor", "--json", "--root", root, "--config", writeDoctorConfig(t, "node_name: n1\n")}, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, &stdout, &stderr)
	}
	var d doctorJSON
	if err := json.Unmarshal(stdout.Bytes(), &d); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, &stdout)
	}
	var ids []string
	for _, c := range d.Checks {
		ids = append(ids, c.ID)
		if c.Title == "" || c.Summary == "" || c.Detail == nil {
			t.Errorf("%s: empty title, summary or detail: %+v", c.ID, c)
		}
		if (c.Verdict == "warn" || c.Verdict == "fail") != (c.Fix != "") {
			t.Errorf("%s: verdict %s with fix %q", c.ID, c.Verdict, c.Fix)
		}
	}
	if !slices.Equal(ids, doctorIDs) || d.OK {
		t.Fatalf("checks %v ok=%v, want %v and not ok", ids, d.OK, doctorIDs)
	}
	for id, want := range map[string]string{"cgroup": "fail", "slurm-conf": "fail", "agent-socket": "fail", "gres": "skip"} {
		if v, s := d.check(t, id); v != want {
			t.Errorf("%s: %s (%s), want %s", id, v, s, want)
		}
	}
	stdout.Reset()
	if code := run([]string{"doctor", "--root", root, "--config", writeDoctorConfig(t, "node_name: n1\n")}, &stdout, &stderr); code != 1 ||
		!strings.Contains(stdout.String(), "FAIL  agent-socket") || !strings.Contains(stdout.String(), "NOT READY") {
		t.Errorf("text: exit %d\n%s", code, &stdout)
	}
}

func writeDoctorConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrivilegedDoctorHost builds the real binary and runs `gpufence doctor
// --json` on this machine; the cgroup, bpffs and kernel verdicts must match
// what the test measures itself (statfs, its own feature probes). Then it
// mounts a bpffs of its own and points pin_dir there.
func TestPrivilegedDoctorHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (the kernel probe loads BPF programs; mounting a bpffs)")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("skipping: no go tool to build the binary: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "gpufence")
	build := exec.Command(goBin, "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	doctor := func(args ...string) (doctorJSON, int) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"doctor", "--json"}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		var d doctorJSON
		if err := json.Unmarshal(out, &d); err != nil {
			t.Fatalf("exit %d, not JSON: %v\n%s\n%s", code, err, out, &stderr)
		}
		if (code == 0) != d.OK || (code != 0 && code != 1) {
			t.Errorf("exit %d with ok=%v", code, d.OK)
		}
		return d, code
	}

	// The host as it is, with the configuration it has (or the defaults).
	d, _ := doctor()

	var fs unix.Statfs_t
	wantCgroup := "fail"
	switch {
	case unix.Statfs("/sys/fs/cgroup", &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC:
		wantCgroup = "ok"
	case unix.Statfs("/sys/fs/cgroup/unified", &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC:
		wantCgroup = "warn" // hybrid
	}
	if v, s := d.check(t, "cgroup"); v != wantCgroup {
		t.Errorf("cgroup: doctor says %s (%s), statfs says %s", v, s, wantCgroup)
	}

	wantBPFFS := "warn"
	if unix.Statfs("/sys/fs/bpf", &fs) == nil && fs.Type == unix.BPF_FS_MAGIC {
		wantBPFFS = "ok"
	} else if c, err := net.DialTimeout("unix", "/run/gpufence/agent.sock", time.Second); err == nil {
		c.Close()
		wantBPFFS = "fail" // an agent runs, yet its pins are not on the host's bpffs
	}
	if v, s := d.check(t, "bpffs"); v != wantBPFFS && !strings.Contains(s, "pin_dir is empty") {
		t.Errorf("bpffs: doctor says %s (%s), statfs of /sys/fs/bpf says %s", v, s, wantBPFFS)
	}

	wantKernel := "ok"
	if err := features.HaveProgramType(ebpf.CGroupDevice); err != nil {
		wantKernel = "fail"
	} else if err := features.HaveMapType(ebpf.RingBuf); err != nil {
		wantKernel = "fail"
	} else if err := features.HaveProgramHelper(ebpf.CGroupDevice, asm.FnGetCurrentAncestorCgroupId); err != nil {
		wantKernel = "warn" // per-cgroup fallback
	}
	if v, s := d.check(t, "kernel"); v != wantKernel {
		t.Errorf("kernel: doctor says %s (%s), the test's probe says %s", v, s, wantKernel)
	}

	// A bpffs of the test's own: pin_dir on it is ok.
	mnt := t.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Skipf("skipping the bpffs part: mount bpffs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount test bpffs: %v", err)
		}
	})
	d, _ = doctor("--config", writeDoctorConfig(t, "pin_dir: "+filepath.Join(mnt, "gpufence")+"\n"))
	if v, s := d.check(t, "bpffs"); v != "ok" || !strings.Contains(s, "bpffs mounted at "+mnt) {
		t.Errorf("bpffs on the test's own mount: %s (%s)", v, s)
	}

	// The text form, for the log.
	out, _ := exec.Command(bin, "doctor").Output()
	for _, id := range doctorIDs {
		if !strings.Contains(string(out), " "+id+" ") {
			t.Errorf("text output lacks check %s", id)
		}
	}
	t.Logf("gpufence doctor on this machine:\n%s", out)
}
