// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/tests/cluster"
	"github.com/gpufence/gpufence/tests/slurmrel"
	"golang.org/x/sys/unix"
)

// imexFakeChannels are the channel nodes the test makes outside the jobs'
// namespaces (as a user finds another job's through /proc/<pid>/root):
// each job probes all of them.
const imexFakeChannels = 6

// unusedMajor is a char major no driver registered and the cluster does not
// use, for fake IMEX channel nodes (an allowed open gives ENXIO).
func unusedMajor(t *testing.T, not ...uint32) uint32 {
	t.Helper()
	f, err := os.Open("/proc/devices")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	used := map[uint32]bool{195: true}
	for _, n := range not {
		used[n] = true
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		num, _, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if n, err := strconv.ParseUint(num, 10, 32); err == nil {
			used[uint32(n)] = true
		}
	}
	for m := uint32(229); m >= 220; m-- {
		if !used[m] {
			return m
		}
	}
	t.Fatal("no unused char major in 220-229 for fake IMEX channel nodes")
	return 0
}

// slurmChannels reads the channels slurmctld handed out from its own log
// (switch/nvidia_imex at debug level: "allocating channel N to JobId=J"):
// the expected channel of each job, from Slurm, never from the job.
func (st *suite) slurmChannels(t *testing.T) map[string]uint32 {
	t.Helper()
	b, err := os.ReadFile(st.c.LogPath("slurmctld.log"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint32{}
	for _, m := range regexp.MustCompile(`allocating channel (\d+) to JobId=(\d+)`).FindAllStringSubmatch(string(b), -1) {
		n, _ := strconv.ParseUint(m[1], 10, 32)
		out[m[2]] = uint32(n)
	}
	return out
}

// TestPrivilegedIMEXChannels: with Slurm's switch/nvidia_imex (fake channel
// major), two GPU jobs running at once each open only the channel Slurm
// gave them, in their own namespace or anywhere else, and no other job's
// (nor channel 0, as a ParallelCluster prolog makes it for all); a CPU-only
// job opens none, its own included. Every denial is an audit record.
func TestPrivilegedIMEXChannels(t *testing.T) {
	st := get(t)
	if !st.c.AtLeast("24.05") || st.c.Kind() != string(slurmrel.KindRoot) {
		t.Skipf("skipping: switch/nvidia_imex is Slurm 24.05's and later, run here from a Debian root (own /dev); this run is Slurm %s (%s)", st.c.SlurmVersion(), st.c.Kind())
	}
	major := unusedMajor(t, st.c.CapsMajor())
	if err := st.c.SetIMEX(major); err != nil {
		t.Fatal(err)
	}
	restart := func() {
		if err := st.agent.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
	}
	restart() // the agent reads SwitchType and imex_dev_major at start
	t.Cleanup(func() {
		if err := st.c.SetIMEX(0); err != nil {
			t.Errorf("switch/nvidia_imex off: %v", err)
		}
		restart()
	})

	dir := filepath.Join(st.c.Root(), "imex")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var fake []string
	for c := 0; c < imexFakeChannels; c++ {
		p := filepath.Join(dir, fmt.Sprintf("channel%d", c))
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(major, uint32(c)))); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o666); err != nil {
			t.Fatal(err)
		}
		fake = append(fake, p)
	}
	own := "/dev/nvidia-caps-imex-channels"
	pcluster := "/dev/imex-channel0" // the root's, as a ParallelCluster prolog makes it

	// Each job's step probes every node, then holds its job (and so its
	// channel) until released, so that the two GPU jobs run at once.
	work := filepath.Join(st.c.Root(), "work")
	release := filepath.Join(work, fmt.Sprintf("imex-release-%d", time.Now().UnixNano()))
	t.Cleanup(func() { os.WriteFile(release, nil, 0o644) })
	start := func(gres string) (id, out string) {
		t.Helper()
		out = filepath.Join(work, fmt.Sprintf("imex-%d.out", time.Now().UnixNano()))
		// The glob is expanded in the step, in its own namespace: the
		// batch step has no channel before 25.11.
		script := fmt.Sprintf("#!/bin/sh\nsrun %s sh -c '%s -env %s %s %s/*' > %s.tmp 2>&1; mv %s.tmp %s\nwhile [ ! -e %s ]; do sleep 0.2; done\n",
			gres, st.open, strings.Join(fake, " "), pcluster, own, out, out, out, release)
		f := out + ".sh"
		if err := os.WriteFile(f, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		args := []string{"--parsable", "-o", out + ".slurm"}
		if gres != "" {
			args = append(args, gres)
		}
		r := st.c.Run(st.ctx, user, "sbatch", append(args, f)...)
		mustOK(t, r)
		id = strings.TrimSpace(strings.Split(r.Stdout, ";")[0])
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(out); err == nil {
				return id, out
			}
			time.Sleep(200 * time.Millisecond)
		}
		slog, _ := os.ReadFile(out + ".slurm")
		t.Fatalf("job %s (%s) wrote no probe in 60 s:\n%s\n%s", id, gres, slog, tailFile(st.c.LogPath("slurmd.log")))
		return "", ""
	}
	a, outA := start("--gres=gpu:1")
	b, outB := start("--gres=gpu:1") // while a holds its channel
	repA, repB := st.readOut(t, outA), st.readOut(t, outB)
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a, b} {
		if state, err := st.c.WaitJob(st.ctx, id); err != nil || state != "COMPLETED" {
			t.Fatalf("job %s: %q %v", id, state, err)
		}
	}
	release2 := release + "-cpu"
	os.WriteFile(release2, nil, 0o644)
	release = release2
	c, outC := start("") // CPU-only
	repC := st.readOut(t, outC)
	if state, err := st.c.WaitJob(st.ctx, c); err != nil || state != "COMPLETED" {
		t.Fatalf("CPU-only job %s: %q %v", c, state, err)
	}

	chans := st.slurmChannels(t)
	for _, id := range []string{a, b, c} {
		if _, ok := chans[id]; !ok {
			t.Fatalf("slurmctld's log names no channel for job %s (have %v)", id, chans)
		}
	}
	if chans[a] == chans[b] {
		t.Fatalf("Slurm gave jobs %s and %s the same channel %d, though they ran at once", a, b, chans[a])
	}
	check := func(name, id string, rep cluster.OpenReport, allowed int64) {
		t.Helper()
		ch := chans[id]
		if ch >= imexFakeChannels {
			t.Fatalf("job %s: Slurm's channel %d is beyond the test's %d fake nodes", id, ch, imexFakeChannels)
		}
		for c, p := range fake {
			want := "EPERM"
			if int64(c) == allowed {
				want = "ENXIO"
			}
			if got := rep.Open[p]; got != want {
				t.Errorf("%s job %s (Slurm's channel %d): open %s: %q, want %s", name, id, ch, p, got, want)
			}
		}
		if got := rep.Open[pcluster]; got != "EPERM" {
			t.Errorf("%s job %s: open %s (channel 0): %q, want EPERM", name, id, pcluster, got)
		}
		// The node Slurm made in the step's own /dev: its channel only.
		var nodes []string
		for p := range rep.Open {
			if strings.HasPrefix(p, own+"/") {
				nodes = append(nodes, p)
			}
		}
		mine := fmt.Sprintf("%s/channel%d", own, ch)
		if len(nodes) != 1 || nodes[0] != mine {
			t.Errorf("%s job %s: the step's %s holds %v, want only %s", name, id, own, nodes, mine)
		}
		want := "EPERM"
		if allowed >= 0 {
			want = "ENXIO"
		}
		if got := rep.Open[mine]; got != want {
			t.Errorf("%s job %s: open its own %s: %q, want %s (probe %v)", name, id, mine, got, want, rep.Open)
		}
	}
	check("GPU", a, repA, int64(chans[a]))
	check("GPU", b, repB, int64(chans[b]))
	check("CPU-only", c, repC, -1)

	// Each denial is audited, attributed to the job, with the device.
	for _, j := range []struct {
		id    string
		other uint32
	}{{a, chans[b]}, {b, chans[a]}} {
		jid, _ := strconv.ParseUint(j.id, 10, 32)
		recs := st.waitRecords(t, uint32(jid), func(rs []audit.Record) bool {
			for _, r := range access(rs, "denied") {
				if r.Device != nil && r.Device.Major == major && r.Device.Minor == j.other {
					return true
				}
			}
			return false
		})
		found := false
		for _, r := range access(recs, "denied") {
			if r.Device != nil && r.Device.Major == major && r.Device.Minor == j.other {
				found = true
				if want := fmt.Sprintf("/dev/nvidia-caps-imex-channels/channel%d", j.other); r.Device.Kind != audit.DeviceIMEXChannel || r.Device.Path != want {
					t.Errorf("job %s: denied record of channel %d: device %+v, want kind %s, path %s", j.id, j.other, r.Device, audit.DeviceIMEXChannel, want)
				}
			}
		}
		if !found {
			t.Errorf("job %s: no denied audit record for channel %d:%d; records %+v", j.id, major, j.other, recs)
		}
	}
}
