// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/tests/cluster"
)

// fabricFake is a fake NVSwitch or NVLink management node under the
// cluster's dev folder, numbered as the driver numbers the real ones.
type fabricFake struct {
	name         string
	major, minor uint32
	kind         string // audit device.kind
	path         string // the driver's name for it, as the record gives it
}

// unusedMajors picks n char majors that no driver registered and that the
// cluster does not use (195, the fake nvidia-uvm's 240, its nvidia-caps
// major), from the dynamic range below the cluster's: an allowed open
// fails with ENXIO, a denied one with EPERM.
func (st *suite) unusedMajors(t *testing.T, n int) []uint32 {
	t.Helper()
	b, err := os.ReadFile("/proc/devices")
	if err != nil {
		t.Fatal(err)
	}
	used := map[uint32]bool{195: true, 240: true, st.c.CapsMajor(): true}
	inChar := false
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "Character devices:":
			inChar = true
		case strings.HasSuffix(l, "devices:"):
			inChar = false
		case inChar && l != "":
			num, _, _ := strings.Cut(l, " ")
			if m, err := strconv.ParseUint(num, 10, 32); err == nil {
				used[uint32(m)] = true
			}
		}
	}
	var out []uint32
	for m := uint32(229); m >= 200 && len(out) < n; m-- {
		if !used[m] {
			out = append(out, m)
		}
	}
	if len(out) < n {
		t.Fatalf("no %d unused char majors in 200-229 for the fake NVSwitch and NVLink nodes", n)
	}
	return out
}

// runInCgroup starts gf-open as the job user directly inside cgroup dir
// (as runIn does) on paths.
func (st *suite) runInCgroup(t *testing.T, dir string, paths []string, asRoot bool) cluster.OpenReport {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command(st.open, append([]string{"-env"}, paths...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if !asRoot {
		uid, gid := lookup(t)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gf-open in %s: %v\n%s", dir, err, out)
	}
	rep := cluster.ParseOpen(string(out))
	if !strings.HasSuffix(dir, rep.Cgroup) {
		t.Fatalf("gf-open ran in %s, want %s", rep.Cgroup, dir)
	}
	return rep
}

// TestPrivilegedNVSwitch: with NVSwitch and NVLink management nodes on the
// node (fake ones, of majors the agent is told through nvswitch_major and
// nvlink_major, as it would read them from /proc/devices), a GPU job that
// opens them is refused (EPERM) while its own GPU opens, and each attempt
// is an audit record naming the node and the job; slurmd's exempt cgroup
// keeps them; fabric_management: allow lets jobs open them.
func TestPrivilegedNVSwitch(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	m := st.unusedMajors(t, 2)
	nvswitch, nvlink := m[0], m[1]
	dev := filepath.Join(st.c.Root(), "dev")
	nodes := []fabricFake{
		{"nvidia-nvswitchctl", nvswitch, 255, audit.DeviceNVSwitch, "/dev/nvidia-nvswitchctl"},
		{"nvidia-nvswitch0", nvswitch, 0, audit.DeviceNVSwitch, "/dev/nvidia-nvswitch0"},
		{"nvidia-nvswitch1", nvswitch, 1, audit.DeviceNVSwitch, "/dev/nvidia-nvswitch1"},
		{"nvidia-nvlink", nvlink, 0, audit.DeviceNVLink, "/dev/nvidia-nvlink"},
	}
	var fabricPaths []string
	for _, n := range nodes {
		p := filepath.Join(dev, n.name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		t.Cleanup(func() { os.Remove(p) })
		// mknod's mode is cut by the umask; jobs run as the test user.
		if err := os.Chmod(p, 0o666); err != nil {
			t.Fatal(err)
		}
		fabricPaths = append(fabricPaths, p)
	}
	restart := func(yaml string) {
		t.Helper()
		if err := st.agent.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := st.startAgent(agentOpts{yaml: yaml}); err != nil {
			t.Fatal(err)
		}
	}
	majors := fmt.Sprintf("nvswitch_major: %d\nnvlink_major: %d\n", nvswitch, nvlink)
	restart(majors)
	defer restart("")
	paths := append(st.paths(), fabricPaths...)
	srun := func(t *testing.T) cluster.OpenReport {
		t.Helper()
		r := st.c.Run(st.ctx, user, "srun", append([]string{"--gres=gpu:1", st.open, "-env"}, paths...)...)
		mustOK(t, r)
		return cluster.ParseOpen(r.Stdout)
	}
	expectFabric := func(t *testing.T, rep cluster.OpenReport, want string) {
		t.Helper()
		for _, p := range fabricPaths {
			if got := rep.Open[p]; got != want {
				t.Errorf("%s: %q, want %s", filepath.Base(p), got, want)
			}
		}
	}

	t.Run("denied and audited", func(t *testing.T) {
		rep := srun(t)
		job := jobOf(t, rep)
		own := gpusOf(t, rep, "SLURM_STEP_GPUS")
		// Expected GPUs from Slurm's allocation (the step's trusted list
		// and the job's), never from anything the job set.
		if len(own) != 1 {
			t.Fatalf("SLURM_STEP_GPUS %v: want one GPU", own)
		}
		st.expectGPUs(t, rep, own)
		expectFabric(t, rep, "EPERM")

		recs := st.waitRecords(t, job, func(rs []audit.Record) bool {
			n := 0
			for _, r := range access(rs, audit.DecisionDenied) {
				if r.Device != nil && (r.Device.Kind == audit.DeviceNVSwitch || r.Device.Kind == audit.DeviceNVLink) {
					n++
				}
			}
			return n >= len(nodes)
		})
		uid, _ := lookup(t)
		for _, n := range nodes {
			i := slices.IndexFunc(recs, func(r audit.Record) bool {
				return r.Event == audit.EventGPUAccess && r.Device != nil && r.Device.Major == n.major && r.Device.Minor == n.minor
			})
			if i < 0 {
				t.Errorf("no audit record of %s (%d:%d) for job %d", n.name, n.major, n.minor, job)
				continue
			}
			r := recs[i]
			t.Logf("%s: %s (device %+v)", n.name, r.Message, *r.Device)
			if r.Decision != audit.DecisionDenied || r.Device.Kind != n.kind || r.Device.Path != n.path || r.GPU != nil ||
				r.StepID != "0" || r.User != user || r.UID == nil || *r.UID != uid || r.Comm != "gf-open" || r.PID == 0 ||
				r.PolicyMode != audit.ModeEnforce || !strings.Contains(r.Message, n.path) {
				t.Errorf("record of %s: %+v, device %+v; want denied, kind %s, path %s, job %d step 0 of %s", n.name, r, r.Device, n.kind, n.path, job, user)
			}
		}
	})

	t.Run("slurmd keeps them", func(t *testing.T) {
		// slurmd's NVML runs as root; a user's process there (slurmd's
		// sbcast child) gets nothing (attack_sbcast_test.go).
		rep := st.runInCgroup(t, filepath.Join(st.c.ScopeDir(), "slurmd"), paths, true)
		expectFabric(t, rep, "ENXIO")
		for i, p := range st.c.DevPaths() {
			if rep.Open[p] != "ENXIO" {
				t.Errorf("nvidia%d from slurmd's cgroup as root: %q, want ENXIO", i, rep.Open[p])
			}
		}
		rep = st.runInCgroup(t, filepath.Join(st.c.ScopeDir(), "slurmd"), paths, false)
		expectFabric(t, rep, "EPERM")
		for i, p := range st.c.DevPaths() {
			if rep.Open[p] != "EPERM" {
				t.Errorf("nvidia%d from slurmd's cgroup as %s: %q, want EPERM", i, user, rep.Open[p])
			}
		}
	})

	t.Run("fabric_management allow", func(t *testing.T) {
		st.waitIdle(t)
		restart(majors + "fabric_management: allow\n")
		rep := srun(t)
		st.expectGPUs(t, rep, gpusOf(t, rep, "SLURM_STEP_GPUS"))
		expectFabric(t, rep, "ENXIO")
		b, _ := os.ReadFile(st.agent.Log)
		if !strings.Contains(string(b), "fabric_management: allow") {
			t.Errorf("the agent did not log that the management nodes are allowed:\n%s", tailLines(string(b), 20))
		}
	})
	st.waitIdle(t)
}
