// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/bpf/devfilter"
	"github.com/gpufence/gpufence/tests/debroot"
	"github.com/gpufence/gpufence/tests/slurmrel"
)

// slurmClients are the commands Run takes from the cluster's own release
// rather than from this machine's PATH.
var slurmClients = map[string]bool{
	"srun": true, "sbatch": true, "salloc": true, "squeue": true, "scontrol": true, "sinfo": true,
	"scancel": true, "sacct": true, "sattach": true, "sstat": true, "sbcast": true, "sdiag": true,
}

// defaultPATH is every process's PATH, after the release's own folders.
const defaultPATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// setRelease resolves the release to run (building or fetching it when this
// machine has not got it yet) into the state. Nothing is started.
func (c *Cluster) setRelease(ctx context.Context, o Options) (*slurmrel.Install, error) {
	name := o.Slurm
	if name == "" {
		name = os.Getenv(slurmrel.EnvVar)
	}
	sel, err := slurmrel.Select(name)
	if err != nil {
		return nil, err
	}
	if o.Nodes > 1 && sel.Release.Tarball() != "" {
		// Several slurmd on one host need a multiple-slurmd build, which
		// is not ParallelCluster's: its own build, never the plain one.
		sel.Release.MultiSlurmd = true
	}
	in, err := slurmrel.Ensure(ctx, sel.Release, c.logf)
	if err != nil {
		return nil, err
	}
	c.st.Slurm = sel.Name
	c.st.Release = sel.Release.Version
	c.st.Kind = string(in.Kind)
	c.st.Full = in.Full
	c.st.Prefix = in.Prefix
	c.st.Include = in.Include
	c.st.BuildSeconds = in.BuildSeconds
	c.st.Slice = sel.Slice
	c.st.JobIDPaths = sel.JobIDPaths
	c.st.SLUID = sel.SLUIDJobDirs()
	c.st.PCluster = sel.PCluster || o.PCluster
	c.st.MultiSlurmd = sel.Release.MultiSlurmd || in.Kind != slurmrel.KindSource
	c.st.Binds = o.Binds
	return in, nil
}

// prepareRoot unpacks a Debian release's root into <Root>/sysroot and builds
// gfroot, which runs its daemons and clients chrooted there.
func (c *Cluster) prepareRoot(ctx context.Context, in *slurmrel.Install) error {
	if in.Kind != slurmrel.KindRoot {
		return nil
	}
	t0 := time.Now()
	c.st.SysRoot = c.path("sysroot")
	if err := os.Mkdir(c.st.SysRoot, 0o755); err != nil {
		return err
	}
	if err := debroot.Unpack(ctx, in.Tarball, c.st.SysRoot); err != nil {
		return err
	}
	c.st.Include = filepath.Join(c.st.SysRoot, "usr", "include")
	gf, err := c.BuildTool(ctx, "gfroot")
	if err != nil {
		return err
	}
	c.st.Gfroot = gf
	out, err := exec.CommandContext(ctx, gf, c.rootArgs("/usr/sbin/slurmd", "-V")...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("slurmd -V in %s: %v %s", c.st.SysRoot, err, out)
	}
	m := regexp.MustCompile(`^slurm[-a-z]* (\d+\.\d+\.\d+)`).FindSubmatch(out)
	if m == nil || slurmrel.Number(string(m[1])) != slurmrel.Number(c.st.Release) {
		return fmt.Errorf("the %s root has %q, not Slurm %s", in.Suite(), strings.TrimSpace(string(out)), c.st.Release)
	}
	c.st.Full = string(m[1])
	c.logf("Slurm %s from Debian %s, unpacked in %s in %s", c.st.Full, in.Suite(), c.st.SysRoot, time.Since(t0).Round(time.Millisecond))
	return c.writeRootWrappers()
}

// rootFlags are gfroot's flags for the cluster's root: the root, the
// folders bound into it and, with the fake driver, its own /dev and
// /proc/driver/nvidia.
func (c *Cluster) rootFlags() []string {
	args := []string{"-root", c.st.SysRoot, "-bind", c.st.Root}
	for _, b := range c.st.Binds {
		args = append(args, "-bind", b)
	}
	if c.st.FakeDriver {
		for _, d := range fakeDevices(c.st.GPUs) {
			args = append(args, "-devnode", fmt.Sprintf("%s:%d:%d", d.Name, d.Major, d.Minor))
		}
		args = append(args, "-overlay", c.path("fakedriver/proc-driver")+":/proc/driver",
			"-overlay", c.path("fakedriver/pci-drivers")+":/sys/bus/pci/drivers")
	} else if c.st.IMEXMajor != 0 {
		// A /dev of the root's own (SetIMEX), with channel 0 in it as a
		// ParallelCluster prolog makes it for every job.
		args = append(args, "-devnode", fmt.Sprintf("imex-channel0:%d:0", c.st.IMEXMajor))
	}
	return args
}

// rootArgs are gfroot's arguments to run argv in the root (as root).
func (c *Cluster) rootArgs(argv ...string) []string {
	return append(append(c.rootFlags(), "--"), argv...)
}

// FakeUUID is the UUID the fake driver gives GPU i.
func FakeUUID(i int) string { return fmt.Sprintf("GPU-0000%04x-6f2e-4a1b-9c3d-5e8f7a6b4c%02x", i, i) }

// fakeBusID is the PCI bus id the fake driver gives GPU i.
func fakeBusID(i int) string { return fmt.Sprintf("0000:%02x:00.0", 0x18+i) }

// FakeModel is the fake driver's GPU model; Slurm's AutoDetect types the
// GPUs by it, lowercased with underscores: tesla_t4.
const (
	FakeModel = "Tesla T4"
	fakeType  = "tesla_t4"
)

// SetFakeDriver gives the Slurm daemons of a Debian root what an NVIDIA
// driver shows them, so that gres.conf's AutoDetect=nvidia (which reads
// /proc/driver/nvidia/gpus/*/information) finds the GPUs with their UUIDs:
// the root gets a /dev of its own with the fake GPUs at /dev/nvidiaN, and a
// /proc/driver/nvidia and /sys/bus/pci/drivers/nvidia of the harness's
// making; gres.conf names those devices with Flags=env_uuid, so that Slurm
// 26.05 puts the GPUs' UUIDs into CUDA_VISIBLE_DEVICES. All of it lives in
// gfroot's mount namespaces. Off restores the usual files. Restarts
// slurmctld and slurmd; no job may run; agents keep the table they read.
func (c *Cluster) SetFakeDriver(on bool) error {
	if c.st.SysRoot == "" {
		return fmt.Errorf("the fake driver needs a Debian root (its own /dev); this cluster runs %s (%s)", c.st.Full, c.st.Kind)
	}
	if on && c.st.AutoDetect {
		return fmt.Errorf("the fake driver and the AutoDetect layout exclude each other: SetAutoDetect(false) first")
	}
	if on {
		for i := 0; i < c.st.GPUs; i++ {
			info := fmt.Sprintf("Model: \t\t %s\nIRQ:   \t\t 100\nGPU UUID: \t %s\nVideo BIOS: \t 90.04.38.00.03\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No\n",
				FakeModel, FakeUUID(i), fakeBusID(i), i)
			dir := c.path("fakedriver/proc-driver/nvidia/gpus/" + fakeBusID(i))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, "information"), []byte(info), 0o444); err != nil {
				return err
			}
			pci := c.path("fakedriver/pci-drivers/nvidia/" + fakeBusID(i))
			if err := os.MkdirAll(pci, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(pci, "local_cpulist"), []byte(fmt.Sprintf("0-%d\n", c.st.CPUs-1)), 0o444); err != nil {
				return err
			}
		}
	}
	for _, p := range []*Process{c.st.Slurmd, c.st.Slurmctld} {
		if err := p.Stop(); err != nil {
			return fmt.Errorf("stop %s: %w", p.Name, err)
		}
	}
	c.st.FakeDriver = on
	p := c.params()
	for rel, text := range map[string]string{"etc/gres.conf": renderGresConf(p), "etc/slurm.conf": renderSlurmConf(p)} {
		if err := os.WriteFile(c.path(rel), []byte(text), 0o644); err != nil {
			return err
		}
	}
	if err := c.writeRootWrappers(); err != nil {
		return err
	}
	if err := c.startSlurmctld(); err != nil {
		return err
	}
	if err := c.startSlurmd(context.Background()); err != nil {
		return fmt.Errorf("restart slurmd with the fake driver %v: %w", on, err)
	}
	return c.saveState()
}

// FakeDevPath is GPU i's device node inside the root with the fake driver.
func (c *Cluster) FakeDevPath(i int) string { return fmt.Sprintf("/dev/nvidia%d", i) }

// writeRootWrappers puts a script per Slurm client in <Root>/slurm-bin that
// runs the root's own command, for root callers on this host (the agent's
// scontrol, a person debugging the cluster).
func (c *Cluster) writeRootWrappers() error {
	dir := c.path("slurm-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	names := []string{"slurmd"} // for `slurmd -V` (gpufence doctor)
	for name := range slurmClients {
		names = append(names, name)
	}
	for _, name := range names {
		args := c.rootArgs(c.binPathIn(name))
		q := make([]string, len(args))
		for i, a := range args {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		script := fmt.Sprintf("#!/bin/sh\n# Slurm %s's %s, from the cluster's Debian root.\nexec '%s' %s \"$@\"\n", c.st.Full, name, c.st.Gfroot, strings.Join(q, " "))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// binPathIn is where a Debian root keeps a command.
func (c *Cluster) binPathIn(name string) string {
	switch name {
	case "slurmd", "slurmctld", "slurmstepd":
		return "/usr/sbin/" + name
	}
	return "/usr/bin/" + name
}

// daemonArgv is the command line of a Slurm daemon of the cluster's release.
func (c *Cluster) daemonArgv(name string, args ...string) []string {
	if c.st.SysRoot != "" {
		argv := []string{c.st.Gfroot}
		if name == "slurmd" && c.st.Namespace {
			// namespace/linux binds each job's new mount namespace from
			// slurmstepd, which Linux 6.18 may refuse when the two
			// namespaces were made on different CPUs (gfroot -one-cpu).
			argv = append(argv, "-one-cpu")
		}
		return append(argv, c.rootArgs(append([]string{"/usr/sbin/" + name}, args...)...)...)
	}
	return append([]string{c.binPath(name)}, args...)
}

// binPath is where the release keeps a command, on this host.
func (c *Cluster) binPath(name string) string {
	prefix := c.st.Prefix
	if prefix == "" {
		prefix = "/usr"
	}
	switch name {
	case "slurmd", "slurmctld", "slurmstepd":
		return filepath.Join(prefix, "sbin", name)
	}
	return filepath.Join(prefix, "bin", name)
}

// SlurmdPath is the cluster's own slurmd as a tool on this host runs it
// (the agent's `slurmd -G`): the release's build, or the Debian root's
// through its wrapper; "" on this host's Slurm, where the agent's default
// (/usr/sbin/slurmd) is right.
func (c *Cluster) SlurmdPath() string {
	switch {
	case c.st.SysRoot != "":
		return c.path("slurm-bin/slurmd")
	case c.st.Kind == string(slurmrel.KindSource):
		return c.binPath("slurmd")
	}
	return ""
}

// pathEnv is the PATH of the cluster's processes: the release's own bin
// folders first (a batch script's srun is the release's), then the usual.
func (c *Cluster) pathEnv() string {
	extra := ""
	for _, d := range c.st.ExtraPATH {
		extra += d + ":"
	}
	if c.st.Kind == string(slurmrel.KindSource) {
		return "PATH=" + filepath.Join(c.st.Prefix, "bin") + ":" + filepath.Join(c.st.Prefix, "sbin") + ":" + extra + defaultPATH
	}
	return "PATH=" + extra + defaultPATH
}

// ToolPATH is the PATH value under which a tool on this host (the agent's
// scontrol, `gpufence doctor`'s slurmd -V) finds the cluster's release.
func (c *Cluster) ToolPATH() string {
	switch {
	case c.st.SysRoot != "":
		return c.path("slurm-bin") + ":" + defaultPATH
	case c.st.Kind == string(slurmrel.KindSource):
		return filepath.Join(c.st.Prefix, "bin") + ":" + filepath.Join(c.st.Prefix, "sbin") + ":" + defaultPATH
	}
	return defaultPATH
}

// clientCmd makes the exec.Cmd of a client command run as usr ("" = root).
func (c *Cluster) clientCmd(ctx context.Context, usr, name string, args []string) (*exec.Cmd, error) {
	var cred *syscall.Credential
	if usr != "" {
		u, err := user.Lookup(usr)
		if err != nil {
			return nil, err
		}
		if cred, err = credential(u); err != nil {
			return nil, err
		}
	}
	switch {
	case !slurmClients[name] || c.st.Kind == "" || c.st.Kind == string(slurmrel.KindHost):
		cmd := exec.CommandContext(ctx, name, args...)
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		return cmd, nil
	case c.st.SysRoot != "":
		// gfroot needs root; it drops to the user inside.
		ga := c.rootFlags()
		if cred != nil {
			groups := make([]string, len(cred.Groups))
			for i, g := range cred.Groups {
				groups[i] = strconv.FormatUint(uint64(g), 10)
			}
			ga = append(ga, "-user", fmt.Sprintf("%d:%d:%s", cred.Uid, cred.Gid, strings.Join(groups, ",")))
		}
		ga = append(ga, "-chdir", c.path("work"), "--", "/usr/bin/"+name)
		return exec.CommandContext(ctx, c.st.Gfroot, append(ga, args...)...), nil
	default:
		cmd := exec.CommandContext(ctx, c.binPath(name), args...)
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		return cmd, nil
	}
}

// discoverScope finds the scope slurmd put itself in (<scope>/slurmd), one
// of the candidates prepareCgroups checked.
func (c *Cluster) discoverScope() error {
	p, err := jobcgroup.PathOf(c.st.Slurmd.PID)
	if err != nil {
		return err
	}
	dir := filepath.Join(c.st.CgroupMount, p)
	if filepath.Base(dir) != "slurmd" {
		return fmt.Errorf("slurmd (pid %d) is in cgroup %s, not in <scope>/slurmd", c.st.Slurmd.PID, dir)
	}
	scope := filepath.Dir(dir)
	for _, cand := range c.st.ScopeCandidates {
		if cand == scope {
			c.st.Scope = scope
			return nil
		}
	}
	return fmt.Errorf("slurmd made scope %s, none of the expected %v", scope, c.st.ScopeCandidates)
}

// Release is the cluster's Slurm major.minor (25.11).
func (c *Cluster) Release() string { return c.st.Release }

// SlurmVersion is the full version of the cluster's Slurm (25.11.7).
func (c *Cluster) SlurmVersion() string { return c.st.Full }

// Selection is the release and variant the cluster runs ("25.11+slice").
func (c *Cluster) Selection() string { return c.st.Slurm }

// Kind says where the daemons come from: host, source or debroot.
func (c *Cluster) Kind() string { return c.st.Kind }

// MultiSlurmd reports whether this Slurm is built with multiple-slurmd
// support: its scope is then <node>_slurmstepd.scope, else
// slurmstepd.scope (SchedMD's default build, ParallelCluster's).
func (c *Cluster) MultiSlurmd() bool { return c.st.MultiSlurmd }

// AtLeast reports whether the cluster runs Slurm v (major.minor) or newer.
func (c *Cluster) AtLeast(v string) bool {
	return slurmrel.Number(c.st.Release) >= slurmrel.Number(v)
}

// BuildSeconds is how long the release's cached source build took (0 for
// packaged releases).
func (c *Cluster) BuildSeconds() int { return c.st.BuildSeconds }

// Include is the folder with the release's slurm/spank.h on this host.
func (c *Cluster) Include() string { return c.st.Include }

// SlurmPrefix is where the release's bin/, sbin/ and lib/ are on this host
// (ParallelCluster's /opt/slurm layout for source builds); "" for a
// Debian root.
func (c *Cluster) SlurmPrefix() string {
	if c.st.SysRoot != "" {
		return ""
	}
	return c.st.Prefix
}

// Slice is the cgroup slice the scope is in (system.slice by default).
func (c *Cluster) Slice() string { return c.slice() }

func (c *Cluster) slice() string {
	if c.st.Slice != "" {
		return c.st.Slice
	}
	return "system.slice"
}

// SLUID reports whether job cgroups are named by SLUID, not job_<id>.
func (c *Cluster) SLUID() bool { return c.st.SLUID }

// PCluster reports whether the cluster has ParallelCluster's files.
func (c *Cluster) PCluster() bool { return c.st.PCluster }

// JobDirName is the name Slurm gives job id's cgroup under the scope:
// job_<id>, or the job's SLUID (26.05 unless CgroupJobIdPaths=yes), which
// slurmctld tells.
func (c *Cluster) JobDirName(ctx context.Context, id string) (string, error) {
	if !c.st.SLUID {
		return "job_" + id, nil
	}
	// scontrol shows the SLUID with -d only.
	r := c.Run(ctx, "", "scontrol", "-d", "-o", "show", "job", id)
	for _, f := range strings.Fields(r.Stdout) {
		if v, ok := strings.CutPrefix(f, "SLUID="); ok && v != "" {
			return v, nil
		}
	}
	return "", fmt.Errorf("no SLUID for job %s in scontrol: %s", id, r)
}

// BuildPlugin compiles the SPANK entry against the release's own headers
// (make plugin: its plugin_version is checked) into
// <Root>/lib/gpufence/slurm-X.Y/ and returns its path.
func (c *Cluster) BuildPlugin(ctx context.Context) (string, error) {
	mod, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := c.path("lib/gpufence")
	cmd := exec.CommandContext(ctx, "make", "-C", mod, "--no-print-directory", "plugin", "SLURM_INCLUDE="+c.st.Include, "PLUGIN_DIR="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make plugin for Slurm %s: %v\n%s", c.st.Full, err, b)
	}
	dir := filepath.Join(out, "slurm-"+c.st.Release)
	so := filepath.Join(dir, "spank_gpufence.so")
	if _, err := os.Stat(so); err != nil {
		return "", fmt.Errorf("make plugin for Slurm %s made no %s: %w", c.st.Full, so, err)
	}
	return so, nil
}

// mountsAt lists the mount points at or below dir in this process's
// mount namespace; gfroot's mounts live in namespaces of their own, so this
// is empty unless something went wrong, and then nothing under dir may be
// removed.
func mountsAt(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{"(cannot read /proc/self/mountinfo: " + err.Error() + ")"}
	}
	mounts, err := devfilter.ParseMountinfo(bytes.NewReader(b))
	if err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	var out []string
	for _, m := range mounts {
		if m.MountPoint == filepath.Clean(dir) || strings.HasPrefix(m.MountPoint, filepath.Clean(dir)+"/") {
			out = append(out, m.MountPoint)
		}
	}
	return out
}
