// SPDX-License-Identifier: Apache-2.0

package e2e

// What changes between the Slurm releases the suite runs on (GPUFENCE_SLURM,
// tests/slurmrel): where the scope is and how job cgroups are named, Slurm's
// own device programs under ConstrainDevices=yes (which 25.05 and later
// make a step fail on), salloc's interactive step.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/tests/cluster"
)

// newestRunning is the id of the newest running job.
func (st *suite) newestRunning(t *testing.T) string {
	t.Helper()
	q := st.c.Run(st.ctx, "", "squeue", "-h", "-t", "R", "-o", "%i", "--sort=-i")
	ids := strings.Fields(q.Stdout)
	if len(ids) == 0 {
		t.Fatalf("no running job: %s", q)
	}
	return ids[0]
}

// TestPrivilegedReleaseLayout: the scope is where this release puts it
// (system.slice or CgroupSlice; <node>_slurmstepd.scope for a Slurm built
// with multiple-slurmd support, Debian's packages and the multislurmd
// source builds, slurmstepd.scope for a plain source build as SchedMD and
// ParallelCluster ship it), the agent attached its filter there and
// `gpufence status` finds it, job cgroups are named as the release names them
// (job_<id>, or the job's SLUID on 26.05 unless CgroupJobIdPaths=yes), and
// `gpufence doctor` describes the same layout.
func TestPrivilegedReleaseLayout(t *testing.T) {
	st := get(t)
	c := st.c
	scope := c.ScopeDir()
	wantName := "slurmstepd.scope"
	if c.MultiSlurmd() {
		wantName = c.Hostname() + "_slurmstepd.scope"
	}
	if filepath.Base(scope) != wantName || filepath.Base(filepath.Dir(scope)) != c.Slice() {
		t.Errorf("Slurm %s (%s) made its scope at %s, want <cgroup2>/%s/%s", c.SlurmVersion(), c.Kind(), scope, c.Slice(), wantName)
	}
	alog, _ := os.ReadFile(st.agent.Log)
	if !regexp.MustCompile(`(?m)msg="device filter attached" .*\bcgroup=` + regexp.QuoteMeta(scope) + `( |$)`).Match(alog) {
		t.Errorf("the agent did not attach its filter to %s:\n%s", scope, tailLines(string(alog), 20))
	}
	out, _ := st.status(t)
	var status struct {
		Filter struct {
			Scope string `json:"scope"`
		} `json:"filter"`
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil || status.Filter.Scope != scope {
		t.Errorf("gpufence status: filter scope %q (%v), want %s", status.Filter.Scope, err, scope)
	}

	release := st.hold(t, 1)
	defer release()
	id := st.newestRunning(t)
	name, err := c.JobDirName(st.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if c.SLUID() {
		// 26.05: an "s" and 13 base-32 characters (sEKNKTV3WPV500).
		if !regexp.MustCompile(`^s[0-9A-Z]{13}$`).MatchString(name) {
			t.Errorf("job %s: SLUID %q from scontrol does not look like one", id, name)
		}
	} else if name != "job_"+id {
		t.Errorf("job %s: cgroup name %q, want job_%s", id, name, id)
	}
	if st.jobCgroup(id) != filepath.Join(scope, name) {
		t.Errorf("job %s has no batch step cgroup at %s", id, filepath.Join(scope, name))
	}
	t.Logf("Slurm %s: scope %s, job %s in %s", c.SlurmVersion(), scope, id, name)

	// gpufence doctor, with this cluster's Slurm first in PATH.
	cfg := filepath.Join(c.Root(), "etc", fmt.Sprintf("agent-%d.yaml", st.starts))
	cmd := exec.Command(st.gpufence, "doctor", "--json", "--config", cfg, "--slurm-conf", c.SlurmConf())
	cmd.Env = append(os.Environ(), "PATH="+c.ToolPATH())
	b, _ := cmd.Output()
	var rep struct {
		Checks []struct {
			ID, Verdict, Summary string
			Detail               []string
		} `json:"checks"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("gpufence doctor --json: %v\n%s", err, b)
	}
	found := false
	for _, ch := range rep.Checks {
		if ch.ID != "slurm-layout" {
			continue
		}
		found = true
		detail := strings.Join(ch.Detail, "\n")
		if ch.Verdict != "ok" || !strings.Contains(ch.Summary, "Slurm "+c.Release()) || !strings.Contains(ch.Summary, "scope "+scope) {
			t.Errorf("doctor slurm-layout: %s %q, want ok naming Slurm %s and scope %s\n%s", ch.Verdict, ch.Summary, c.Release(), scope, detail)
		}
		if c.SLUID() != strings.Contains(detail, "named by the job's SLUID") {
			t.Errorf("doctor slurm-layout on SLUID=%v says:\n%s", c.SLUID(), detail)
		}
	}
	if !found {
		t.Errorf("gpufence doctor has no slurm-layout check:\n%s", b)
	}
}

// deviceProgs lists the CGROUP_DEVICE programs attached to a cgroup
// directory itself (not inherited), by name.
func deviceProgs(t *testing.T, dir string) []string {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		t.Fatalf("query device programs of %s: %v", dir, err)
	}
	var names []string
	for _, p := range res.Programs {
		prog, err := ebpf.NewProgramFromID(p.ID)
		if err != nil {
			names = append(names, fmt.Sprintf("id %d (%v)", p.ID, err))
			continue
		}
		info, err := prog.Info()
		prog.Close()
		if err != nil {
			names = append(names, fmt.Sprintf("id %d (%v)", p.ID, err))
			continue
		}
		names = append(names, info.Name)
	}
	return names
}

// TestPrivilegedSlurmDeviceProgramAttached: with ConstrainDevices=yes Slurm
// attaches its own device programs to the job's and the step's cgroups,
// below gpufence's filter on the scope. From 25.05 a step fails when its
// program cannot be attached: gpufence's multi-attach link must never be
// the reason. Slurm's programs are there, gpufence's is on the scope, and
// every step, a new one in a running job too, runs, each held to its GPUs.
func TestPrivilegedSlurmDeviceProgramAttached(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	if err := st.c.RestartSlurmd(true); err != nil {
		t.Fatal(err)
	}
	defer func() {
		st.waitIdle(t)
		if err := st.c.RestartSlurmd(false); err != nil {
			t.Fatal(err)
		}
	}()
	release := st.hold(t, 2)
	defer release()
	id := st.newestRunning(t)
	job := st.jobCgroup(id)
	if job == "" {
		t.Fatalf("job %s has no cgroup", id)
	}
	slurmProgs := 0
	var where []string
	filepath.Walk(job, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.IsDir() {
			return nil
		}
		for _, n := range deviceProgs(t, p) {
			if strings.HasPrefix(n, "Slurm") {
				slurmProgs++
				where = append(where, strings.TrimPrefix(p, st.c.ScopeDir()+"/")+": "+n)
			}
		}
		return nil
	})
	if slurmProgs == 0 {
		t.Errorf("Slurm %s attached no device program under %s with ConstrainDevices=yes", st.c.SlurmVersion(), job)
	}
	ours := deviceProgs(t, st.c.ScopeDir())
	if len(ours) == 0 {
		t.Errorf("no device program on the scope %s: gpufence's filter is not attached", st.c.ScopeDir())
	}
	if _, err := policyEntries(st.c.ScopeDir()); err != nil {
		t.Errorf("gpufence's filter on the scope: %v", err)
	}
	t.Logf("Slurm %s: its programs %v; on the scope %v", st.c.SlurmVersion(), where, ours)

	// A new step in the running job (Slurm attaches again for it), and a
	// new job: both run, and each is held to its own GPUs.
	r := st.c.Run(st.ctx, user, "srun", append([]string{"--jobid=" + id, "--overlap", "--gres=gpu:1", st.open, "-env"}, st.paths()...)...)
	mustOK(t, r)
	rep := cluster.ParseOpen(r.Stdout)
	st.expectGPUs(t, rep, gpusOf(t, rep, "SLURM_STEP_GPUS"))
	rep2, r2 := st.srun(t, nil, "--gres=gpu:1")
	mustOK(t, r2)
	st.expectGPUs(t, rep2, gpusOf(t, rep2, "SLURM_STEP_GPUS"))
	if b, _ := os.ReadFile(st.c.LogPath("slurmd.log")); regexp.MustCompile(`(?i)error.*(ebpf|bpf prog|attach)`).Match(b) {
		t.Errorf("slurmd logged a device program error:\n%s", tailLines(string(b), 30))
	}
}

// TestPrivilegedInteractiveStep: with LaunchParameters=use_interactive_step,
// salloc starts the user's shell as the job's interactive step on the node.
// That step gets the job's GPUs and no more, even with every GPU variable
// forged in the environment it preserves.
func TestPrivilegedInteractiveStep(t *testing.T) {
	st := get(t)
	conf, err := os.ReadFile(st.c.SlurmConf())
	if err != nil {
		t.Fatal(err)
	}
	// Only the clients read this copy: salloc decides to start the
	// interactive step, and the srun it runs for it inherits SLURM_CONF.
	interactive := filepath.Join(st.c.Root(), "etc", "slurm-interactive.conf")
	if err := os.WriteFile(interactive, append(conf, []byte("LaunchParameters=use_interactive_step\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	// GPUs 0 and 1 held: the salloc job gets GPU 2.
	release := st.hold(t, 2)
	defer release()
	// salloc runs InteractiveStepOptions, "... $SHELL" by default.
	forged := []string{"SLURM_CONF=" + interactive, "SHELL=/bin/sh", "SLURM_JOB_GPUS=0,1,2,3", "SLURM_STEP_GPUS=0,1,2,3", "CUDA_VISIBLE_DEVICES=0,1,2,3"}
	shell := fmt.Sprintf("%s -env %s\nexit\n", st.open, strings.Join(st.paths(), " "))
	deadline := time.Now().Add(60 * time.Second)
	var r cluster.Result
	for {
		r = st.c.RunStdin(st.ctx, user, forged, shell, "salloc", "--gres=gpu:1")
		if r.Code == 0 || time.Now().After(deadline) || !strings.Contains(r.Stderr, "queued") {
			break
		}
		time.Sleep(time.Second)
	}
	mustOK(t, r)
	rep := cluster.ParseOpen(r.Stdout)
	if len(rep.Open) == 0 {
		t.Fatalf("the interactive shell ran nothing:\n%s", r)
	}
	// 0xfffffffa: Slurm's interactive step, not a shell on the submit
	// host (26.05 prints it signed, -6).
	if id := rep.Env["SLURM_STEP_ID"]; id != "4294967290" && id != "-6" {
		t.Fatalf("SLURM_STEP_ID=%q: not the interactive step (4294967290)\n%s", id, r)
	}
	st.expectGPUs(t, rep, []int{2})
	if !slices.Contains([]string{"0", "2"}, rep.Env["CUDA_VISIBLE_DEVICES"]) {
		t.Errorf("CUDA_VISIBLE_DEVICES=%q in the interactive step, want the job's GPU (0 local or 2)", rep.Env["CUDA_VISIBLE_DEVICES"])
	}
	t.Logf("interactive step of Slurm %s: cgroup %s, CUDA_VISIBLE_DEVICES=%s", st.c.SlurmVersion(), rep.Cgroup, rep.Env["CUDA_VISIBLE_DEVICES"])
}

// TestPrivilegedUserNamespace: Slurm 25.11's namespace/linux can start a
// job's tasks in a user namespace of their own (CLONE_NEWUSER). Without a
// BPF token Slurm then skips its own job and step device programs
// (task/cgroup: "Skipping job and step device constrain ... in a user
// namespace"), so even with ConstrainDevices=yes Slurm constrains nothing.
// gpufence's filter is attached to the scope from the host's namespaces by
// the agent, and holds every task, whatever namespace it runs in: the task
// is in another user namespace, and still opens its own GPU only.
func TestPrivilegedUserNamespace(t *testing.T) {
	st := get(t)
	if !st.c.AtLeast("25.11") {
		t.Skipf("Slurm %s has no namespace/linux plugin (25.11 added it)", st.c.SlurmVersion())
	}
	st.waitIdle(t)
	if err := st.c.RestartSlurmd(true); err != nil {
		t.Fatal(err)
	}
	// disable_bpf_token: no token (and Slurm built without token support
	// fails the step otherwise); an option of defaults, not a top-level key.
	yaml := fmt.Sprintf("defaults:\n  auto_base_path: true\n  base_path: %q\n  clone_ns_flags:\n    - \"CLONE_NEWUSER\"\n  disable_bpf_token: true\n", st.c.NamespaceBase())
	if err := st.c.SetNamespace(yaml); err != nil {
		t.Fatal(err)
	}
	defer func() {
		st.waitIdle(t)
		if err := st.c.SetNamespace(""); err != nil {
			t.Fatal(err)
		}
		if err := st.c.RestartSlurmd(false); err != nil {
			t.Fatal(err)
		}
	}()
	hostNS, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		t.Fatal(err)
	}
	probe := fmt.Sprintf("echo userns $(readlink /proc/self/ns/user); exec %s -env %s", st.open, strings.Join(st.paths(), " "))
	for _, tc := range []struct {
		name string
		args []string
	}{{"gpu:1", []string{"--gres=gpu:1"}}, {"cpu-only", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			// Each job on an idle node: namespace/linux tears the last
			// job's namespace down in its epilog.
			// (A debroot's slurmd runs on one CPU while namespace/linux
			// is on: gfroot -one-cpu says why.)
			st.waitIdle(t)
			logBefore := fileSize(st.c.LogPath("slurmd.log"))
			r := st.c.Run(st.ctx, user, "srun", append(tc.args, "sh", "-c", probe)...)
			if r.Code != 0 {
				var errs []string
				for _, l := range strings.Split(logSince(st.c.LogPath("slurmd.log"), logBefore), "\n") {
					if strings.Contains(l, "error") || strings.Contains(l, "namespace") {
						errs = append(errs, l)
					}
				}
				t.Fatalf("%s\nslurmd.log of this job, errors and namespace lines:\n%s", r, tailLines(strings.Join(errs, "\n"), 40))
			}
			ns := ""
			for _, l := range strings.Split(r.Stdout, "\n") {
				if v, ok := strings.CutPrefix(l, "userns "); ok {
					ns = strings.TrimSpace(v)
				}
			}
			if ns == "" || ns == hostNS {
				t.Fatalf("the task's user namespace is %q, the host's %s: namespace/linux did not put it in one of its own\n%s", ns, hostNS, r)
			}
			rep := cluster.ParseOpen(r.Stdout)
			var want []int
			if len(tc.args) > 0 {
				want = gpusOf(t, rep, "SLURM_STEP_GPUS")
				if len(want) != 1 {
					t.Fatalf("Slurm gave %v, want one GPU", want)
				}
			}
			st.expectGPUs(t, rep, want)
		})
	}
	b, _ := os.ReadFile(st.c.LogPath("slurmd.log"))
	if !strings.Contains(string(b), "Skipping job and step device constrain as we are in a user namespace") {
		t.Errorf("slurmd.log does not say Slurm skipped its own device constraint in the user namespace: the test no longer shows gpufence alone holding the tasks")
	}
}

// TestPrivilegedUUIDVisibleDevices: Slurm 26.05's gres.conf Flags=env_uuid
// puts the GPUs' UUIDs into CUDA_VISIBLE_DEVICES instead of indices (it
// needs AutoDetect; here AutoDetect=nvidia reads the harness's fake
// /proc/driver/nvidia, SetFakeDriver). The plugin must not break that: the
// task sees the UUIDs of its own GPUs, never a renumbered or forged list,
// and is held to those GPUs.
func TestPrivilegedUUIDVisibleDevices(t *testing.T) {
	st := get(t)
	if !st.c.AtLeast("26.05") || st.c.Kind() != "debroot" {
		t.Skipf("Slurm %s (%s): Flags=env_uuid is Slurm 26.05's, and the fake driver needs a Debian root's own /dev", st.c.SlurmVersion(), st.c.Kind())
	}
	st.waitIdle(t)
	restartAgent := func() {
		t.Helper()
		if err := st.agent.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.c.SetFakeDriver(true); err != nil {
		t.Fatal(err)
	}
	// The agent reads gres.conf at its start.
	restartAgent()
	defer func() {
		st.waitIdle(t)
		if err := st.c.SetFakeDriver(false); err != nil {
			t.Fatal(err)
		}
		restartAgent()
	}()
	var paths []string
	for i := range 4 {
		paths = append(paths, st.c.FakeDevPath(i))
	}
	paths = append(paths, "/dev/nvidiactl", "/dev/nvidia-uvm")
	forged := []string{"CUDA_VISIBLE_DEVICES=0,1,2,3", "SLURM_STEP_GPUS=0,1,2,3"}
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("gpu:%d", n), func(t *testing.T) {
			r := st.c.RunEnv(st.ctx, user, forged, "srun", append([]string{fmt.Sprintf("--gres=gpu:%d", n), st.open, "-env"}, paths...)...)
			mustOK(t, r)
			rep := cluster.ParseOpen(r.Stdout)
			own := gpusOf(t, rep, "SLURM_STEP_GPUS")
			if len(own) != n {
				t.Fatalf("Slurm gave %v, want %d GPUs", own, n)
			}
			var uuids []string
			for _, g := range own {
				uuids = append(uuids, cluster.FakeUUID(g))
			}
			if got := rep.Env["CUDA_VISIBLE_DEVICES"]; got != strings.Join(uuids, ",") {
				t.Errorf("CUDA_VISIBLE_DEVICES=%q, want the UUIDs of GPUs %v: %q", got, own, strings.Join(uuids, ","))
			}
			for i := range 4 {
				want := "EPERM"
				if slices.Contains(own, i) {
					want = "ENXIO"
				}
				if got := rep.Open[paths[i]]; got != want {
					t.Errorf("%s: %q, want %s (own %v)", paths[i], got, want, own)
				}
			}
			for _, p := range paths[4:] {
				if rep.Open[p] != "ENXIO" {
					t.Errorf("%s: %q, want ENXIO", p, rep.Open[p])
				}
			}
		})
	}
}

// fileSize is a file's size now, 0 if it cannot be read.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logSince is what a log file gained after offset (the whole file if it
// shrank).
func logSince(path string, offset int64) string {
	b, _ := os.ReadFile(path)
	if int64(len(b)) < offset {
		offset = 0
	}
	return string(b[offset:])
}
