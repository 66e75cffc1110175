// SPDX-License-Identifier: Apache-2.0

// Package e2e drives the whole product against a real Slurm on this machine:
// real slurmctld, slurmd and slurmstepd loading the SPANK plugin, the real
// agent, and the kernel enforcing the device filter on fake GPUs (an allowed
// GPU opens with ENXIO, a denied one with EPERM). The release is Debian 12's
// 22.05 unless GPUFENCE_SLURM names another (`make e2e SLURM=25.11`; see
// tests/slurmrel): the suite then runs against that release's own daemons,
// with the plugin built against that release's own headers.
package e2e

import (
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/gpufence/gpufence/agent/gpulist"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/tests/cluster"
)

const user = cluster.TestUser

// suite is one cluster with the plugin and the agent, shared by the tests of
// this package (starting Slurm costs seconds; CI has two cores).
type suite struct {
	c        *cluster.Cluster
	agent    *cluster.Process
	gpufence string // the gpufence binary under test
	plugin   string // the SPANK entry
	open     string // gf-open in the cluster's root
	sock     string
	// starts counts agent starts; each writes its own audit file.
	starts     int
	auditFiles []string
	// bpffs is the suite's own bpffs mount for the agent's pins.
	bpffs        string
	bpffsMounted bool
	// activatedStarts counts socket-activated agent starts (one log).
	activatedStarts int
	// statusAfterRestart is `gpufence status --json` right after a kill -9.
	statusAfterRestart string
	ctx                context.Context
	cancel             context.CancelFunc
	// metricsAddr is every agent start's metrics endpoint and jobMapDir its
	// dcgm-exporter job mapping directory (metrics_test.go); webConfig
	// admits metricsUser with metricsPassword to the per-job series.
	metricsAddr, jobMapDir                  string
	webConfig, metricsUser, metricsPassword string
}

var (
	s        *suite
	setup    *cluster.Setup
	setupErr error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if s != nil {
		// Checks over the whole suite, after every test whatever their order.
		if err := s.finalChecks(); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: final checks:", err)
			if code == 0 {
				code = 1
			}
		}
		// Stop fails when a process or cgroup of the suite is left.
		if err := s.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop cluster:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	if err := setup.Teardown(nil); err != nil {
		fmt.Fprintln(os.Stderr, "teardown:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

var once sync.Once

// get starts the shared cluster on first use, or skips the test where this
// machine cannot run it.
func get(t *testing.T) *suite {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("end-to-end tests need root: they start munged, slurmctld, slurmd and the agent")
	}
	if testing.Short() {
		t.Skip("end-to-end tests start a real Slurm cluster; skipped with -short")
	}
	once.Do(func() { s, setupErr = start(t) })
	if setupErr != nil {
		t.Fatalf("start cluster: %v", setupErr)
	}
	return s
}

func start(t *testing.T) (*suite, error) {
	// The suite's commands run under a context that only its end cancels:
	// each command has its own limit (cluster.CommandTimeout), so one stuck
	// job fails its test, not every test after the first 20 minutes.
	// Waiting for the cluster lock and building are bounded apart.
	ctx, cancel := context.WithCancel(context.Background())
	setupCtx, setupCancel := context.WithTimeout(ctx, 20*time.Minute)
	defer setupCancel()
	var err error
	if setup, err = cluster.Ensure(setupCtx, t.Logf); err != nil {
		cancel()
		return nil, err
	}
	gf, treePlugin, err := binaries(setupCtx)
	if err != nil {
		cancel()
		return nil, err
	}
	st := &suite{gpufence: gf, ctx: ctx, cancel: cancel}
	var binds []string
	if r := os.Getenv("GPUFENCE_INSTALL_ROOT"); r != "" {
		binds = append(binds, r)
	}
	t0 := time.Now()
	// GPUFENCE_E2E_KEEP=1 keeps the cluster's folder (logs, audit files)
	// for a post-mortem. A source build of the release, when not cached,
	// happens in Start, within setupCtx.
	c, err := cluster.Start(setupCtx, cluster.Options{Logf: t.Logf, Binds: binds, Keep: os.Getenv("GPUFENCE_E2E_KEEP") != ""})
	if err != nil {
		cancel()
		return nil, err
	}
	st.c = c
	t.Logf("Slurm %s (%s, %s) up in %s", c.SlurmVersion(), c.Selection(), c.Kind(), time.Since(t0).Round(time.Millisecond))
	if st.plugin, err = pluginFor(setupCtx, c, treePlugin); err != nil {
		st.stop()
		return nil, err
	}
	t.Logf("testing %s and %s", gf, st.plugin)
	st.sock = filepath.Join(c.Root(), "run", "agent.sock")
	// The agent pins its filter in a bpffs of the suite's own, never in
	// the host's /sys/fs/bpf.
	st.bpffs = filepath.Join(c.Root(), "bpffs")
	if err := os.MkdirAll(st.bpffs, 0o700); err != nil {
		st.stop()
		return nil, err
	}
	if out, err := exec.Command("mount", "-t", "bpf", "gpufence-e2e", st.bpffs).CombinedOutput(); err != nil {
		st.stop()
		return nil, fmt.Errorf("mount bpffs: %v %s", err, out)
	}
	st.bpffsMounted = true
	if st.open, err = c.BuildTool(setupCtx, "gf-open"); err != nil {
		st.stop()
		return nil, err
	}
	// slurmd runs job_prolog only for plugins present when it started.
	if err := c.WritePlugstack([]string{st.plugstackLine()}); err != nil {
		st.stop()
		return nil, err
	}
	if err := c.RestartSlurmd(false); err != nil {
		st.stop()
		return nil, err
	}
	if err := st.startAgent(); err != nil {
		st.stop()
		return nil, err
	}
	return st, nil
}

// binaries returns the gpufence binary under test and the tree's SPANK
// entry (bin/spank_gpufence.so; "" for a package). GPUFENCE_INSTALL_ROOT
// switches the suite to an installed package: the files the .deb or .rpm
// put under that root (/ for this machine, or a chroot the package was
// installed into). Without it, the tree's bin/ is built with make.
func binaries(ctx context.Context) (gpufence, treePlugin string, err error) {
	if r := os.Getenv("GPUFENCE_INSTALL_ROOT"); r != "" {
		gpufence = filepath.Join(r, "usr/sbin/gpufence")
		if _, err := os.Stat(gpufence); err != nil {
			return "", "", fmt.Errorf("GPUFENCE_INSTALL_ROOT=%s: %w (is the package installed there?)", r, err)
		}
		return gpufence, "", nil
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		return "", "", err
	}
	out, err := exec.CommandContext(ctx, "make", "-C", root, "build").CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("make build: %v\n%s", err, out)
	}
	return filepath.Join(root, "bin", "gpufence"), filepath.Join(root, "bin", "spank_gpufence.so"), nil
}

// pluginFor returns the SPANK entry the cluster's release loads. From an
// installed package: the plugin link its maintainer script made, when it
// points at this release's build (it must resolve inside the root), else
// that release's build in the package. From the tree: treePlugin when `make
// build` compiled it against this release's headers (this machine's), else
// a build against the release's own headers in the cluster's folder.
func pluginFor(ctx context.Context, c *cluster.Cluster, treePlugin string) (string, error) {
	want := "slurm-" + c.Release() + "/spank_gpufence.so"
	if r := os.Getenv("GPUFENCE_INSTALL_ROOT"); r != "" {
		link := filepath.Join(r, "usr/lib/gpufence/spank_gpufence.so")
		if target, err := os.Readlink(link); err == nil && target == want {
			if _, err := os.Stat(link); err != nil {
				return "", fmt.Errorf("GPUFENCE_INSTALL_ROOT=%s: %w", r, err)
			}
			return link, nil
		}
		plugin := filepath.Join(r, "usr/lib/gpufence", want)
		if _, err := os.Stat(plugin); err != nil {
			return "", fmt.Errorf("GPUFENCE_INSTALL_ROOT=%s has no build for Slurm %s: %w", r, c.Release(), err)
		}
		return plugin, nil
	}
	if v, err := pluginVersion(treePlugin); err == nil && fmt.Sprintf("%d.%02d", v>>16, v>>8&0xff) == c.Release() {
		return treePlugin, nil
	}
	return c.BuildPlugin(ctx)
}

// pluginVersion reads the plugin_version symbol of a SPANK plugin file.
func pluginVersion(path string) (uint32, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return 0, err
	}
	for _, s := range syms {
		if s.Name != "plugin_version" || int(s.Section) >= len(f.Sections) {
			continue
		}
		sec := f.Sections[s.Section]
		data, err := sec.Data()
		if err != nil {
			return 0, err
		}
		if off := s.Value - sec.Addr; off+4 <= uint64(len(data)) {
			return binary.LittleEndian.Uint32(data[off:]), nil
		}
	}
	return 0, fmt.Errorf("%s: no plugin_version symbol", path)
}

// batchAndStep runs a batch job holding jobGres whose script probes paths,
// then probes them again in an inner srun step holding stepGres, and
// returns both probes' output.
func (st *suite) batchAndStep(t *testing.T, name string, paths []string, jobGres, stepGres string) (batch, step cluster.OpenReport) {
	t.Helper()
	out := filepath.Join(st.c.Root(), "work", name+".$SLURM_JOB_ID")
	probe := st.open + " -env " + strings.Join(paths, " ")
	script := fmt.Sprintf("%s > %s.batch\nsrun --gres=%s %s > %s.step\n", probe, out, stepGres, probe, out)
	id := st.submit(t, nil, []string{"--gres=" + jobGres}, script)
	out = strings.ReplaceAll(out, "$SLURM_JOB_ID", id)
	return st.readOut(t, out+".batch"), st.readOut(t, out+".step")
}

// plugstackLine is the suite's usual plugstack.conf line; extra options
// (key=value) are appended.
func (st *suite) plugstackLine(extra ...string) string {
	args := []string{"required", st.plugin, "socket=" + st.sock, "timeout=5"}
	return strings.Join(append(args, extra...), " ")
}

// agentOpts are the settings an agent start differs by.
type agentOpts struct {
	mode      string // attach mode; "" = auto
	auditOnly bool
	auditFile string // "" = a new file under the cluster's logs
	// slurmBinDir is where the agent finds scontrol and squeue; "" = PATH.
	slurmBinDir string
	// yaml is appended to the agent's configuration file (a test's own
	// keys, e.g. nvswitch_test.go's fake majors).
	yaml string
	// openMetrics leaves out metrics.web_config: the shipped default,
	// node aggregates to every scraper.
	openMetrics bool
}

// agentArgs writes the agent's own configuration file and audit file for
// one start (journald off: the suite never writes into a journal it did not
// start; pins in the suite's own bpffs) and returns the agent's arguments.
func (st *suite) agentArgs(o ...agentOpts) ([]string, error) {
	var opt agentOpts
	if len(o) > 0 {
		opt = o[0]
	}
	st.starts++
	ocsf := ""
	if opt.auditFile == "" {
		opt.auditFile = filepath.Join(st.c.Root(), "logs", fmt.Sprintf("audit-%d.jsonl", st.starts))
		// A start of the suite's own files writes the OCSF file too; a
		// test's own (a full file system) only its JSON Lines file.
		ocsf = ocsfFile(opt.auditFile)
	}
	st.auditFiles = append(st.auditFiles, opt.auditFile)
	cfg := filepath.Join(st.c.Root(), "etc", fmt.Sprintf("agent-%d.yaml", st.starts))
	// Reconcile often, so that tests of what it does wait seconds, not tens.
	yaml := fmt.Sprintf("audit:\n  file: %s\n  ocsf_file: %q\n  journald: \"off\"\n  flush_interval: 500ms\npin_dir: %s\nstate_file: %s\nfailopen_spool: %s\nreconcile_interval: 2s\n",
		opt.auditFile, ocsf, filepath.Join(st.bpffs, "gpufence"), filepath.Join(st.c.Root(), "run", "agent-state.json"), st.spool())
	if opt.slurmBinDir != "" {
		yaml += fmt.Sprintf("slurm_bin_dir: %s\n", opt.slurmBinDir)
	}
	// The agent never searches PATH for slurmd: a release's own is named.
	if p := st.c.SlurmdPath(); p != "" {
		yaml += fmt.Sprintf("slurmd: %s\n", p)
	}
	if opt.auditOnly {
		yaml += "enforcement: audit-only\n"
	}
	// No driver registers nvidia-caps here: the cluster's fake major.
	yaml += fmt.Sprintf("nvidia_caps_major: %d\n", st.c.CapsMajor())
	yaml += opt.yaml
	if err := st.metricsSetup(); err != nil {
		return nil, err
	}
	yaml += fmt.Sprintf("metrics:\n  listen: %s\n  sample_interval: 1s\n", st.metricsAddr)
	if !opt.openMetrics {
		yaml += fmt.Sprintf("  web_config: %s\n", st.webConfig)
	}
	yaml += fmt.Sprintf("dcgm_job_mapping_dir: %s\n", st.jobMapDir)
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		return nil, err
	}
	args := []string{"agent", "--config", cfg, "--socket", st.sock, "--slurm-conf", st.c.SlurmConf(), "--log-level", "debug"}
	if opt.mode != "" {
		args = append(args, "--mode", opt.mode)
	}
	return args, nil
}

// startAgent starts the agent and waits for its socket.
func (st *suite) startAgent(o ...agentOpts) error {
	args, err := st.agentArgs(o...)
	if err != nil {
		return err
	}
	p, err := st.c.StartAgent(st.ctx, st.gpufence, args...)
	if err != nil {
		return err
	}
	st.agent = p
	return cluster.WaitListener(st.sock, p.PID, 20*time.Second)
}

func (st *suite) stop() error {
	var errs []error
	if st.agent != nil {
		errs = append(errs, st.agent.Stop())
	}
	if st.bpffsMounted {
		// Dropping the pins detaches the filter.
		if out, err := exec.Command("umount", st.bpffs).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("umount %s: %v %s", st.bpffs, err, out))
		}
	}
	if st.c != nil {
		errs = append(errs, st.c.Stop())
	}
	st.cancel()
	return errors.Join(errs...)
}

// paths of the fake devices a job probes: 4 GPUs, nvidiactl, nvidia-uvm.
func (st *suite) paths() []string {
	return append(st.c.DevPaths(), st.c.CtlPath(), filepath.Join(st.c.Root(), "dev", "nvidia-uvm"))
}

// srun runs gf-open in a step and parses what it saw.
func (st *suite) srun(t *testing.T, env []string, args ...string) (cluster.OpenReport, cluster.Result) {
	t.Helper()
	full := append(append([]string{}, args...), st.open, "-env")
	full = append(full, st.paths()...)
	r := st.c.RunEnv(st.ctx, user, env, "srun", full...)
	return cluster.ParseOpen(r.Stdout), r
}

// expectGPUs checks that exactly the GPUs in want open (ENXIO) and the
// others are denied (EPERM), and that nvidiactl and nvidia-uvm open.
func (st *suite) expectGPUs(t *testing.T, rep cluster.OpenReport, want []int) {
	t.Helper()
	for i, p := range st.c.DevPaths() {
		exp := "EPERM"
		if slices.Contains(want, i) {
			exp = "ENXIO"
		}
		if got := rep.Open[p]; got != exp {
			t.Errorf("nvidia%d: %q, want %s (allowed %v)", i, got, exp, want)
		}
	}
	for _, p := range st.paths()[4:] {
		if got := rep.Open[p]; got != "ENXIO" {
			t.Errorf("%s: %q, want ENXIO (CUDA needs it in every job)", filepath.Base(p), got)
		}
	}
}

// gpusOf parses a Slurm GPU list variable from the task's environment.
func gpusOf(t *testing.T, rep cluster.OpenReport, name string) []int {
	t.Helper()
	g, err := gpulist.Parse(rep.Env[name])
	if err != nil {
		t.Fatalf("%s=%q: %v", name, rep.Env[name], err)
	}
	return g
}

func mustOK(t *testing.T, r cluster.Result) {
	t.Helper()
	if r.Code != 0 {
		t.Fatalf("%s", r)
	}
}

func TestPrivilegedIsolation(t *testing.T) {
	st := get(t)
	isolationChecks(t, st)
}

// isolationChecks are the properties that must hold with and without
// Slurm's own ConstrainDevices.
func isolationChecks(t *testing.T, st *suite) {
	for _, n := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("srun gpu:%d", n), func(t *testing.T) {
			rep, r := st.srun(t, nil, fmt.Sprintf("--gres=gpu:%d", n))
			mustOK(t, r)
			got := gpusOf(t, rep, "SLURM_STEP_GPUS")
			if len(got) != n {
				t.Fatalf("Slurm gave %v, want %d GPUs", got, n)
			}
			st.expectGPUs(t, rep, got)
			local := make([]string, n)
			for i := range local {
				local[i] = fmt.Sprint(i)
			}
			if cvd := rep.Env["CUDA_VISIBLE_DEVICES"]; cvd != strings.Join(local, ",") {
				t.Errorf("CUDA_VISIBLE_DEVICES=%q, want %q", cvd, strings.Join(local, ","))
			}
		})
	}

	t.Run("cpu-only srun", func(t *testing.T) {
		rep, r := st.srun(t, nil)
		mustOK(t, r)
		st.expectGPUs(t, rep, nil)
	})

	t.Run("cpu-only sbatch", func(t *testing.T) {
		rep := st.sbatch(t, nil, nil, fmt.Sprintf("%s -env %s", st.open, strings.Join(st.paths(), " ")))
		st.expectGPUs(t, rep, nil)
	})

	t.Run("sbatch gpu:2 with a gpu:1 step", func(t *testing.T) {
		batch, step := st.batchAndStep(t, "steps", st.paths(), "gpu:2", "gpu:1")
		jobGPUs := gpusOf(t, batch, "SLURM_JOB_GPUS")
		if len(jobGPUs) != 2 {
			t.Fatalf("batch step has SLURM_JOB_GPUS=%v", jobGPUs)
		}
		st.expectGPUs(t, batch, jobGPUs)
		stepGPUs := gpusOf(t, step, "SLURM_STEP_GPUS")
		if len(stepGPUs) != 1 || !slices.Contains(jobGPUs, stepGPUs[0]) {
			t.Fatalf("inner step has SLURM_STEP_GPUS=%v, job %v", stepGPUs, jobGPUs)
		}
		st.expectGPUs(t, step, stepGPUs)
	})

	t.Run("srun -n2", func(t *testing.T) {
		args := []string{"-n2", "-l", "--gres=gpu:1", st.open, "-env"}
		r := st.c.Run(st.ctx, user, "srun", append(args, st.paths()...)...)
		mustOK(t, r)
		for _, task := range []string{"0", "1"} {
			var lines []string
			for _, l := range strings.Split(r.Stdout, "\n") {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(l), task+": "); ok {
					lines = append(lines, rest)
				}
			}
			rep := cluster.ParseOpen(strings.Join(lines, "\n"))
			if len(rep.Open) == 0 {
				t.Fatalf("task %s printed nothing:\n%s", task, r)
			}
			st.expectGPUs(t, rep, gpusOf(t, rep, "SLURM_STEP_GPUS"))
		}
	})

	t.Run("two concurrent jobs", func(t *testing.T) {
		// Each job opens its devices while the other one runs: both
		// start, then wait for each other through files, then probe.
		dir := filepath.Join(st.c.Root(), "work", fmt.Sprintf("meet-%d", time.Now().UnixNano()))
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, 0o777) // the job user creates its marker here
		reps := make([]cluster.OpenReport, 2)
		results := make([]cluster.Result, 2)
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				me, other := filepath.Join(dir, fmt.Sprint(i)), filepath.Join(dir, fmt.Sprint(1-i))
				script := fmt.Sprintf("touch %s; for n in $(seq 600); do [ -e %s ] && break; sleep 0.1; done; [ -e %s ] || echo OTHER-NEVER-RAN; exec %s -env %s",
					me, other, other, st.open, strings.Join(st.paths(), " "))
				results[i] = st.c.Run(st.ctx, user, "srun", "--gres=gpu:2", "sh", "-c", script)
				reps[i] = cluster.ParseOpen(results[i].Stdout)
			}()
		}
		wg.Wait()
		var all []int
		for i := range 2 {
			mustOK(t, results[i])
			if strings.Contains(results[i].Stdout, "OTHER-NEVER-RAN") {
				t.Fatalf("job %d did not overlap with the other", i)
			}
			g := gpusOf(t, reps[i], "SLURM_STEP_GPUS")
			st.expectGPUs(t, reps[i], g)
			all = append(all, g...)
		}
		slices.Sort(all)
		if !slices.Equal(all, []int{0, 1, 2, 3}) {
			t.Errorf("the two jobs held %v together, want disjoint halves of 0-3", all)
		}
	})

	t.Run("forged variables", func(t *testing.T) { forgedEnvChecks(t, st) })

	t.Run("device node made elsewhere", func(t *testing.T) {
		alt := filepath.Join(st.c.Root(), "work", fmt.Sprintf("alt-%d", time.Now().UnixNano()))
		if err := os.MkdirAll(alt, 0o755); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(alt)
		var paths []string
		for i := range 4 {
			p := filepath.Join(alt, fmt.Sprintf("gpu%d", i))
			if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(195, uint32(i)))); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, 0o666); err != nil { // mknod applies the umask
				t.Fatal(err)
			}
			paths = append(paths, p)
		}
		r := st.c.Run(st.ctx, user, "srun", append([]string{"--gres=gpu:1", st.open, "-env"}, paths...)...)
		mustOK(t, r)
		rep := cluster.ParseOpen(r.Stdout)
		own := gpusOf(t, rep, "SLURM_STEP_GPUS")
		for i, p := range paths {
			want := "EPERM"
			if slices.Contains(own, i) {
				want = "ENXIO"
			}
			if rep.Open[p] != want {
				t.Errorf("%s (195:%d): %q, want %s", p, i, rep.Open[p], want)
			}
		}
	})

	t.Run("local numbering of a job holding GPU 2", func(t *testing.T) {
		// Hold GPUs 0 and 1 so the next job gets 2.
		holder := st.hold(t, 2)
		defer holder()
		rep, r := st.srun(t, nil, "--gres=gpu:1")
		mustOK(t, r)
		g := gpusOf(t, rep, "SLURM_STEP_GPUS")
		if !slices.Equal(g, []int{2}) {
			t.Fatalf("job got GPU %v, want [2] (0 and 1 are held)", g)
		}
		st.expectGPUs(t, rep, g)
		if rep.Env["CUDA_VISIBLE_DEVICES"] != "0" || rep.Env["GPU_DEVICE_ORDINAL"] != "0" {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q GPU_DEVICE_ORDINAL=%q, want the local 0", rep.Env["CUDA_VISIBLE_DEVICES"], rep.Env["GPU_DEVICE_ORDINAL"])
		}
	})

	t.Run("process adopted into the extern step", func(t *testing.T) {
		release := st.hold(t, 1)
		leaf, jobGPUs := st.externLeaf(t)
		rep := st.runIn(t, leaf)
		st.expectGPUs(t, rep, jobGPUs)
		release()
	})
}

// submit runs an sbatch script as the job user and waits for it to finish
// with COMPLETED; env is set in sbatch's environment.
func (st *suite) submit(t *testing.T, env, args []string, script string) string {
	t.Helper()
	f := filepath.Join(st.c.Root(), "work", fmt.Sprintf("script-%d.sh", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(st.c.Root(), "work", "slurm-%j.out")
	full := append([]string{"--parsable", "-o", out}, args...)
	r := st.c.RunEnv(st.ctx, user, env, "sbatch", append(full, f)...)
	mustOK(t, r)
	id := strings.TrimSpace(strings.Split(r.Stdout, ";")[0])
	state, err := st.c.WaitJob(st.ctx, id)
	log, _ := os.ReadFile(strings.ReplaceAll(out, "%j", id))
	if err != nil || state != "COMPLETED" {
		t.Fatalf("job %s: state %q, %v\n%s", id, state, err, log)
	}
	return id
}

// sbatch runs one command as a batch script and parses its output.
func (st *suite) sbatch(t *testing.T, env, args []string, cmd string) cluster.OpenReport {
	t.Helper()
	id := st.submit(t, env, args, cmd+"\n")
	return st.readOut(t, filepath.Join(st.c.Root(), "work", "slurm-"+id+".out"))
}

func (st *suite) readOut(t *testing.T, path string) cluster.OpenReport {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rep := cluster.ParseOpen(string(b))
	if len(rep.Open) == 0 {
		t.Fatalf("%s has no probe output:\n%s", path, b)
	}
	return rep
}

// hold starts a job holding n GPUs until the returned func is called, and
// waits until its extern step is registered.
func (st *suite) hold(t *testing.T, n int) func() {
	t.Helper()
	// The script marks when it runs: by then every callback of its step
	// has returned.
	marker := filepath.Join(st.c.Root(), "work", fmt.Sprintf("holding-%d", time.Now().UnixNano()))
	r := st.c.Run(st.ctx, user, "sbatch", "--parsable", fmt.Sprintf("--gres=gpu:%d", n), "-o", "/dev/null", "--wrap", "touch "+marker+"; sleep 300")
	mustOK(t, r)
	id := strings.TrimSpace(r.Stdout)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(marker); err == nil && st.jobCgroup(id) != "" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return func() {
		st.c.Run(st.ctx, "", "scancel", id)
		st.c.WaitJob(st.ctx, id)
	}
}

// jobCgroup finds the cgroup of a running job from its batch step's
// processes, the same way the agent does (never from the job id alone).
func (st *suite) jobCgroup(id string) string {
	name, err := st.c.JobDirName(st.ctx, id)
	if err != nil {
		return ""
	}
	entries, _ := os.ReadDir(st.c.ScopeDir())
	for _, e := range entries {
		dir := filepath.Join(st.c.ScopeDir(), e.Name())
		if e.IsDir() && e.Name() == name {
			if _, err := os.Stat(filepath.Join(dir, "step_batch")); err == nil {
				return dir
			}
		}
	}
	return ""
}

// externLeaf returns a populated leaf cgroup of the newest running job's
// extern step (where pam_slurm_adopt puts ssh sessions) and that job's GPUs.
func (st *suite) externLeaf(t *testing.T) (string, []int) {
	t.Helper()
	q := st.c.Run(st.ctx, "", "squeue", "-h", "-t", "R", "-o", "%i", "--sort=-i")
	id := strings.Fields(q.Stdout)[0]
	d := st.c.Run(st.ctx, "", "scontrol", "show", "job", "-d", id)
	var gpus []int
	if _, rest, ok := strings.Cut(d.Stdout, "(IDX:"); ok {
		list, _, _ := strings.Cut(rest, ")")
		var err error
		if gpus, err = gpulist.ParseIDX(list); err != nil {
			t.Fatalf("scontrol GRES index %q: %v", list, err)
		}
	}
	if len(gpus) == 0 {
		t.Fatalf("no GPU index for job %s in scontrol:\n%s", id, d.Stdout)
	}
	name, err := st.c.JobDirName(st.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var leaf string
	filepath.Walk(filepath.Join(st.c.ScopeDir(), name, "step_extern"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			if b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs")); len(strings.TrimSpace(string(b))) > 0 {
				leaf = p
			}
		}
		return nil
	})
	if leaf == "" {
		t.Fatalf("job %s has no populated extern step cgroup", id)
	}
	return leaf, gpus
}

// runIn starts gf-open as the job user directly inside cgroup dir, as
// pam_slurm_adopt does with an ssh session.
func (st *suite) runIn(t *testing.T, dir string) cluster.OpenReport {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	uid, gid := lookup(t)
	cmd := exec.Command(st.open, append([]string{"-env"}, st.paths()...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, Credential: &syscall.Credential{Uid: uid, Gid: gid}}
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

func lookup(t *testing.T) (uint32, uint32) {
	out, err := exec.Command("id", "-u", user).Output()
	if err != nil {
		t.Fatal(err)
	}
	outg, _ := exec.Command("id", "-g", user).Output()
	var u, g uint32
	fmt.Sscan(string(out), &u)
	fmt.Sscan(string(outg), &g)
	return u, g
}

// TestPrivilegedConstrainDevices: with Slurm's own device filter on as well,
// every property still holds and no job fails.
func TestPrivilegedConstrainDevices(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	if err := st.c.RestartSlurmd(true); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// A slurmd restarted while a job is still completing leaves the
		// node allocated for minutes.
		st.waitIdle(t)
		if err := st.c.RestartSlurmd(false); err != nil {
			t.Fatal(err)
		}
	}()
	isolationChecks(t, st)
}

// waitIdle waits until the node has no job left, and shows Slurm's view if
// it never gets there.
func (st *suite) waitIdle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		r := st.c.Run(st.ctx, "", "sinfo", "-h", "-o", "%t")
		if strings.TrimSpace(r.Stdout) == "idle" {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	q := st.c.Run(st.ctx, "", "squeue", "-t", "all", "-o", "%i %T %r %j")
	n := st.c.Run(st.ctx, "", "scontrol", "show", "node")
	t.Fatalf("node never became idle:\n%s\n%s", q.Stdout, n.Stdout)
}

// TestPrivilegedPerCgroupMode runs the checks with the fallback attach mode
// that kernels without bpf_get_current_ancestor_cgroup_id for device
// programs (6.1, Amazon Linux 2023) use: one filter per step cgroup, with and
// without Slurm's own ConstrainDevices programs above it.
func TestPrivilegedPerCgroupMode(t *testing.T) {
	st := get(t)
	restart := func(o ...agentOpts) {
		t.Helper()
		if err := st.agent.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := st.startAgent(o...); err != nil {
			t.Fatal(err)
		}
	}
	restart(agentOpts{mode: "per-cgroup"})
	defer restart()
	for _, constrain := range []bool{false, true} {
		t.Run(fmt.Sprintf("ConstrainDevices=%v", constrain), func(t *testing.T) {
			st.waitIdle(t)
			if err := st.c.RestartSlurmd(constrain); err != nil {
				t.Fatal(err)
			}
			isolationChecks(t, st)
			st.waitIdle(t)
		})
	}
	if err := st.c.RestartSlurmd(false); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(st.agent.Log)
	if !strings.Contains(string(b), "mode=per-cgroup") {
		t.Errorf("the agent did not run in per-cgroup mode:\n%s", b)
	}
}

// probeAcross runs a batch job that probes every GPU loops times, calls
// disrupt once the probe is under way, then lets the job start one more
// srun step. It returns the job id, the step's own GPUs (the step's
// isolation already checked) and how often each "PATH RESULT" line occurred.
func (st *suite) probeAcross(t *testing.T, name string, loops int, sleep string, disrupt func(id string)) (string, []int, map[string]int) {
	t.Helper()
	work := filepath.Join(st.c.Root(), "work")
	marker := filepath.Join(work, fmt.Sprintf("%s-go-%d", name, time.Now().UnixNano()))
	out := filepath.Join(work, name+".$SLURM_JOB_ID")
	script := fmt.Sprintf("%s -loop %d -sleep %s %s > %s.probe\nwhile [ ! -e %s ]; do sleep 0.1; done\nsrun --gres=gpu:1 %s -env %s > %s.step\n",
		st.open, loops, sleep, strings.Join(st.c.DevPaths(), " "), out, marker, st.open, strings.Join(st.paths(), " "), out)
	f := filepath.Join(work, fmt.Sprintf("%s-%d.sh", name, time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := st.c.Run(st.ctx, user, "sbatch", "--parsable", "--gres=gpu:1", "-o", filepath.Join(work, name+"-%j.out"), f)
	mustOK(t, r)
	id := strings.TrimSpace(r.Stdout)
	probe := strings.ReplaceAll(out, "$SLURM_JOB_ID", id) + ".probe"
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(probe); len(b) > 1000 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	disrupt(id)
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	state, err := st.c.WaitJob(st.ctx, id)
	log, _ := os.ReadFile(filepath.Join(work, name+"-"+id+".out"))
	if err != nil || state != "COMPLETED" {
		t.Fatalf("job %s (%s): %q %v\n%s", id, name, state, err, log)
	}
	b, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	step := st.readOut(t, strings.ReplaceAll(out, "$SLURM_JOB_ID", id)+".step")
	own := gpusOf(t, step, "SLURM_STEP_GPUS")
	st.expectGPUs(t, step, own)
	tally := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		tally[l]++
	}
	return id, own, tally
}

// TestPrivilegedAgentKilled: kill -9 of the agent while a job probes every
// GPU in a loop. Before, during and after, the probe never opens a GPU the
// job was not given, and always opens its own; the restarted agent adopts
// the pinned filter and the saved jobs, so a later step of the running job
// gets the job's GPU.
func TestPrivilegedAgentKilled(t *testing.T) {
	st := get(t)
	id, own, tally := st.probeAcross(t, "killed", 1500, "4ms", func(string) {
		if err := syscall.Kill(st.agent.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
		// While the job still runs, status lists it, consistent. The
		// state file is written off the reply path (coalesced), so status
		// may lag a just-made entry by one write: it must agree within 3 s.
		var code int
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if st.statusAfterRestart, code = st.status(t); code == 0 || time.Now().After(deadline) {
				break
			}
		}
		if code != 0 {
			t.Errorf("gpufence status exit %d after the restart:\n%s", code, st.statusAfterRestart)
		}
	})
	for i, p := range st.c.DevPaths() {
		want, other := "EPERM", "ENXIO"
		if slices.Contains(own, i) {
			want, other = "ENXIO", "EPERM"
		}
		if tally[p+" "+want] != 1500 || tally[p+" "+other]+tally[p+" OK"] != 0 {
			t.Errorf("GPU %d across the kill: %d %s, %d %s, %d OK; want all 1500 %s", i, tally[p+" "+want], want, tally[p+" "+other], other, tally[p+" OK"], want)
		}
	}
	t.Logf("probe: %v", tally)
	alog, _ := os.ReadFile(st.agent.Log)
	if !strings.Contains(string(alog), "adopted_pinned=true") || !strings.Contains(string(alog), "restored jobs") {
		t.Errorf("the restarted agent did not adopt the pinned filter and saved jobs:\n%s", tailLines(string(alog), 30))
	}
	var status struct {
		OK   bool `json:"ok"`
		Jobs []struct {
			ID    uint32            `json:"id"`
			Steps []json.RawMessage `json:"steps"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(st.statusAfterRestart), &status); err != nil {
		t.Fatalf("gpufence status --json: %v\n%s", err, st.statusAfterRestart)
	}
	listed := false
	for _, j := range status.Jobs {
		listed = listed || (fmt.Sprint(j.ID) == id && len(j.Steps) > 0)
	}
	if !status.OK || !listed {
		t.Errorf("gpufence status after the restart: ok=%v, job %s listed with steps=%v:\n%s", status.OK, id, listed, st.statusAfterRestart)
	}
}

// status runs `gpufence status --json` against the suite's agent.
func (st *suite) status(t *testing.T) (string, int) {
	t.Helper()
	cmd := exec.Command(st.gpufence, "status", "--json", "--socket", st.sock,
		"--pin-dir", filepath.Join(st.bpffs, "gpufence"), "--state-file", filepath.Join(st.c.Root(), "run", "agent-state.json"))
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

func (st *suite) spool() string {
	return filepath.Join(st.c.Root(), "run", "failopen", "failopen.jsonl")
}

// TestPrivilegedFailOpen: with failure=open, a step launched while the
// agent is down runs without isolation and says so; the agent, once back,
// puts a step_unfiltered record in the audit trail. A step the agent
// refuses still fails.
func TestPrivilegedFailOpen(t *testing.T) {
	st := get(t)
	line := strings.Join([]string{"required", st.plugin, "socket=" + st.sock, "timeout=2", "failure=open", "spool=" + st.spool()}, " ")
	if err := st.c.WritePlugstack([]string{line}); err != nil {
		t.Fatal(err)
	}
	defer st.c.WritePlugstack([]string{st.plugstackLine()})
	if err := st.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	rep, r := st.srun(t, nil, "--gres=gpu:1")
	if err := st.startAgent(); err != nil {
		t.Fatal(err)
	}
	mustOK(t, r)
	if !strings.Contains(r.Stderr, "WITHOUT GPU isolation") {
		t.Errorf("srun's stderr does not warn:\n%s", r.Stderr)
	}
	job := jobOf(t, rep)
	recs := st.waitRecords(t, job, func(rs []audit.Record) bool {
		for _, r := range rs {
			if r.Event == audit.EventStepUnfiltered {
				return true
			}
		}
		return false
	})
	found := false
	for _, r := range recs {
		found = found || (r.Event == audit.EventStepUnfiltered && r.StepID == "0" && r.User == user)
	}
	if !found {
		t.Errorf("no step_unfiltered record for job %d step 0: %+v", job, recs)
	}
}

// TestPrivilegedStaleEntriesCleaned: a job ends while no agent runs; the
// next agent removes the kernel entries its steps left and audits it.
func TestPrivilegedStaleEntriesCleaned(t *testing.T) {
	st := get(t)
	release := st.hold(t, 1)
	q := st.c.Run(st.ctx, "", "squeue", "-h", "-t", "R", "-o", "%i", "--sort=-i")
	id := strings.Fields(q.Stdout)[0]
	before, err := policyEntries(st.c.ScopeDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(st.agent.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	release() // the job ends, its cgroups go, its kernel entries stay
	after, _ := policyEntries(st.c.ScopeDir())
	if after != before {
		t.Fatalf("kernel entries changed with no agent running: %d -> %d", before, after)
	}
	if err := st.startAgent(); err != nil {
		t.Fatal(err)
	}
	jobID, _ := strconv.ParseUint(id, 10, 32)
	recs := st.waitRecords(t, uint32(jobID), func(rs []audit.Record) bool {
		for _, r := range rs {
			if r.Event == audit.EventStaleEntryRemoved {
				return true
			}
		}
		return false
	})
	n := 0
	for _, r := range recs {
		if r.Event == audit.EventStaleEntryRemoved {
			n++
		}
	}
	if n == 0 {
		t.Errorf("no stale_entry_removed record for job %s: %+v", id, recs)
	}
	now, _ := policyEntries(st.c.ScopeDir())
	t.Logf("kernel entries: %d with the job, %d after it ended unseen, %d after the restart; %d stale entries audited", before, after, now, n)
	if now != 2 {
		t.Errorf("%d kernel entries after the cleanup, want the 2 exempt ones", now)
	}
}

// TestPrivilegedLostStateRecovered: the agent is killed while a job runs.
// With only its state file lost, the restarted agent has every record from
// its pinned store and asks slurmctld nothing. With the store lost too, it
// finds the running job with no record and adopts it before enforcing:
// slurmctld's GPUs for it, audited as job_adopted; its next step gets them.
func TestPrivilegedLostStateRecovered(t *testing.T) {
	st := get(t)
	release := st.hold(t, 1)
	defer release()
	q := st.c.Run(st.ctx, "", "squeue", "-h", "-t", "R", "-o", "%i", "--sort=-i")
	id := strings.Fields(q.Stdout)[0]
	jobID, _ := strconv.ParseUint(id, 10, 32)
	want := st.allocated(t)[uint32(jobID)]
	if len(want) != 1 {
		t.Fatalf("slurmctld says job %s holds %v", id, want)
	}
	step := func(t *testing.T) {
		t.Helper()
		r := st.c.Run(st.ctx, user, "srun", append([]string{"--jobid=" + id, "--gres=gpu:1", "--overlap", st.open, "-env"}, st.paths()...)...)
		mustOK(t, r)
		rep := cluster.ParseOpen(r.Stdout)
		st.expectGPUs(t, rep, want)
	}
	recovered := func(r audit.Record) bool {
		return r.Event == audit.EventJobAdopted || (r.Event == audit.EventJobWithoutProlog && strings.Contains(r.Message, "recovered from slurmctld"))
	}

	t.Run("state file lost", func(t *testing.T) {
		st.killAgent(t)
		st.loseRecords(t, false)
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
		step(t)
		for _, r := range readAudit(t, st.auditFiles[len(st.auditFiles)-1]) {
			if r.JobID == uint32(jobID) && recovered(r) {
				t.Errorf("the store kept the record, yet: %s", r.Message)
			}
		}
		if b, _ := os.ReadFile(st.agent.Log); !strings.Contains(string(b), "from=\"the pinned store") {
			t.Errorf("the agent did not restore from its pinned store:\n%s", tailLines(string(b), 30))
		}
	})

	t.Run("state file and store lost", func(t *testing.T) {
		st.killAgentLoseState(t, agentOpts{})
		recs := st.waitRecords(t, uint32(jobID), func(rs []audit.Record) bool {
			return slices.ContainsFunc(rs, func(r audit.Record) bool { return r.Event == audit.EventJobAdopted })
		})
		for _, r := range recs {
			if r.Event == audit.EventJobAdopted && (r.Severity != audit.SeverityInfo || !slices.Equal(r.GPUs, want)) {
				t.Errorf("adoption record %q names GPUs %v, want %v (slurmctld's)", r.Message, r.GPUs, want)
			}
		}
		step(t)
	})
}

// TestPrivilegedSlurmdRestart: slurmd restarted while a job runs: the job's
// isolation holds throughout, and its later steps are still registered.
func TestPrivilegedSlurmdRestart(t *testing.T) {
	st := get(t)
	_, own, tally := st.probeAcross(t, "sdrestart", 800, "5ms", func(string) {
		if err := st.c.RestartSlurmdBusy(); err != nil {
			t.Fatal(err)
		}
	})
	for i, p := range st.c.DevPaths() {
		want := "EPERM"
		if slices.Contains(own, i) {
			want = "ENXIO"
		}
		if tally[p+" "+want] != 800 {
			t.Errorf("GPU %d across the slurmd restart: %v, want 800 %s", i, tally, want)
		}
	}
	st.waitIdle(t)
}

func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// TestPrivilegedAgentDown: with the agent stopped, GPU jobs fail at launch
// with a message naming gpufence, no task runs, and the node stays usable.
func TestPrivilegedAgentDown(t *testing.T) {
	st := get(t)
	if err := st.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
	}()
	rep, r := st.srun(t, nil, "--gres=gpu:1")
	if r.Code == 0 {
		t.Errorf("srun succeeded with the agent down:\n%s", r)
	}
	if !strings.Contains(r.Stderr, "gpufence") || !strings.Contains(r.Stderr, "cannot reach the gpufence agent") {
		t.Errorf("srun's stderr does not name gpufence:\n%s", r.Stderr)
	}
	if len(rep.Open) != 0 {
		t.Errorf("the task ran although the step was refused:\n%s", r.Stdout)
	}

	// A batch job fails (exit 1) with the message in its output, its script
	// never runs, and the node is not drained.
	marker := filepath.Join(st.c.Root(), "work", "batch-ran")
	out := filepath.Join(st.c.Root(), "work", "down-%j.out")
	sb := st.c.Run(st.ctx, user, "sbatch", "--parsable", "--gres=gpu:1", "-o", out, "--wrap", "touch "+marker)
	mustOK(t, sb)
	id := strings.TrimSpace(sb.Stdout)
	state, err := st.c.WaitJob(st.ctx, id)
	log, _ := os.ReadFile(strings.ReplaceAll(out, "%j", id))
	if err != nil || state != "FAILED" {
		t.Errorf("batch job with the agent down: state %q (%v), want FAILED\n%s", state, err, log)
	}
	if !strings.Contains(string(log), "gpufence") {
		t.Errorf("batch output does not name gpufence:\n%s", log)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the batch script ran although its step was not registered")
	}
	node := st.c.Run(st.ctx, "", "sinfo", "-h", "-o", "%t")
	if s := strings.TrimSpace(node.Stdout); strings.HasPrefix(s, "drain") || strings.HasPrefix(s, "down") {
		t.Errorf("node is %q after the refused batch job", s)
	}
}

// policyEntries counts the entries of the policies map of the device filter
// attached to the scope, read from the kernel.
func policyEntries(scope string) (int, error) {
	fd, err := unix.Open(scope, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		return 0, err
	}
	for _, p := range res.Programs {
		if n, found, err := countPolicies(p.ID); found || err != nil {
			return n, err
		}
	}
	return 0, fmt.Errorf("no gpufence device filter attached to %s", scope)
}

func countPolicies(id ebpf.ProgramID) (int, bool, error) {
	prog, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return 0, false, err
	}
	info, err := prog.Info()
	prog.Close()
	if err != nil {
		return 0, false, err
	}
	ids, _ := info.MapIDs()
	for _, mid := range ids {
		m, err := ebpf.NewMapFromID(mid)
		if err != nil {
			return 0, false, err
		}
		mi, _ := m.Info()
		if mi.Name != "policies" {
			m.Close()
			continue
		}
		n := 0
		var k uint64
		v := make([]byte, m.ValueSize())
		it := m.Iterate()
		for it.Next(&k, &v) {
			n++
		}
		m.Close()
		return n, true, it.Err()
	}
	return 0, false, nil
}
