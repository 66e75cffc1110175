// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	setupOnce sync.Once
	setup     *Setup
	setupErr  error
)

// TestMain undoes what Ensure created once every test of the binary ran, so
// that the test user is kept across clusters.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := setup.Teardown(nil); err != nil {
		fmt.Fprintln(os.Stderr, "teardown:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: starts munged, slurmctld and slurmd, creates device nodes and cgroups")
	}
	if testing.Short() {
		t.Skip("starts a real Slurm cluster; skipped with -short")
	}
	setupOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		setup, setupErr = Ensure(ctx, t.Logf)
	})
	if setupErr != nil {
		t.Fatalf("cluster.Ensure: %v", setupErr)
	}
}

// TestPrivilegedCluster drives one cluster through every check, in order,
// and ends by asserting that Stop leaves nothing of it behind.
func TestPrivilegedCluster(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	t0 := time.Now()
	c, err := Start(ctx, Options{Logf: t.Logf})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("Start took %s (root %s, ports %d/%d)", time.Since(t0), c.Root(), c.st.CtldPort, c.st.SlurmdPort)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			if err := c.Stop(); err != nil {
				t.Errorf("Stop: %v", err)
			}
		}
	})
	gfOpen, err := c.BuildTool(ctx, "gf-open")
	if err != nil {
		t.Fatal(err)
	}
	paths := append(c.DevPaths(), c.CtlPath())
	openArgs := append([]string{"--gres=gpu:1", gfOpen, "-env"}, paths...)

	t.Run("gpu step without filter", func(t *testing.T) {
		r := c.Run(ctx, TestUser, "srun", openArgs...)
		if r.Code != 0 {
			t.Fatalf("%s\n%s", r, c.diag())
		}
		rep := ParseOpen(r.Stdout)
		if rep.Env["SLURM_STEP_GPUS"] != "0" || rep.Env["CUDA_VISIBLE_DEVICES"] != "0" {
			t.Errorf("want SLURM_STEP_GPUS=0 CUDA_VISIBLE_DEVICES=0, got %v\n%s", rep.Env, r)
		}
		for _, p := range paths {
			if rep.Open[p] != "ENXIO" {
				t.Errorf("%s: %q, want ENXIO (no filter, no driver)\n%s", p, rep.Open[p], r)
			}
		}
		if !strings.HasPrefix(rep.Cgroup, strings.TrimPrefix(c.ScopeDir(), c.st.CgroupMount)+"/") {
			t.Errorf("task cgroup %q is not under the scope %s", rep.Cgroup, c.ScopeDir())
		}
		if dir, err := c.JobDirName(ctx, rep.Env["SLURM_JOB_ID"]); err != nil || !strings.Contains(rep.Cgroup, "/"+dir+"/step_0/") {
			t.Errorf("task cgroup %q is not in its job's step_0 (job dir %q, %v)", rep.Cgroup, dir, err)
		}
	})

	t.Run("cpu step", func(t *testing.T) {
		r := c.Run(ctx, TestUser, "srun", gfOpen, "-env")
		if r.Code != 0 {
			t.Fatalf("%s\n%s", r, c.diag())
		}
		rep := ParseOpen(r.Stdout)
		if !rep.Unset["SLURM_STEP_GPUS"] || !rep.Unset["CUDA_VISIBLE_DEVICES"] {
			t.Errorf("CPU-only step has GPU variables: %v", rep.Env)
		}
		if rep.Env["SLURM_JOB_ID"] == "" {
			t.Errorf("no SLURM_JOB_ID in the step: %s", r)
		}
	})

	t.Run("batch job", func(t *testing.T) {
		out := filepath.Join(c.Root(), "work", "batch-%j.out")
		id, err := c.Sbatch(ctx, TestUser, "--gres=gpu:2", "-o", out, "--wrap", gfOpen+" -env "+c.DevPath(0))
		if err != nil {
			t.Fatal(err)
		}
		state, err := c.WaitJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if state != "COMPLETED" {
			t.Errorf("job %s: %s", id, state)
		}
		b, err := os.ReadFile(strings.ReplaceAll(out, "%j", id))
		if err != nil {
			t.Fatal(err)
		}
		rep := ParseOpen(string(b))
		if rep.Env["SLURM_JOB_GPUS"] != "0,1" || rep.Env["SLURM_JOB_ID"] != id {
			t.Errorf("batch step env %v, want SLURM_JOB_GPUS=0,1 SLURM_JOB_ID=%s", rep.Env, id)
		}
		if dir, err := c.JobDirName(ctx, id); err != nil || !strings.Contains(rep.Cgroup, "/"+dir+"/step_batch/") {
			t.Errorf("batch cgroup %q, job dir %q (%v)", rep.Cgroup, dir, err)
		}
	})

	t.Run("slurm's own device filter", func(t *testing.T) {
		t1 := time.Now()
		if err := c.RestartSlurmd(true); err != nil {
			t.Fatal(err)
		}
		t.Logf("RestartSlurmd took %s", time.Since(t1))
		r := c.Run(ctx, TestUser, "srun", openArgs...)
		if r.Code != 0 {
			t.Fatalf("%s\n%s", r, c.diag())
		}
		rep := ParseOpen(r.Stdout)
		want := map[string]string{c.DevPath(0): "ENXIO", c.CtlPath(): "ENXIO"}
		for i := 1; i < 4; i++ {
			want[c.DevPath(i)] = "EPERM"
		}
		for p, w := range want {
			if rep.Open[p] != w {
				t.Errorf("%s: %q, want %s\n%s", p, rep.Open[p], w, r)
			}
		}
	})

	t.Run("stop leaves nothing", func(t *testing.T) {
		// A job still running at Stop exercises the cancel and cgroup cleanup.
		id, err := c.Sbatch(ctx, TestUser, "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 300")
		if err != nil {
			t.Fatal(err)
		}
		// The job is RUNNING in slurmctld before slurmd made its cgroup.
		for {
			jobCgroups, _ := c.ownCgroups()
			if dir, err := c.JobDirName(ctx, id); err == nil && containsSuffix(jobCgroups, "/"+dir) {
				break
			}
			if ctx.Err() != nil {
				r := c.Run(ctx, "", "squeue", "-h", "-j", id, "-o", "%T")
				t.Fatalf("job %s has no cgroup among %v: %s", id, jobCgroups, r)
			}
			time.Sleep(100 * time.Millisecond)
		}
		daemons := c.Daemons()
		root, scope := c.Root(), c.ScopeDir()
		slice := filepath.Join(c.st.CgroupMount, c.slice())
		createdScope, createdSlice := !c.st.ScopeExisted[scope], c.st.CreatedSystemSlice
		t2 := time.Now()
		stopped = true
		if err := c.Stop(); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		t.Logf("Stop took %s", time.Since(t2))
		for _, p := range daemons {
			if p.Alive() {
				t.Errorf("%s (pid %d) still runs", p.Name, p.PID)
			}
		}
		if pids := procsMentioning(root); len(pids) > 0 {
			t.Errorf("processes still refer to %s: %v", root, pids)
		}
		if createdScope {
			if _, err := os.Stat(scope); !os.IsNotExist(err) {
				t.Errorf("%s still exists (%v)", scope, err)
			}
		}
		if createdSlice {
			if _, err := os.Stat(slice); !os.IsNotExist(err) {
				t.Errorf("%s still exists (%v)", slice, err)
			}
		}
		if _, err := os.Stat(root); !os.IsNotExist(err) {
			t.Errorf("%s still exists (%v)", root, err)
		}
	})
}

// procsMentioning lists processes whose command line or environment names
// dir: every process of the cluster has SLURM_CONF=<dir>/… or runs from it.
func procsMentioning(dir string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), f))
			if err == nil && strings.Contains(string(b), dir) {
				cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				out = append(out, e.Name()+" "+strings.ReplaceAll(string(cmd), "\x00", " "))
				break
			}
		}
	}
	return out
}

func containsSuffix(s []string, suffix string) bool {
	for _, x := range s {
		if strings.HasSuffix(x, suffix) {
			return true
		}
	}
	return false
}
