// SPDX-License-Identifier: Apache-2.0

// Package cluster runs a real Slurm on this machine for end-to-end tests,
// one node or several (Options.Nodes, multinode.go): munged, slurmctld and
// slurmd started by PID, fake GPU device nodes under the cluster's own
// folder, and cleanup of exactly the processes, cgroups and files the
// harness created. The Slurm release is
// Debian 12's 22.05 packages unless Options.Slurm (or $GPUFENCE_SLURM) names
// another one of packaging/slurm-releases: a source build in
// ParallelCluster's prefix layout, or a Debian suite's packages run chrooted
// from a debootstrap root (tests/slurmrel).
package cluster

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

//go:embed shim/cg2only.c
var shimSource []byte

// lockPath serialises clusters across test binaries: they share the node
// name and so the cgroup scope.
const lockPath = "/run/lock/gpufence-test-cluster.lock"

// Options configures Start. Zero values pick the defaults documented per field.
type Options struct {
	Root             string   // work folder; default: a new folder under /var/tmp
	GPUs             int      // fake GPUs; default 4
	ConstrainDevices bool     // cgroup.conf ConstrainDevices (Slurm's own device filter)
	MIG              bool     // gres.conf in the MIG layout (see MIGSlices; needs GPUs 4)
	Plugstack        []string // lines of plugstack.conf
	ExtraSlurmConf   []string // lines appended to slurm.conf
	Keep             bool     // keep Root at Stop (logs for a post-mortem)
	// Slurm is the release to run, a tests/slurmrel selection such as
	// "25.11" or "26.05+jobidpaths"; "" is $GPUFENCE_SLURM, else 22.05.
	Slurm string
	// PCluster writes AWS ParallelCluster's files (as the "+pcluster"
	// variant does): plugstack.conf including plugstack.conf.d/*, typed
	// gres.conf lines with NodeName=, no ConstrainDevices line.
	PCluster bool
	// Binds are folders of this host that a release run from a Debian root
	// must see too (an installed package's root); Root always is.
	Binds []string
	// Nodes is the number of slurmd, each a node of its own with GPUs GPUs
	// and its own scope and device minors (multinode.go); 0 or 1: one node
	// named after the host.
	Nodes int
	Logf  func(string, ...any)
}

// Result is the outcome of a client command.
type Result struct {
	Cmd    string
	Stdout string
	Stderr string
	Code   int // exit status; -1 when the command did not run
}

func (r Result) String() string {
	return fmt.Sprintf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", r.Cmd, r.Code, r.Stdout, r.Stderr)
}

// state is what a later process (gfcluster down) needs to stop the cluster;
// it is kept in <Root>/state.json.
type state struct {
	Root               string     `json:"root"`
	CreatedRoot        bool       `json:"created_root"`
	Keep               bool       `json:"keep"`
	Host               string     `json:"host"`
	GPUs               int        `json:"gpus"`
	CPUs               int        `json:"cpus"`
	ConstrainDevices   bool       `json:"constrain_devices"`
	MIG                bool       `json:"mig"`
	CapsMajor          uint32     `json:"caps_major"`
	Plugstack          []string   `json:"plugstack"`
	ExtraSlurmConf     []string   `json:"extra_slurm_conf"`
	CtldPort           int        `json:"ctld_port"`
	SlurmdPort         int        `json:"slurmd_port"`
	CgroupMount        string     `json:"cgroup_mount"`
	Hybrid             bool       `json:"hybrid"`
	CreatedSystemSlice bool       `json:"created_system_slice"`
	Munged             *Process   `json:"munged"`
	Slurmctld          *Process   `json:"slurmctld"`
	Slurmd             *Process   `json:"slurmd"`
	Agents             []*Process `json:"agents"`
	Setup              *Setup     `json:"setup,omitempty"`

	// The release (release.go).
	Slurm        string   `json:"slurm"`   // the selection, e.g. 25.11+slice
	Release      string   `json:"release"` // major.minor
	Kind         string   `json:"kind"`    // host, source or debroot
	Full         string   `json:"full_version"`
	Prefix       string   `json:"prefix"`
	Include      string   `json:"include"`
	BuildSeconds int      `json:"build_seconds,omitempty"`
	SysRoot      string   `json:"sysroot,omitempty"` // debroot: the unpacked root
	Gfroot       string   `json:"gfroot,omitempty"`
	Binds        []string `json:"binds,omitempty"`
	Slice        string   `json:"slice,omitempty"` // CgroupSlice, "" = system.slice
	JobIDPaths   bool     `json:"job_id_paths,omitempty"`
	SLUID        bool     `json:"sluid,omitempty"`
	PCluster     bool     `json:"pcluster,omitempty"`
	// MultiSlurmd: this Slurm is built with multiple-slurmd support
	// (Debian's packages; a source build's multislurmd variant).
	MultiSlurmd bool     `json:"multi_slurmd,omitempty"`
	Namespace   bool     `json:"namespace,omitempty"`   // namespace/linux on (SetNamespace)
	FakeDriver  bool     `json:"fake_driver,omitempty"` // SetFakeDriver
	AutoDetect  bool     `json:"autodetect,omitempty"`  // SetAutoDetect
	IMEXMajor   uint32   `json:"imex_major,omitempty"`  // SetIMEX
	Shared      string   `json:"shared,omitempty"`      // SetShared
	ExtraPATH   []string `json:"extra_path,omitempty"`  // SetExtraPATH
	// Scope is the scope slurmd made (known once it started); the
	// candidates are the names it may choose (with and without the node
	// name, as Slurm is built with or without multiple-slurmd support).
	Scope           string              `json:"scope,omitempty"`
	ScopeCandidates []string            `json:"scope_candidates"`
	ScopesBefore    map[string][]string `json:"scopes_before"` // cgroups under each candidate before Start
	ScopeExisted    map[string]bool     `json:"scope_existed"`
	// Nodes are the slurmd of a multi-node cluster (Slurmd is nil then).
	Nodes []*NodeState `json:"nodes,omitempty"`
}

// Cluster is a running Slurm: one node, or several slurmd on this host.
type Cluster struct {
	st   state
	logf func(string, ...any)
	lock *os.File
}

// Start writes the configuration, creates the fake devices and starts
// munged, slurmctld and slurmd, then waits until the node is idle.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("cluster.Start needs root")
	}
	for _, p := range packages {
		if _, err := os.Stat(p.bin); err != nil {
			return nil, fmt.Errorf("%s missing (package %s): call cluster.Ensure first", p.bin, p.pkg)
		}
	}
	if _, err := user.Lookup(TestUser); err != nil {
		return nil, fmt.Errorf("user %s missing: call cluster.Ensure first", TestUser)
	}
	c = &Cluster{logf: o.Logf}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	// Before the lock: a source build takes minutes the first time.
	in, err := c.setRelease(ctx, o)
	if err != nil {
		return nil, err
	}
	if o.GPUs <= 0 {
		o.GPUs = 4
	}
	if o.GPUs > 64 {
		return nil, fmt.Errorf("GPUs=%d: at most 64", o.GPUs)
	}
	if o.MIG && o.GPUs != migGPUs {
		return nil, fmt.Errorf("MIG layout needs GPUs=%d (one whole GPU and %d slices), not %d", migGPUs, len(MIGSlices), o.GPUs)
	}
	if err := checkNodes(o, c.st.Kind); err != nil {
		return nil, err
	}
	if c.lock, err = takeLock(ctx); err != nil {
		return nil, err
	}
	if err := reapStale(c.logf, ""); err != nil {
		c.lock.Close()
		return nil, fmt.Errorf("test clusters left on this host: %w", err)
	}
	defer func() {
		if err != nil {
			if serr := c.Stop(); serr != nil {
				err = errors.Join(err, fmt.Errorf("cleanup after failed start: %w", serr))
			}
		}
	}()
	host, err := os.Hostname()
	if err != nil {
		return c, err
	}
	host, _, _ = strings.Cut(host, ".")
	rel := c.st
	c.st = state{
		Host: host, GPUs: o.GPUs, CPUs: runtime.NumCPU(), ConstrainDevices: o.ConstrainDevices, MIG: o.MIG,
		Plugstack: o.Plugstack, ExtraSlurmConf: o.ExtraSlurmConf, Keep: o.Keep,
		Slurm: rel.Slurm, Release: rel.Release, Kind: rel.Kind, Full: rel.Full, Prefix: rel.Prefix,
		Include: rel.Include, BuildSeconds: rel.BuildSeconds, Binds: rel.Binds, Slice: rel.Slice,
		JobIDPaths: rel.JobIDPaths, SLUID: rel.SLUID, PCluster: rel.PCluster, MultiSlurmd: rel.MultiSlurmd,
	}
	if err := c.makeRoot(o.Root); err != nil {
		return c, err
	}
	if err := c.initNodes(o.Nodes); err != nil {
		return c, err
	}
	if err := c.makeTree(); err != nil {
		return c, err
	}
	if err := c.prepareRoot(ctx, in); err != nil {
		return c, err
	}
	if err := c.prepareCgroups(); err != nil {
		return c, err
	}
	if c.st.CtldPort, c.st.SlurmdPort, err = pickPorts(); err != nil {
		return c, err
	}
	if err := c.nodePorts(); err != nil {
		return c, err
	}
	if err := c.writeConfigs(); err != nil {
		return c, err
	}
	if c.st.Hybrid {
		if err := c.buildShim(ctx); err != nil {
			return c, err
		}
	}
	if err := c.saveState(); err != nil {
		return c, err
	}
	if err := c.startMunged(); err != nil {
		return c, err
	}
	if err := c.startSlurmctld(); err != nil {
		return c, err
	}
	if err := c.startSlurmd(ctx); err != nil {
		return c, err
	}
	return c, c.saveState()
}

// Load returns the cluster whose state.json is in root (started by another
// process, such as `gfcluster up`).
func Load(root string, logf func(string, ...any)) (*Cluster, error) {
	b, err := os.ReadFile(filepath.Join(root, "state.json"))
	if err != nil {
		return nil, fmt.Errorf("load cluster: %w", err)
	}
	c := &Cluster{logf: logf}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	if err := json.Unmarshal(b, &c.st); err != nil {
		return nil, fmt.Errorf("load cluster %s/state.json: %w", root, err)
	}
	return c, nil
}

func takeLock(ctx context.Context) (*os.File, error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", lockPath, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", lockPath, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for another test cluster (lock %s): %w", lockPath, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) makeRoot(root string) error {
	if root == "" {
		d, err := os.MkdirTemp("/var/tmp", "gpufence-cluster-")
		if err != nil {
			return err
		}
		c.st.Root, c.st.CreatedRoot = d, true
	} else {
		abs, err := filepath.Abs(root)
		if err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(abs, "state.json")); err == nil {
			return fmt.Errorf("%s already holds a cluster (state.json): stop it first", abs)
		}
		if _, err := os.Stat(abs); os.IsNotExist(err) {
			c.st.CreatedRoot = true
		}
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return err
		}
		c.st.Root = abs
	}
	// slurm, munge and the job user must reach configs and tools under Root.
	return os.Chmod(c.st.Root, 0o755)
}

// rootEntries are what the harness creates in Root; Stop removes only these
// when Root itself was not created by the harness.
var rootEntries = []string{"etc", "logs", "run", "state", "dev", "bin", "lib", "work", "sysroot", "slurm-bin", "ns", "fakedriver", "state.json"}

func (c *Cluster) makeTree() error {
	slurmU, err := lookupIDs("slurm")
	if err != nil {
		return err
	}
	mungeU, err := lookupIDs("munge")
	if err != nil {
		return err
	}
	dirs := []struct {
		rel  string
		mode os.FileMode
		ids  *ids
	}{
		{"etc", 0o755, nil}, {"etc/plugstack.conf.d", 0o755, nil}, {"etc/pcluster", 0o755, nil}, {"logs", 0o755, nil}, {"run", 0o755, nil},
		{"run/munge", 0o755, &mungeU}, {"state", 0o755, nil}, {"state/ctld", 0o700, &slurmU},
		{"state/d", 0o755, nil}, {"dev", 0o755, nil}, {"bin", 0o755, nil}, {"lib", 0o755, nil},
		// Job output and srun's working directory: every user may write.
		{"work", 0o1777, nil},
	}
	for _, d := range dirs {
		p := c.path(d.rel)
		if err := os.MkdirAll(p, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
		if d.ids != nil {
			if err := os.Chown(p, d.ids.uid, d.ids.gid); err != nil {
				return err
			}
		}
	}
	// slurmctld writes its log as SlurmUser.
	if err := touchOwned(c.path("logs/slurmctld.log"), slurmU); err != nil {
		return err
	}
	devs, err := os.ReadFile("/proc/devices")
	if err != nil {
		return err
	}
	if c.st.CapsMajor, err = pickCapsMajor(string(devs)); err != nil {
		return err
	}
	if err := os.MkdirAll(c.path("dev/nvidia-caps"), 0o755); err != nil {
		return err
	}
	for _, d := range append(fakeDevices(c.st.GPUs*max(1, len(c.st.Nodes))), fakeCapsDevices(c.st.CapsMajor)...) {
		p := c.path("dev/" + d.Name)
		dev := int((d.Major << 8) | (d.Minor & 0xff) | ((d.Minor &^ 0xff) << 12))
		if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, dev); err != nil {
			return fmt.Errorf("mknod %s c %d %d: %w", p, d.Major, d.Minor, err)
		}
		if err := os.Chmod(p, 0o666); err != nil { // umask
			return err
		}
	}
	return nil
}

type ids struct{ uid, gid int }

func lookupIDs(name string) (ids, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return ids{}, fmt.Errorf("user %s: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return ids{uid, gid}, nil
}

func touchOwned(p string, o ids) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	f.Close()
	return os.Chown(p, o.uid, o.gid)
}

// pickPorts returns Slurm's default ports when they are free, else free
// ports the kernel picks.
func pickPorts() (int, int, error) {
	var ports []int
	for _, want := range []int{6817, 6818} {
		p, err := freePort(want, ports)
		if err != nil {
			return 0, 0, err
		}
		ports = append(ports, p)
	}
	return ports[0], ports[1], nil
}

func freePort(want int, taken []int) (int, error) {
	if l, err := net.Listen("tcp", fmt.Sprintf(":%d", want)); err == nil {
		l.Close()
		return want, nil
	}
	for range 20 {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			return 0, fmt.Errorf("find a free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !containsInt(taken, p) {
			return p, nil
		}
	}
	return 0, errors.New("find a free port: none")
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func (c *Cluster) params() confParams {
	return confParams{
		Root: c.st.Root, Host: c.st.Host, CPUs: c.st.CPUs, GPUs: c.st.GPUs,
		CtldPort: c.st.CtldPort, SlurmdPort: c.st.SlurmdPort, MungeSocket: c.mungeSocket(),
		CgroupMount: c.st.CgroupMount, Constrain: c.st.ConstrainDevices, MIG: c.st.MIG,
		ExtraSlurm: c.st.ExtraSlurmConf, Plugstack: c.st.Plugstack,
		ClusterName: "gpufence", SlurmUser: "slurm", KillWaitSecs: 5,
		Release: c.st.Release, Slice: c.st.Slice, JobIDPaths: c.st.JobIDPaths, PCluster: c.st.PCluster,
		Namespace: c.st.Namespace, FakeDriver: c.st.FakeDriver, AutoDetect: c.st.AutoDetect, IMEXMajor: c.st.IMEXMajor,
		Shared: c.st.Shared, Nodes: c.confNodes(),
	}
}

func (c *Cluster) writeConfigs() error {
	p := c.params()
	files := map[string]string{
		"etc/slurm.conf":  renderSlurmConf(p),
		"etc/gres.conf":   renderGresConf(p),
		"etc/cgroup.conf": renderCgroupConf(p),
	}
	for rel, text := range renderPlugstackFiles(p) {
		files[rel] = text
	}
	if p.PCluster && !p.MIG {
		files["etc/"+pclusterGresFile] = renderPClusterGres(p)
	}
	for rel, text := range files {
		if err := os.WriteFile(c.path(rel), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// WritePlugstack replaces plugstack.conf. srun, sbatch and new steps read
// it at once; slurmd only at its start (see RestartSlurmd).
func (c *Cluster) WritePlugstack(lines []string) error {
	c.st.Plugstack = lines
	p := c.params()
	for rel, text := range renderPlugstackFiles(p) {
		if err := os.WriteFile(c.path(rel), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return c.saveState()
}

func (c *Cluster) buildShim(ctx context.Context) error {
	src := c.path("lib/cg2only.c")
	if err := os.WriteFile(src, shimSource, 0o644); err != nil {
		return err
	}
	args := []string{"-O2", "-Wall", "-fPIC", "-shared", "-o", c.shimPath(), src, "-ldl"}
	if out, err := runCmd(ctx, nil, "gcc", args...); err != nil {
		return fmt.Errorf("gcc %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (c *Cluster) shimPath() string    { return c.path("lib/libcg2only.so") }
func (c *Cluster) mungeSocket() string { return c.path("run/munge/munge.socket") }

func (c *Cluster) baseEnv() []string {
	return []string{
		c.pathEnv(), "LANG=C", "HOME=/root", "SLURM_CONF=" + c.path("etc/slurm.conf"),
	}
}

func (c *Cluster) startMunged() error {
	mu, err := lookupIDs("munge")
	if err != nil {
		return err
	}
	run := c.path("run/munge")
	p, err := startProcess("munged", c.path("logs/munged.log"), c.baseEnv(),
		&syscall.Credential{Uid: uint32(mu.uid), Gid: uint32(mu.gid), Groups: []uint32{}}, c.st.Root,
		"/usr/sbin/munged", "-F", "--socket="+c.mungeSocket(), "--key-file="+mungeKey,
		"--pid-file="+run+"/munged.pid", "--seed-file="+run+"/munged.seed",
		"--log-file="+run+"/munged.log")
	if err != nil {
		return err
	}
	c.st.Munged = p
	if err := WaitSocket(c.mungeSocket(), 15*time.Second); err != nil {
		return fmt.Errorf("munged: %w\n%s\n%s", err, tail(p.Log, 20), tail(run+"/munged.log", 20))
	}
	return nil
}

func (c *Cluster) startSlurmctld() error {
	p, err := startProcess("slurmctld", c.path("logs/slurmctld.out"), c.baseEnv(), nil, c.st.Root,
		c.daemonArgv("slurmctld", "-D", "-f", c.path("etc/slurm.conf"))...)
	if err != nil {
		return err
	}
	c.st.Slurmctld = p
	return nil
}

// RestartSlurmdBusy restarts slurmd while jobs run (their slurmstepds keep
// running) and waits until it answers and the node is up again.
func (c *Cluster) RestartSlurmdBusy() error {
	if c.multiNode() {
		return errors.New("RestartSlurmdBusy restarts the one slurmd of a single-node cluster: use KillSlurmd and StartSlurmd per node")
	}
	if err := c.st.Slurmd.Stop(); err != nil {
		return fmt.Errorf("stop slurmd: %w", err)
	}
	env := c.baseEnv()
	if c.st.Hybrid {
		env = append(env, "LD_PRELOAD="+c.shimPath())
	}
	p, err := startProcess("slurmd", c.path("logs/slurmd.out"), env, nil, c.st.Root,
		c.daemonArgv("slurmd", "-D", "-f", c.path("etc/slurm.conf"))...)
	if err != nil {
		return err
	}
	c.st.Slurmd = p
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		if r := c.Run(ctx, "", "scontrol", "show", "slurmd"); r.Code == 0 {
			st := c.Run(ctx, "", "sinfo", "-h", "-N", "-n", c.st.Host, "-o", "%t")
			switch strings.TrimSpace(st.Stdout) {
			case "idle", "mix", "alloc":
				return c.saveState()
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("slurmd not back after a restart: %w\n%s", ctx.Err(), c.diag())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) startSlurmd(ctx context.Context) error {
	if c.multiNode() {
		return c.startNodes(ctx)
	}
	env := c.baseEnv()
	if c.st.Hybrid {
		env = append(env, "LD_PRELOAD="+c.shimPath())
	}
	p, err := startProcess("slurmd", c.path("logs/slurmd.out"), env, nil, c.st.Root,
		c.daemonArgv("slurmd", "-D", "-f", c.path("etc/slurm.conf"))...)
	if err != nil {
		return err
	}
	c.st.Slurmd = p
	if err := c.waitIdle(ctx, 60*time.Second); err != nil {
		return err
	}
	return c.discoverScope()
}

// waitIdle waits until slurmd answers and the node is idle in sinfo.
func (c *Cluster) waitIdle(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last Result
	for {
		for _, p := range []*Process{c.st.Munged, c.st.Slurmctld, c.st.Slurmd} {
			if !p.Alive() {
				return fmt.Errorf("%s exited while waiting for node %s\n%s", p.Name, c.st.Host, c.diag())
			}
		}
		if r := c.Run(ctx, "", "scontrol", "show", "slurmd"); r.Code == 0 {
			last = c.Run(ctx, "", "sinfo", "-h", "-N", "-n", c.st.Host, "-o", "%t")
			if last.Code == 0 && strings.TrimSpace(last.Stdout) == "idle" {
				return nil
			}
		} else {
			last = r
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not idle after %s: %w\nlast: %s\n%s", c.st.Host, timeout, ctx.Err(), last, c.diag())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// diag is the tail of every daemon log, for error messages.
func (c *Cluster) diag() string {
	var parts []string
	rels := []string{"logs/munged.log", "logs/slurmctld.out", "logs/slurmctld.log", "logs/slurmd.out", "logs/slurmd.log"}
	for _, n := range c.st.Nodes {
		rels = append(rels, "logs/slurmd-"+n.Name+".out", "logs/slurmd-"+n.Name+".log")
	}
	for _, rel := range rels {
		parts = append(parts, tail(c.path(rel), 15))
	}
	return strings.Join(parts, "\n")
}

// RestartSlurmd rewrites cgroup.conf and restarts slurmd only (slurmd reads
// cgroup.conf and plugstack.conf's prolog/epilog plugins only at start).
func (c *Cluster) RestartSlurmd(constrainDevices bool) error {
	c.st.ConstrainDevices = constrainDevices
	if err := os.WriteFile(c.path("etc/cgroup.conf"), []byte(renderCgroupConf(c.params())), 0o644); err != nil {
		return err
	}
	if err := c.st.Slurmd.Stop(); err != nil {
		return fmt.Errorf("stop slurmd: %w", err)
	}
	if err := c.startSlurmd(context.Background()); err != nil {
		return fmt.Errorf("restart slurmd: %w", err)
	}
	return c.saveState()
}

// SetMIG rewrites gres.conf in the MIG layout (on) or the plain one, and
// slurm.conf's node Gres to match (typed in the MIG layout, or slurmd drops
// the types), then restarts slurmctld and slurmd: slurmd reads gres.conf only
// at start, and slurmctld 22.05 mixes up typed GRES after a reconfigure that
// changes them. No job may run. Running agents keep the table they read at
// their start.
func (c *Cluster) SetMIG(on bool) error {
	if on && c.st.GPUs != migGPUs {
		return fmt.Errorf("MIG layout needs GPUs=%d, the cluster has %d", migGPUs, c.st.GPUs)
	}
	if on && c.st.AutoDetect {
		return fmt.Errorf("the MIG layout and the AutoDetect layout exclude each other: SetAutoDetect(false) first")
	}
	c.st.MIG = on
	for _, p := range []*Process{c.st.Slurmd, c.st.Slurmctld} {
		if err := p.Stop(); err != nil {
			return fmt.Errorf("stop %s: %w", p.Name, err)
		}
	}
	p := c.params()
	if err := os.WriteFile(c.path("etc/gres.conf"), []byte(renderGresConf(p)), 0o644); err != nil {
		return err
	}
	if p.PCluster && !p.MIG {
		if err := os.WriteFile(c.path("etc/"+pclusterGresFile), []byte(renderPClusterGres(p)), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(c.path("etc/slurm.conf"), []byte(renderSlurmConf(p)), 0o644); err != nil {
		return err
	}
	if err := c.startSlurmctld(); err != nil {
		return err
	}
	if err := c.startSlurmd(context.Background()); err != nil {
		return fmt.Errorf("restart slurmd with the %s gres.conf: %w", map[bool]string{true: "MIG", false: "plain"}[on], err)
	}
	return c.saveState()
}

// SetIMEX turns Slurm's switch/nvidia_imex on with imex_dev_major=major
// (a fake major: no driver behind it), or off (0), and restarts slurmctld
// and slurmd. Only in a Debian root, which then gets a /dev of its own:
// slurmd makes and empties /dev/nvidia-caps-imex-channels at start, which
// must not be this host's. No job may run.
func (c *Cluster) SetIMEX(major uint32) error {
	if c.st.SysRoot == "" {
		return fmt.Errorf("switch/nvidia_imex needs a Debian root (its own /dev); this cluster runs %s (%s)", c.st.Full, c.st.Kind)
	}
	for _, p := range []*Process{c.st.Slurmd, c.st.Slurmctld} {
		if err := p.Stop(); err != nil {
			return fmt.Errorf("stop %s: %w", p.Name, err)
		}
	}
	c.st.IMEXMajor = major
	if err := os.WriteFile(c.path("etc/slurm.conf"), []byte(renderSlurmConf(c.params())), 0o644); err != nil {
		return err
	}
	if err := c.writeRootWrappers(); err != nil {
		return err
	}
	if err := c.startSlurmctld(); err != nil {
		return err
	}
	if err := c.startSlurmd(context.Background()); err != nil {
		return fmt.Errorf("restart slurmd with switch/nvidia_imex %d: %w\n%s", major, err, tail(c.path("logs/slurmd.log"), 20))
	}
	return c.saveState()
}

// SetShared puts gres/shard ("shard") or gres/mps ("mps") next to the
// node's GPUs, sharedPerGPU(kind) of them per GPU in one gres.conf record per
// GPU, or takes them away (""), and lets each core take several jobs; then
// restarts slurmctld and slurmd (slurmd reads gres.conf only at start). No
// job may run.
func (c *Cluster) SetShared(kind string) error {
	switch {
	case kind != "" && kind != "shard" && kind != "mps":
		return fmt.Errorf("shared gres %q: want shard, mps or empty", kind)
	case kind != "" && (c.st.MIG || c.st.AutoDetect || c.st.FakeDriver):
		return fmt.Errorf("the shared layout is written for the plain and ParallelCluster gres.conf only: turn the MIG, AutoDetect and fake-driver layouts off first")
	}
	for _, p := range []*Process{c.st.Slurmd, c.st.Slurmctld} {
		if err := p.Stop(); err != nil {
			return fmt.Errorf("stop %s: %w", p.Name, err)
		}
	}
	c.st.Shared = kind
	p := c.params()
	script := fmt.Sprintf("#!/bin/sh\nenv > %s/prolog.$SLURM_JOB_ID.env\n", c.path("work"))
	if err := os.WriteFile(c.path(PrologEnvScript), []byte(script), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(c.path("etc/gres.conf"), []byte(renderGresConf(p)), 0o644); err != nil {
		return err
	}
	if p.PCluster {
		if err := os.WriteFile(c.path("etc/"+pclusterGresFile), []byte(renderPClusterGres(p)), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(c.path("etc/slurm.conf"), []byte(renderSlurmConf(p)), 0o644); err != nil {
		return err
	}
	if err := c.startSlurmctld(); err != nil {
		return err
	}
	if err := c.startSlurmd(context.Background()); err != nil {
		return fmt.Errorf("restart slurmd with shared gres %q: %w\n%s", kind, err, tail(c.path("logs/slurmd.log"), 20))
	}
	return c.saveState()
}

// NamespaceBase is the base_path a namespace.yaml of SetNamespace must
// give namespace/linux: Slurm mounts each job's private folders there.
func (c *Cluster) NamespaceBase() string { return c.path("ns") }

// SetNamespace turns Slurm's namespace/linux plugin (25.11) on with the
// given namespace.yaml, or off ("" removes it), and restarts slurmctld and
// slurmd, which read NamespaceType only at start. No job may run.
func (c *Cluster) SetNamespace(yaml string) error {
	if yaml != "" && !c.AtLeast("25.11") {
		return fmt.Errorf("namespace/linux is Slurm 25.11's; this cluster runs %s", c.st.Full)
	}
	for _, p := range []*Process{c.st.Slurmd, c.st.Slurmctld} {
		if err := p.Stop(); err != nil {
			return fmt.Errorf("stop %s: %w", p.Name, err)
		}
	}
	if err := c.unmountNamespaceBase(); err != nil {
		return err
	}
	c.st.Namespace = yaml != ""
	if yaml != "" {
		if err := os.MkdirAll(c.NamespaceBase(), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(c.path("etc/namespace.yaml"), []byte(yaml), 0o644); err != nil {
			return err
		}
	} else if err := os.Remove(c.path("etc/namespace.yaml")); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.WriteFile(c.path("etc/slurm.conf"), []byte(renderSlurmConf(c.params())), 0o644); err != nil {
		return err
	}
	if err := c.startSlurmctld(); err != nil {
		return err
	}
	if err := c.startSlurmd(context.Background()); err != nil {
		return fmt.Errorf("restart slurmd with namespace/linux %v: %w\n%s", c.st.Namespace, err, tail(c.path("logs/slurmd.log"), 20))
	}
	return c.saveState()
}

// unmountNamespaceBase detaches what Slurm's namespace/linux left mounted
// under NamespaceBase in this mount namespace (it mounts there, in
// slurmstepd's namespace, and unmounts when a job ends; a daemon killed
// early leaves them). Only that folder, which the harness gave Slurm.
func (c *Cluster) unmountNamespaceBase() error {
	var errs []error
	m := mountsAt(c.NamespaceBase())
	for i := len(m) - 1; i >= 0; i-- {
		c.logf("unmounting %s, left by namespace/linux", m[i])
		if err := syscall.Unmount(m[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m[i], err))
		}
	}
	return errors.Join(errs...)
}

// CapsMajor is the fake nvidia-caps major of the MIG capability nodes.
func (c *Cluster) CapsMajor() uint32 { return c.st.CapsMajor }

// CapsPath is the fake /dev/nvidia-caps/nvidia-cap<minor>.
func (c *Cluster) CapsPath(minor uint32) string { return c.path("dev/" + capsNodeName(minor)) }

func (c *Cluster) saveState() error {
	b, err := json.MarshalIndent(&c.st, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(c.path("state.json"), b, 0o644)
}

// SetSetup records what Ensure created, so that `gfcluster down` in another
// process can undo it.
func (c *Cluster) SetSetup(s *Setup) error { c.st.Setup = s; return c.saveState() }

// Setup returns what SetSetup recorded (nil if nothing).
func (c *Cluster) Setup() *Setup { return c.st.Setup }

func (c *Cluster) path(rel string) string { return filepath.Join(c.st.Root, rel) }

// Root is the cluster's work folder.
func (c *Cluster) Root() string { return c.st.Root }

// Hostname is the node name (`hostname -s`).
func (c *Cluster) Hostname() string { return c.st.Host }

// Env is the environment a Slurm client needs to reach this cluster.
func (c *Cluster) Env() []string { return []string{"SLURM_CONF=" + c.path("etc/slurm.conf")} }

// SlurmConf is the path of slurm.conf.
func (c *Cluster) SlurmConf() string { return c.path("etc/slurm.conf") }

// DevPath is the fake device node of GPU i.
func (c *Cluster) DevPath(i int) string { return c.path(fmt.Sprintf("dev/nvidia%d", i)) }

// DevPaths are the fake device nodes of all GPUs, in index order.
func (c *Cluster) DevPaths() []string {
	var p []string
	for i := 0; i < c.st.GPUs; i++ {
		p = append(p, c.DevPath(i))
	}
	return p
}

// CtlPath is the fake /dev/nvidiactl.
func (c *Cluster) CtlPath() string { return c.path("dev/nvidiactl") }

// ScopeDir is the cgroup2 folder Slurm puts slurmd and every job under:
// <mount>/<slice>/<node>_slurmstepd.scope (Debian's packages, built with
// multiple-slurmd support) or <mount>/<slice>/slurmstepd.scope.
func (c *Cluster) ScopeDir() string {
	if c.st.Scope != "" {
		return c.st.Scope
	}
	if len(c.st.ScopeCandidates) > 0 {
		return c.st.ScopeCandidates[0]
	}
	return filepath.Join(c.st.CgroupMount, c.slice(), c.st.Host+"_slurmstepd.scope")
}

// LogPath is the path of a log under <Root>/logs (slurmd.log, slurmctld.log, <agent>.log).
func (c *Cluster) LogPath(name string) string { return c.path("logs/" + name) }

// Daemons returns the processes the cluster started (agents included).
func (c *Cluster) Daemons() []*Process {
	var ps []*Process
	for _, p := range append(append([]*Process{c.st.Munged, c.st.Slurmctld, c.st.Slurmd}, c.nodeSlurmds()...), c.st.Agents...) {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// Run runs a client command as user ("" = root) with a clean environment
// plus Env(), in <Root>/work.
func (c *Cluster) Run(ctx context.Context, usr string, name string, args ...string) Result {
	return c.RunEnv(ctx, usr, nil, name, args...)
}

// RunEnv is Run with extra environment variables (for example forged
// SLURM_JOB_GPUS).
func (c *Cluster) RunEnv(ctx context.Context, usr string, extraEnv []string, name string, args ...string) Result {
	return c.RunStdin(ctx, usr, extraEnv, "", name, args...)
}

// RunStdin is RunEnv with stdin as the command's standard input (salloc's
// interactive shell reads its commands there).
func (c *Cluster) RunStdin(ctx context.Context, usr string, extraEnv []string, stdin, name string, args ...string) Result {
	ctx, cancel := context.WithTimeout(ctx, CommandTimeout)
	defer cancel()
	res := Result{Cmd: strings.Join(append([]string{name}, args...), " "), Code: -1}
	if usr != "" {
		res.Cmd = usr + "$ " + res.Cmd
	}
	cmd, err := c.clientCmd(ctx, usr, name, args)
	if err != nil {
		res.Stderr = err.Error()
		return res
	}
	cmd.Dir = c.path("work")
	env := []string{c.pathEnv(), "LANG=C", "HOME=" + c.path("work")}
	if usr != "" {
		env = append(env, "USER="+usr, "LOGNAME="+usr)
	} else {
		env = append(env, "USER=root", "LOGNAME=root")
	}
	cmd.Env = append(append(env, c.Env()...), extraEnv...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err = cmd.Run()
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	var ee *exec.ExitError
	switch {
	case err == nil:
		res.Code = 0
	case errors.As(err, &ee):
		res.Code = ee.ExitCode()
	default:
		res.Stderr += err.Error()
	}
	return res
}

// credential is the uid, gid and supplementary groups of u, as
// `setpriv --reuid --regid --init-groups` would set them.
func credential(u *user.User) (*syscall.Credential, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	gids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("groups of %s: %w", u.Username, err)
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	for _, g := range gids {
		n, err := strconv.ParseUint(g, 10, 32)
		if err == nil {
			cred.Groups = append(cred.Groups, uint32(n))
		}
	}
	return cred, nil
}

// Sbatch submits a batch job as user and returns its id.
func (c *Cluster) Sbatch(ctx context.Context, usr string, args ...string) (string, error) {
	r := c.Run(ctx, usr, "sbatch", append([]string{"--parsable"}, args...)...)
	if r.Code != 0 {
		return "", fmt.Errorf("sbatch failed: %s\n%s", r, tail(c.path("logs/slurmctld.log"), 10))
	}
	id, _, _ := strings.Cut(strings.TrimSpace(r.Stdout), ";")
	return id, nil
}

// CommandTimeout bounds each client command (srun, sbatch, squeue…) and
// each WaitJob, so a job that never starts fails the test that made it
// instead of hanging the suite.
const CommandTimeout = 5 * time.Minute

// WaitJob waits until job id has left squeue and returns its final
// JobState from scontrol (COMPLETED, FAILED, …).
func (c *Cluster) WaitJob(ctx context.Context, id string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, CommandTimeout)
	defer cancel()
	for {
		r := c.Run(ctx, "", "squeue", "-h", "-j", id, "-o", "%T")
		if (r.Code == 0 && strings.TrimSpace(r.Stdout) == "") || strings.Contains(r.Stderr, "Invalid job id") {
			break
		}
		if r.Code != 0 && ctx.Err() == nil {
			return "", fmt.Errorf("wait for job %s: %s", id, r)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("wait for job %s: %w (squeue: %s)\n%s", id, ctx.Err(), strings.TrimSpace(r.Stdout), c.diag())
		case <-time.After(200 * time.Millisecond):
		}
	}
	r := c.Run(ctx, "", "scontrol", "-o", "show", "job", id)
	for _, f := range strings.Fields(r.Stdout) {
		if v, ok := strings.CutPrefix(f, "JobState="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("state of job %s: %s", id, r)
}

// StartAgent starts a daemon (the gpufence agent) in its own session with
// its output in <Root>/logs/<base name of bin>.log. Stop stops it too.
func (c *Cluster) StartAgent(ctx context.Context, bin string, args ...string) (*Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	name := filepath.Base(bin)
	env := append(c.baseEnv(), "PATH="+c.ToolPATH())
	p, err := startProcess(name, c.path("logs/"+name+".log"), env, nil, c.st.Root, append([]string{bin}, args...)...)
	if err != nil {
		return nil, err
	}
	c.st.Agents = append(c.st.Agents, p)
	return p, c.saveState()
}

// BuildTool builds tests/cmd/<name> (static, CGO_ENABLED=0) into
// <Root>/bin/<name>, where the job user can run it, and returns its path.
func (c *Cluster) BuildTool(ctx context.Context, name string) (string, error) {
	mod, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := c.path("bin/" + name)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "./tests/cmd/"+name)
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./tests/cmd/%s: %w\n%s", name, err, b)
	}
	return out, os.Chmod(out, 0o755)
}

// moduleRoot finds the gpufence module: up from the working directory, else
// from this source file.
func moduleRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, d := range starts {
		for ; ; d = filepath.Dir(d) {
			b, err := os.ReadFile(filepath.Join(d, "go.mod"))
			if err == nil && strings.Contains(string(b), "module github.com/gpufence/gpufence\n") {
				return d, nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return "", errors.New("gpufence module root not found (run from inside the repository)")
}

// Lock takes the cluster lock for a cluster Load found (started by
// another process, such as `gfcluster up`), so that its Stop cannot race a
// cluster that a test is starting: Stop removes the cgroups under the
// node's scope that were not there before, which would then be the other
// cluster's. Stop releases it.
func (c *Cluster) Lock(ctx context.Context) error {
	if c.lock != nil {
		return nil
	}
	f, err := takeLock(ctx)
	if err != nil {
		return err
	}
	c.lock = f
	return nil
}

// Stop cancels the jobs, stops the daemons by PID (slurmd first), kills what
// is left in the cgroups Slurm made during this run, removes those cgroups
// and, unless Keep, the files the harness created.
func (c *Cluster) Stop() error {
	var errs []error
	slurmds := append([]*Process{c.st.Slurmd}, c.nodeSlurmds()...)
	if c.st.Slurmctld.Alive() && slices.ContainsFunc(slurmds, (*Process).Alive) {
		errs = append(errs, c.cancelJobs())
	}
	for _, p := range append(slurmds, c.st.Slurmctld) {
		if p != nil {
			errs = append(errs, p.Stop())
		}
	}
	for _, p := range c.st.Agents {
		errs = append(errs, p.Stop())
	}
	if c.st.Munged != nil {
		errs = append(errs, c.st.Munged.Stop())
	}
	if c.st.CgroupMount != "" {
		errs = append(errs, c.cleanCgroups())
	}
	if c.st.Root != "" {
		errs = append(errs, c.unmountNamespaceBase())
	}
	if c.st.Root != "" && !c.st.Keep {
		errs = append(errs, c.removeFiles())
	}
	if c.lock != nil {
		c.lock.Close()
		c.lock = nil
	}
	return joinErrs(errs)
}

func (c *Cluster) cancelJobs() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		r := c.Run(ctx, "", "squeue", "-h", "-o", "%i")
		ids := strings.Fields(r.Stdout)
		if r.Code != 0 {
			return fmt.Errorf("list jobs: %s", r)
		}
		if len(ids) == 0 {
			return nil
		}
		c.Run(ctx, "", "scancel", ids...)
		select {
		case <-ctx.Done():
			return fmt.Errorf("jobs %v still in squeue after scancel", ids)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func (c *Cluster) removeFiles() error {
	// Never remove a tree something is still mounted in (gfroot mounts
	// only in namespaces of its own, which end with their processes).
	if m := mountsAt(c.st.Root); len(m) > 0 {
		return fmt.Errorf("%s is left in place: mounts under it: %v", c.st.Root, m)
	}
	if c.st.CreatedRoot {
		return os.RemoveAll(c.st.Root)
	}
	var errs []error
	for _, e := range rootEntries {
		errs = append(errs, os.RemoveAll(c.path(e)))
	}
	return joinErrs(errs)
}

func joinErrs(errs []error) error { return errors.Join(errs...) }

// sortDeepestFirst orders cgroup paths so that children come before parents.
func sortDeepestFirst(paths []string) {
	sort.SliceStable(paths, func(i, j int) bool {
		di, dj := strings.Count(paths[i], "/"), strings.Count(paths[j], "/")
		if di != dj {
			return di > dj
		}
		return paths[i] < paths[j]
	})
}
