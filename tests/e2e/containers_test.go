// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/tests/cluster"
	"github.com/gpufence/gpufence/tests/containers"
)

// The container tests run jobs as GPU clusters do: pyxis (a second SPANK
// plugin) starting enroot containers, and `apptainer exec` inside a step,
// both built from their upstream release sources (tests/containers), with
// a local busybox image carrying gf-open. The node's GPU device nodes are
// bind-mounted into the container as NVIDIA's hooks do (all of them, as
// nvidia-container-cli does for NVIDIA_VISIBLE_DEVICES=all, and as
// Apptainer's --nv binds every /dev/nvidia*), and no ConstrainDevices: the
// agent's filter alone decides. Expected GPUs come from slurmctld, never
// from the job.

// ctrImage is the local image, made once per suite.
type ctrImage struct {
	rootfs string // folder: Apptainer's sandbox
	sqsh   string // enroot image, what pyxis takes as --container-image
	forged string // the same with char devices 195:<minor of GPU i> at /gf/nvidiaI
}

var ctrImg *ctrImage

func (st *suite) containerImage(t *testing.T) *ctrImage {
	t.Helper()
	if ctrImg != nil {
		return ctrImg
	}
	dir := filepath.Join(st.c.Root(), "containers")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	img := &ctrImage{rootfs: filepath.Join(dir, "rootfs"), sqsh: filepath.Join(dir, "image.sqsh"), forged: filepath.Join(dir, "forged.sqsh")}
	if err := containers.EnsurePackages(st.ctx, t.Logf); err != nil {
		t.Fatal(err)
	}
	if err := containers.MakeRootfs(img.rootfs, st.open); err != nil {
		t.Fatal(err)
	}
	if err := containers.Squash(st.ctx, img.rootfs, img.sqsh); err != nil {
		t.Fatal(err)
	}
	var pseudo []string
	for i := range st.c.DevPaths() {
		maj, min := st.devNumber(t, i)
		pseudo = append(pseudo, fmt.Sprintf("gf/nvidia%d c 666 0 0 %d %d", i, maj, min))
	}
	if err := containers.Squash(st.ctx, img.rootfs, img.forged, pseudo...); err != nil {
		t.Fatal(err)
	}
	ctrImg = img
	return img
}

// devNumber is the major and minor of fake GPU i, from its node.
func (st *suite) devNumber(t *testing.T, i int) (uint32, uint32) {
	t.Helper()
	var sb syscall.Stat_t
	if err := syscall.Stat(st.c.DevPath(i), &sb); err != nil {
		t.Fatal(err)
	}
	return uint32(sb.Rdev >> 8 & 0xfff), uint32(sb.Rdev&0xff | sb.Rdev>>12&0xfff00)
}

// ctrRun is one containerized step, held until the test read its view.
type ctrRun struct {
	gpus []int // the job's GPUs, from slurmctld
	job  uint32
	res  cluster.Result
	rep  cluster.OpenReport
	// The container's first process as the host sees it, read while it
	// waited: its cgroup2 path and namespaces.
	hostCgroup, userNS, cgroupNS, mntNS string
}

// containerJob runs launch (an srun of job name whose containerized
// command starts with the prefix it is given), waits until the command in
// the container wrote its PID (a host PID: neither runtime here makes a PID
// namespace), reads that process's cgroup and namespaces from the host and
// the job's GPUs from slurmctld, then lets it go on.
func (st *suite) containerJob(t *testing.T, name string, launch func(prefix string) cluster.Result) ctrRun {
	t.Helper()
	work := filepath.Join(st.c.Root(), "work")
	pidFile, goFile := filepath.Join(work, "pid-"+name), filepath.Join(work, "go-"+name)
	prefix := fmt.Sprintf("echo $$ > %s; %s", pidFile, waitFor(goFile))
	done := make(chan cluster.Result, 1)
	go func() { done <- launch(prefix) }()
	defer os.Remove(goFile)
	defer os.Remove(pidFile)
	// A case that fails while its job waits must not leave the job holding
	// the node for the cases after it (scancel of an ended job does nothing).
	defer st.c.Run(st.ctx, "", "scancel", "-n", name)
	var run ctrRun
	deadline := time.Now().Add(120 * time.Second)
	for {
		b, err := os.ReadFile(pidFile)
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		id, ok := st.jobNamed(t, name)
		if err == nil && perr == nil && ok {
			gpus, ok := st.allocated(t)[id]
			if ok {
				run.job, run.gpus = id, gpus
				cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
				if err != nil {
					t.Fatalf("the container's process %d (from its PID file) is not visible from the host: %v", pid, err)
				}
				for _, l := range strings.Split(string(cg), "\n") {
					if v, ok := strings.CutPrefix(l, "0::"); ok {
						run.hostCgroup = v
					}
				}
				run.userNS, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/user", pid))
				run.cgroupNS, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/cgroup", pid))
				run.mntNS, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
				if err := os.WriteFile(goFile, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				run.res = <-done
				run.rep = cluster.ParseOpen(run.res.Stdout)
				return run
			}
		}
		select {
		case r := <-done:
			t.Fatalf("job %s ended before the test saw it in its container: %s\nslurmd.log:\n%s", name, r, tailFile(st.c.LogPath("slurmd.log")))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s not running in its container after 120s", name)
		}
	}
}

// ctrPaths are the device paths a container probes: /dev/nvidia0..N-1
// (the hook's binds), nvidiactl and nvidia-uvm.
func (st *suite) ctrPaths(prefix string) []string {
	var p []string
	for i := range st.c.DevPaths() {
		p = append(p, fmt.Sprintf("%s%d", prefix, i))
	}
	return p
}

// expectCtr checks the GPU paths (GPU i at paths[i]): exactly the job's
// GPUs open (ENXIO), every other one is denied (EPERM).
func expectCtr(t *testing.T, run ctrRun, paths []string) {
	t.Helper()
	for i, p := range paths {
		want := "EPERM"
		if slices.Contains(run.gpus, i) {
			want = "ENXIO"
		}
		if got := run.rep.Open[p]; got != want {
			t.Errorf("%s (GPU %d) in the container: %q, want %s (job %d holds %v)\n%s", p, i, got, want, run.job, run.gpus, run.res)
		}
	}
}

// expectNoneGained checks that no path of a GPU the job does not hold
// opened (the node a container made itself, on any path), and returns the
// errno of each, for the log.
func expectNoneGained(t *testing.T, run ctrRun, paths []string) string {
	t.Helper()
	var seen []string
	for i, p := range paths {
		got := run.rep.Open[p]
		seen = append(seen, fmt.Sprintf("%d:%s", i, got))
		if got == "" {
			t.Errorf("%s: not probed\n%s", p, run.res)
			continue
		}
		if !slices.Contains(run.gpus, i) && (got == "OK" || got == "ENXIO") {
			t.Errorf("%s (GPU %d, not the job's: it holds %v) opened in the container: %s\n%s", p, i, run.gpus, got, run.res)
		}
	}
	return strings.Join(seen, " ")
}

// checkTaskCgroup checks that the container's process is still in its Slurm
// task cgroup (the filter's per-cgroup entry keys on it) and in a user
// namespace other than the host's.
func (st *suite) checkTaskCgroup(t *testing.T, run ctrRun, runtime string) {
	t.Helper()
	jobDir, err := st.c.JobDirName(st.ctx, strconv.FormatUint(uint64(run.job), 10))
	if err != nil {
		t.Fatal(err)
	}
	scope := "/" + filepath.Base(st.c.ScopeDir()) + "/"
	i := strings.Index(run.hostCgroup, scope)
	if i < 0 || !regexp.MustCompile(`^`+regexp.QuoteMeta(jobDir)+`/step_0/user/task_(\d+|special)$`).MatchString(run.hostCgroup[i+len(scope):]) {
		t.Errorf("%s: the container's process is in cgroup %q, not its task cgroup under %s%s/step_0/user", runtime, run.hostCgroup, scope, jobDir)
	}
	host, _ := os.Readlink("/proc/self/ns/user")
	if run.userNS == "" || run.userNS == host {
		t.Errorf("%s: the container's process is in user namespace %q, the host's is %s", runtime, run.userNS, host)
	}
	hostCg, _ := os.Readlink("/proc/self/ns/cgroup")
	t.Logf("%s: task cgroup %s (host view), user ns %s (host %s), cgroup ns %s (host %s), mount ns %s; inside it sees cgroup %q",
		runtime, run.hostCgroup, run.userNS, host, run.cgroupNS, hostCg, run.mntNS, run.rep.Cgroup)
}

// mknodLines are the errors busybox mknod printed (one per node).
func mknodLines(stderr string) string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "mknod: ") || strings.HasPrefix(l, "mount: ") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "; ")
}

// skipDebroot skips a container test on a release run chrooted from a
// Debian root (tests/debroot: 24.11, 26.05): its slurmstepd runs pyxis,
// enroot and apptainer inside that root, which holds none of the builds
// (or their bash, unsquashfs, busybox) made on this host.
func (st *suite) skipDebroot(t *testing.T) {
	t.Helper()
	if st.c.Kind() == "debroot" {
		t.Skipf("Slurm %s runs chrooted from a Debian root: the container runtimes built on this host are not inside it (run on 22.05 or a source-built release)", st.c.SlurmVersion())
	}
}

// TestPrivilegedPyxisEnroot: pyxis and enroot, built from their release
// sources, in the plugstack next to gpufence (ParallelCluster's layout:
// plugstack.conf includes plugstack.conf.d/*), pyxis's file sorted before
// gpufence's and after it. A --gres=gpu:1 job's containerized task opens
// its GPU and gets EPERM on the others, though the hook bound every GPU
// into the container; a bind of a foreign GPU under another name, a device
// node the container makes itself (as container-root in its user
// namespace), a tmpfs /dev of its own and an image carrying device nodes
// gain nothing.
func TestPrivilegedPyxisEnroot(t *testing.T) {
	st := get(t)
	st.skipDebroot(t)
	t0 := time.Now()
	eb, err := containers.Ensure(st.ctx, "enroot", "", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := containers.Ensure(st.ctx, "pyxis", st.c.Include(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("builds: enroot %d s, pyxis %d s (against %s/slurm/spank.h; this run %s)", eb.Seconds, pb.Seconds, st.c.Include(), time.Since(t0).Round(time.Millisecond))
	pyxis, err := pb.Pyxis()
	if err != nil {
		t.Fatal(err)
	}
	img := st.containerImage(t)
	edir := filepath.Join(st.c.Root(), "containers", "enroot")
	os.RemoveAll(edir) // a rerun in the same cluster root
	// ParallelCluster's enroot.conf settings that matter here: a minimal
	// /dev of enroot's own (ENROOT_RESTRICT_DEV), writable root.
	en, err := containers.SetupEnroot(eb, edir, "ENROOT_RESTRICT_DEV y", "ENROOT_ROOTFS_WRITABLE y", "ENROOT_MOUNT_HOME n")
	if err != nil {
		t.Fatal(err)
	}
	hookLog := filepath.Join(st.c.Root(), "work", "enroot-hook.log")
	if err := en.DeviceHook(st.paths(), st.open, hookLog); err != nil {
		t.Fatal(err)
	}
	pyxisRun := filepath.Join(st.c.Root(), "run", "pyxis")
	// Pyxis's defaults, as ParallelCluster's pyxis.conf has them, but
	// for its runtime folder (the host's /run/pyxis is not the test's).
	// container_scope stays global: with job, pyxis's job epilog runs
	// enroot from PATH=/usr/local/bin:/usr/bin:/bin, where this
	// machine has none.
	pyxisLine := fmt.Sprintf("required %s runtime_path=%s", pyxis, pyxisRun)
	confd := filepath.Join(st.c.Root(), "etc", "plugstack.conf.d")
	st.waitIdle(t)
	if err := st.c.SetExtraPATH(en.Bin); err != nil {
		t.Fatal(err)
	}
	var pyxisFile string
	defer func() {
		st.waitIdle(t)
		os.Remove(pyxisFile)
		if !st.c.PCluster() {
			os.Remove(filepath.Join(confd, "gpufence.conf"))
		}
		if err := st.c.SetExtraPATH(); err != nil {
			t.Error(err)
		}
		if err := st.c.WritePlugstack([]string{st.plugstackLine()}); err != nil {
			t.Error(err)
		}
		if err := st.c.RestartSlurmd(false); err != nil {
			t.Error(err)
		}
	}()
	work := filepath.Join(st.c.Root(), "work")
	probe := func(paths ...string) string {
		return "exec /usr/local/bin/gf-open -env " + strings.Join(append(paths, "/dev/nvidiactl", "/dev/nvidia-uvm"), " ")
	}
	// mounts are more --container-mounts binds: pyxis takes the option
	// once (a second replaces the first), so they join the work folder's.
	srun := func(name string, args []string, script string, mounts ...string) func(string) cluster.Result {
		return func(prefix string) cluster.Result {
			m := strings.Join(append([]string{work + ":" + work}, mounts...), ",")
			full := append([]string{"-J", name, "--container-image=" + img.sqsh, "--container-mounts=" + m, "--no-container-mount-home"}, args...)
			return st.c.Run(st.ctx, user, "srun", append(full, "sh", "-c", prefix+script)...)
		}
	}
	devs := st.ctrPaths("/dev/nvidia")
	for _, order := range []struct{ name, file string }{
		// ParallelCluster's AMI names its file pyxis.conf: after gpufence.conf.
		{"pyxis-after-gpufence", "pyxis.conf"},
		{"pyxis-before-gpufence", "00-pyxis.conf"},
	} {
		t.Run(order.name, func(t *testing.T) {
			st.waitIdle(t)
			os.Remove(pyxisFile)
			pyxisFile = filepath.Join(confd, order.file)
			files := map[string]string{
				filepath.Join(st.c.Root(), "etc", "plugstack.conf"): "include " + confd + "/*\n",
				filepath.Join(confd, "gpufence.conf"):               st.plugstackLine() + "\n",
				pyxisFile:                                           pyxisLine + "\n",
			}
			for p, text := range files {
				if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.c.RestartSlurmd(false); err != nil {
				t.Fatal(err)
			}
			n := time.Now().UnixNano()
			t.Run("hook-binds-all", func(t *testing.T) {
				t1 := time.Now()
				os.Remove(hookLog)
				run := st.containerJob(t, fmt.Sprintf("ctr-hook-%d", n), srun(fmt.Sprintf("ctr-hook-%d", n), []string{"--gres=gpu:1"}, probe(devs...)))
				mustOK(t, run.res)
				if len(run.gpus) != 1 {
					t.Fatalf("Slurm gave job %d %v, want one GPU", run.job, run.gpus)
				}
				expectCtr(t, run, devs)
				st.checkTaskCgroup(t, run, "enroot/pyxis")
				plain, r := st.srun(t, nil, "--gres=gpu:1")
				mustOK(t, r)
				t.Logf("a task of the same shape without a container: cgroup %s", plain.Cgroup)
				// The hook runs as the user from pyxis's enroot start,
				// forked by slurmstepd before any task: in the step's
				// own cgroup, where the step's list holds it too.
				b, err := os.ReadFile(hookLog)
				if err != nil {
					t.Fatalf("the device hook left no log: %v", err)
				}
				hook := ctrRun{job: run.job, gpus: run.gpus, rep: cluster.ParseOpen(string(b)), res: cluster.Result{Stdout: string(b)}}
				t.Logf("device hook (as nvidia-container-cli opens them): cgroup %s, %s", hook.rep.Cgroup, expectNoneGained(t, hook, st.c.DevPaths()))
				t.Logf("hook binds all 4: job GPU %v, %s (%s)", run.gpus, expectNoneGained(t, run, devs), time.Since(t1).Round(time.Millisecond))
			})
			t.Run("cpu-only", func(t *testing.T) {
				name := fmt.Sprintf("ctr-cpu-%d", n)
				run := st.containerJob(t, name, srun(name, nil, probe(devs...)))
				mustOK(t, run.res)
				expectCtr(t, run, devs)
			})
			if order.name != "pyxis-after-gpufence" {
				return
			}
			// With every GPU's node in the container, CUDA must number only
			// the one that opens: gpufence renumbers CUDA_VISIBLE_DEVICES
			// to the step's positions, as Slurm does under ConstrainDevices
			// (without either, the container's CUDA would take Slurm's
			// global index for a position among the four it sees).
			t.Run("not-gpu-0", func(t *testing.T) {
				release := st.hold(t, 1)
				defer release()
				name := fmt.Sprintf("ctr-second-%d", n)
				run := st.containerJob(t, name, srun(name, []string{"--gres=gpu:1"}, probe(devs...)))
				mustOK(t, run.res)
				if len(run.gpus) != 1 || run.gpus[0] == 0 {
					t.Fatalf("job %d holds %v, want one GPU other than GPU 0 (held by another job)", run.job, run.gpus)
				}
				expectCtr(t, run, devs)
				if got := run.rep.Env["CUDA_VISIBLE_DEVICES"]; got != "0" {
					t.Errorf("job on GPU %d: CUDA_VISIBLE_DEVICES=%q in the container, want 0 (the one GPU it can open)", run.gpus[0], got)
				}
				t.Logf("job on GPU %v: CUDA_VISIBLE_DEVICES=%s in the container, %s", run.gpus, run.rep.Env["CUDA_VISIBLE_DEVICES"], expectNoneGained(t, run, devs))
			})
			// The job user names --container-mounts: a foreign GPU bound
			// under another name is still that GPU (the filter keys on
			// major:minor, not on the path).
			t.Run("renamed-bind", func(t *testing.T) {
				name := fmt.Sprintf("ctr-alias-%d", n)
				var binds []string
				for i, p := range st.c.DevPaths() {
					binds = append(binds, fmt.Sprintf("%s:/dev/gpu-alias%d", p, i))
				}
				aliases := st.ctrPaths("/dev/gpu-alias")
				run := st.containerJob(t, name, srun(name, []string{"--gres=gpu:1"}, probe(aliases...), binds...))
				mustOK(t, run.res)
				expectCtr(t, run, aliases)
				t.Logf("renamed binds: job GPU %v, %s", run.gpus, expectNoneGained(t, run, aliases))
			})
			// Container-root in its user namespace makes the foreign GPUs'
			// nodes, in /tmp and on a tmpfs /dev of its own.
			t.Run("mknod", func(t *testing.T) {
				name := fmt.Sprintf("ctr-mknod-%d", n)
				var mk []string
				for i := range st.c.DevPaths() {
					maj, min := st.devNumber(t, i)
					mk = append(mk, fmt.Sprintf("mknod /tmp/gf%d c %d %d", i, maj, min))
				}
				own := st.ctrPaths("/tmp/gf")
				script := "id -u; " + strings.Join(mk, "; ") + "; /usr/local/bin/gf-open " + strings.Join(devs, " ") + "; " + probe(own...)
				run := st.containerJob(t, name, srun(name, []string{"--gres=gpu:1", "--container-remap-root"}, script))
				mustOK(t, run.res)
				// The hook's own binds still give exactly the job's GPU.
				expectCtr(t, run, devs)
				t.Logf("mknod as container-root: %s; opens %s", mknodLines(run.res.Stderr), expectNoneGained(t, run, own))
			})
			t.Run("own-dev", func(t *testing.T) {
				name := fmt.Sprintf("ctr-owndev-%d", n)
				var mk []string
				for i := range st.c.DevPaths() {
					maj, min := st.devNumber(t, i)
					mk = append(mk, fmt.Sprintf("mknod /dev/nvidia%d c %d %d", i, maj, min))
				}
				script := "mount -t tmpfs gf /dev && echo tmpfs-dev mounted; " + strings.Join(mk, "; ") + "; " + probe(devs...)
				run := st.containerJob(t, name, srun(name, []string{"--gres=gpu:1", "--container-remap-root"}, script))
				mustOK(t, run.res)
				if !strings.Contains(run.res.Stdout, "tmpfs-dev mounted") {
					t.Errorf("container-root could not mount its own /dev: the case tests nothing\n%s", run.res)
				}
				t.Logf("own tmpfs /dev + mknod: %s; opens %s", mknodLines(run.res.Stderr), expectNoneGained(t, run, devs))
			})
			// An image made as root elsewhere carries the nodes.
			t.Run("image-nodes", func(t *testing.T) {
				name := fmt.Sprintf("ctr-imgdev-%d", n)
				gf := st.ctrPaths("/gf/nvidia")
				launch := func(prefix string) cluster.Result {
					return st.c.Run(st.ctx, user, "srun", "-J", name, "--container-image="+img.forged, "--container-mounts="+work+":"+work,
						"--no-container-mount-home", "--gres=gpu:1", "sh", "-c", prefix+"ls -l /gf; "+probe(gf...))
				}
				run := st.containerJob(t, name, launch)
				mustOK(t, run.res)
				t.Logf("image carrying 195:N nodes: %s", expectNoneGained(t, run, gf))
			})
			// Positive control: with the agent in audit-only mode the same
			// containerized probe opens every GPU, so the cases above
			// would see a leak.
			t.Run("audit-only-control", func(t *testing.T) {
				st.waitIdle(t)
				if err := st.agent.Stop(); err != nil {
					t.Fatal(err)
				}
				if err := st.startAgent(agentOpts{auditOnly: true}); err != nil {
					t.Fatal(err)
				}
				defer func() {
					st.waitIdle(t)
					st.agent.Stop()
					if err := st.startAgent(); err != nil {
						t.Fatal(err)
					}
				}()
				name := fmt.Sprintf("ctr-audit-%d", n)
				run := st.containerJob(t, name, srun(name, []string{"--gres=gpu:1"}, probe(devs...)))
				mustOK(t, run.res)
				for i, p := range devs {
					if got := run.rep.Open[p]; got != "ENXIO" {
						t.Errorf("audit-only: %s (GPU %d) %q, want ENXIO: the probe does not reach the devices", p, i, got)
					}
				}
				t.Logf("audit-only control: job GPU %v, %s", run.gpus, expectNoneGainedLog(run, devs))
			})
		})
	}
}

// expectNoneGainedLog is the per-GPU errnos, without checks.
func expectNoneGainedLog(run ctrRun, paths []string) string {
	var seen []string
	for i, p := range paths {
		seen = append(seen, fmt.Sprintf("%d:%s", i, run.rep.Open[p]))
	}
	return strings.Join(seen, " ")
}

// TestPrivilegedApptainer: `apptainer exec --nv --contain` (built from its
// release source, without setuid: user namespaces, as an unprivileged user
// runs it) inside an srun step of a --gres=gpu:1 job, on the image's rootfs
// as a sandbox. --nv binds every /dev/nvidia* of the host into the
// container's own minimal /dev: the test makes the node's GPUs there, as
// /dev/nvidia-gftest-<n>-<i> (195:<minor of GPU i>, names no other user of
// this machine has), for the test's length, because Apptainer mounts every
// user --bind and the image nodev, so only --nv's binds carry a device. The
// task opens its GPU and gets EPERM on the others; a --bind of a foreign
// GPU, a node made as fakeroot and a tmpfs of the container's own gain
// nothing.
func TestPrivilegedApptainer(t *testing.T) {
	st := get(t)
	st.skipDebroot(t)
	t0 := time.Now()
	ab, err := containers.Ensure(st.ctx, "apptainer", "", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	apptainer, err := ab.Apptainer()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("build: apptainer %d s (this run %s)", ab.Seconds, time.Since(t0).Round(time.Millisecond))
	img := st.containerImage(t)
	st.waitIdle(t)
	n := time.Now().UnixNano()
	var devs []string
	for i := range st.c.DevPaths() {
		maj, min := st.devNumber(t, i)
		p := fmt.Sprintf("/dev/nvidia-gftest-%d-%d", n, i)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(maj, min))); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(p)
		if err := os.Chmod(p, 0o666); err != nil {
			t.Fatal(err)
		}
		devs = append(devs, p)
	}
	work := filepath.Join(st.c.Root(), "work")
	probe := func(paths ...string) string {
		return "exec /usr/local/bin/gf-open -env " + strings.Join(paths, " ")
	}
	exec := func(name string, srunArgs, appArgs []string, script string) func(string) cluster.Result {
		return func(prefix string) cluster.Result {
			args := append([]string{"-J", name}, srunArgs...)
			args = append(args, apptainer, "--quiet", "exec", "--nv", "--contain", "--no-home", "--bind", work)
			args = append(append(args, appArgs...), img.rootfs, "sh", "-c", prefix+script)
			return st.c.Run(st.ctx, user, "srun", args...)
		}
	}
	t.Run("nv-binds-all", func(t *testing.T) {
		t1 := time.Now()
		name := fmt.Sprintf("app-nv-%d", n)
		run := st.containerJob(t, name, exec(name, []string{"--gres=gpu:1"}, nil, probe(devs...)))
		mustOK(t, run.res)
		if len(run.gpus) != 1 {
			t.Fatalf("Slurm gave job %d %v, want one GPU", run.job, run.gpus)
		}
		expectCtr(t, run, devs)
		st.checkTaskCgroup(t, run, "apptainer")
		t.Logf("--nv binds: job GPU %v, %s (%s)", run.gpus, expectNoneGained(t, run, devs), time.Since(t1).Round(time.Millisecond))
	})
	t.Run("cpu-only", func(t *testing.T) {
		name := fmt.Sprintf("app-cpu-%d", n)
		run := st.containerJob(t, name, exec(name, nil, nil, probe(devs...)))
		mustOK(t, run.res)
		expectCtr(t, run, devs)
	})
	t.Run("user-bind", func(t *testing.T) {
		name := fmt.Sprintf("app-bind-%d", n)
		var binds []string
		for i, p := range st.c.DevPaths() {
			binds = append(binds, "--bind", fmt.Sprintf("%s:/gpu-alias%d", p, i))
		}
		aliases := st.ctrPaths("/gpu-alias")
		run := st.containerJob(t, name, exec(name, []string{"--gres=gpu:1"}, binds, "/usr/local/bin/gf-open "+strings.Join(aliases, " ")+"; "+probe(devs...)))
		mustOK(t, run.res)
		expectCtr(t, run, devs)
		t.Logf("user --bind of every GPU: %s (job GPU %v)", expectNoneGained(t, run, aliases), run.gpus)
	})
	t.Run("fakeroot-mknod-own-tmpfs", func(t *testing.T) {
		name := fmt.Sprintf("app-mknod-%d", n)
		var mk, mkdev []string
		for i := range st.c.DevPaths() {
			maj, min := st.devNumber(t, i)
			mk = append(mk, fmt.Sprintf("mknod /tmp/gf%d c %d %d", i, maj, min))
			mkdev = append(mkdev, fmt.Sprintf("mknod /tmp/gfdev/nvidia%d c %d %d", i, maj, min))
		}
		own := st.ctrPaths("/tmp/gf")
		owndev := st.ctrPaths("/tmp/gfdev/nvidia")
		script := "id -u; " + strings.Join(mk, "; ") + "; mkdir -p /tmp/gfdev; mount -t tmpfs gf /tmp/gfdev && echo tmpfs mounted; " +
			strings.Join(mkdev, "; ") + "; /usr/local/bin/gf-open " + strings.Join(append(own, owndev...), " ") + "; " + probe(devs...)
		run := st.containerJob(t, name, exec(name, []string{"--gres=gpu:1"}, []string{"--fakeroot"}, script))
		mustOK(t, run.res)
		expectCtr(t, run, devs)
		t.Logf("fakeroot (uid %s) mknod: %s; /tmp nodes %s; own tmpfs nodes %s (tmpfs mounted: %v)", strings.Fields(run.res.Stdout + " ?")[0], mknodLines(run.res.Stderr),
			expectNoneGained(t, run, own), expectNoneGained(t, run, owndev), strings.Contains(run.res.Stdout, "tmpfs mounted"))
	})
}
