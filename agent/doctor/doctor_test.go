// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// node is a fixture root that looks like a healthy GPU node: pure cgroup v2,
// bpffs, Slurm 24.11 with gpufence's plugin for 24.11 in plugstack.conf.d,
// two GPUs in gres.conf and /dev, the agent listening on its socket, the
// audit file in place.
type node struct {
	t    *testing.T
	root string
	env  Env
	ln   net.Listener
}

const (
	mountsV2 = `21 1 254:0 / / rw,relatime - ext4 /dev/vda rw
22 21 0:20 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
23 21 0:21 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
24 23 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	mountBPF    = "25 23 0:23 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:5 - bpf bpf rw,mode=700\n"
	mountsHyb   = "21 1 254:0 / / rw - ext4 /dev/vda rw\n23 21 0:21 / /sys rw - sysfs sysfs rw\n30 23 0:27 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n31 30 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n35 30 0:32 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n40 30 0:37 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
	mountsV1    = "21 1 254:0 / / rw - ext4 /dev/vda rw\n23 21 0:21 / /sys rw - sysfs sysfs rw\n30 23 0:27 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n31 30 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n35 30 0:32 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n"
	slurmConf   = "ClusterName=test\nSlurmctldHost=head\nProctrackType=proctrack/cgroup\nTaskPlugin=task/affinity,task/cgroup\nNodeName=gpu[1-2] Gres=gpu:2 State=UNKNOWN\nPartitionName=p Nodes=ALL Default=YES\n"
	cgroupConf  = "CgroupPlugin=cgroup/v2\nConstrainDevices=no\n"
	gresConf    = "NodeName=gpu1 Name=gpu File=/dev/nvidia[0-1]\n"
	procDevices = "Character devices:\n  1 mem\n195 nvidia-frontend\n511 nvidia-caps\n\nBlock devices:\n  7 loop\n"
	v2411       = 0x180b00
	v2311       = 0x170b00
)

func newNode(t *testing.T) *node {
	t.Helper()
	// Short: the socket path must fit in 108 bytes.
	root, err := os.MkdirTemp("", "gfdoc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	n := &node{t: t, root: root}
	n.write("/proc/self/mountinfo", mountsV2+mountBPF)
	n.write("/proc/devices", procDevices)
	n.write("/proc/sys/kernel/osrelease", "6.12.0-test\n")
	n.write("/etc/slurm/slurm.conf", slurmConf)
	n.write("/etc/slurm/cgroup.conf", cgroupConf)
	n.write("/etc/slurm/gres.conf", gresConf)
	n.write("/etc/slurm/plugstack.conf", "include plugstack.conf.d/*.conf\n")
	n.write("/etc/slurm/plugstack.conf.d/gpufence.conf", "required /usr/lib/gpufence/spank_gpufence.so\n")
	n.plugin("/usr/lib/gpufence/slurm-24.11/spank_gpufence.so", v2411)
	n.symlink("/usr/lib/gpufence/slurm-24.11/spank_gpufence.so", "/usr/lib/gpufence/spank_gpufence.so")
	n.slurmd("slurm 24.11.1")
	if os.Geteuid() == 0 {
		n.mknod("/dev/nvidia0", 195, 0)
		n.mknod("/dev/nvidia1", 195, 1)
	} else {
		// Device nodes need root: without them this node has no GPU.
		n.write("/etc/slurm/gres.conf", "NodeName=gpu2 Name=gpu File=/dev/nvidia[0-1]\n")
	}
	n.write("/sys/fs/bpf/gpufence/state", "")
	// Slurm 24.11 from Debian (multiple-slurmd): slurmd's scope, named by the node.
	n.write("/sys/fs/cgroup/system.slice/gpu1_slurmstepd.scope/cgroup.procs", "")
	n.write("/sys/fs/cgroup/system.slice/gpu1_slurmstepd.scope/slurmd/cgroup.procs", "")
	n.listen()
	if err := os.MkdirAll(n.path("/var/log/gpufence"), 0o750); err != nil {
		t.Fatal(err)
	}
	os.Chmod(n.path("/var/log/gpufence"), 0o750)
	n.writeMode("/var/log/gpufence/audit.jsonl", "{}\n", 0o640)

	cfg := config.Default()
	cfg.NodeName = "gpu1"
	cfg.SlurmConf = "/etc/slurm/slurm.conf"
	n.env = Env{
		Root: root, Config: cfg, Version: "test", AdminUID: uint32(os.Geteuid()),
		ProbeKernel: func() (devfilter.Mode, error) { return devfilter.ModeScope, nil },
		Inventory: func() ([]inventory.GPU, error) {
			return []inventory.GPU{
				{Index: 0, Minor: 0, UUID: "GPU-aaaa", PCIBusID: "00000000:18:00.0", Name: "NVIDIA H100 80GB HBM3"},
				{Index: 1, Minor: 1, UUID: "GPU-bbbb", PCIBusID: "00000000:2A:00.0", Name: "NVIDIA H100 80GB HBM3"},
			}, nil
		},
	}
	return n
}

func (n *node) path(p string) string { return filepath.Join(n.root, p) }

func (n *node) write(p, body string) { n.writeMode(p, body, 0o644) }

func (n *node) writeMode(p, body string, mode os.FileMode) {
	n.t.Helper()
	if err := os.MkdirAll(filepath.Dir(n.path(p)), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(n.path(p), []byte(body), mode); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Chmod(n.path(p), mode); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) remove(p string) {
	n.t.Helper()
	if err := os.RemoveAll(n.path(p)); err != nil {
		n.t.Fatal(err)
	}
}

// symlink makes link point at the node path target (absolute, so resolving
// it must stay inside the root).
func (n *node) symlink(target, link string) {
	n.t.Helper()
	os.Remove(n.path(link))
	if err := os.Symlink(target, n.path(link)); err != nil {
		n.t.Fatal(err)
	}
}

// slurmd installs a slurmd that prints out for -V.
func (n *node) slurmd(out string) {
	n.writeMode("/usr/sbin/slurmd", fmt.Sprintf("#!/bin/sh\necho '%s'\n", out), 0o755)
}

func (n *node) mknod(p string, major, minor uint32) {
	n.t.Helper()
	if os.Geteuid() != 0 {
		n.t.Skip("skipping: making device nodes in the fixture needs root")
	}
	os.Remove(n.path(p))
	if err := os.MkdirAll(filepath.Dir(n.path(p)), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := unix.Mknod(n.path(p), unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
		n.t.Fatal(err)
	}
}

// listen plays the agent: a 0600 socket that accepts and drops connections.
func (n *node) listen() {
	n.t.Helper()
	p := n.path("/run/gpufence/agent.sock")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		n.t.Fatal(err)
	}
	ln, err := net.Listen("unix", p)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		n.t.Fatal(err)
	}
	n.ln = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	n.t.Cleanup(func() { ln.Close() })
}

// stopAgent closes the listener; unlink removes the socket file too.
func (n *node) stopAgent(unlink bool) {
	if l, ok := n.ln.(*net.UnixListener); ok {
		l.SetUnlinkOnClose(unlink)
	}
	n.ln.Close()
}

var (
	gccOnce sync.Once
	gccDir  string
	gccErr  error
	builtMu sync.Mutex
	built   = map[uint32]string{}
)

// plugin builds a tiny shared object with the given plugin_version, as
// SPANK_PLUGIN defines it, and copies it to p.
func (n *node) plugin(p string, version uint32) {
	n.t.Helper()
	so := buildPlugin(n.t, version)
	b, err := os.ReadFile(so)
	if err != nil {
		n.t.Fatal(err)
	}
	n.writeMode(p, string(b), 0o755)
}

func buildPlugin(t *testing.T, version uint32) string {
	t.Helper()
	gccOnce.Do(func() {
		if _, gccErr = exec.LookPath("gcc"); gccErr != nil {
			return
		}
		gccDir, gccErr = os.MkdirTemp("", "gfdoc-so")
	})
	if gccErr != nil {
		t.Skipf("skipping: building a test plugin needs gcc: %v", gccErr)
	}
	builtMu.Lock()
	defer builtMu.Unlock()
	if so, ok := built[version]; ok {
		return so
	}
	src := filepath.Join(gccDir, fmt.Sprintf("p%x.c", version))
	so := filepath.Join(gccDir, fmt.Sprintf("p%x.so", version))
	body := fmt.Sprintf("const char plugin_name[] = \"gpufence\";\nconst char plugin_type[] = \"spank\";\nconst unsigned int plugin_version = 0x%x;\nconst unsigned int spank_plugin_version = 1;\n", version)
	if err := os.WriteFile(src, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	built[version] = so
	return so
}

func TestMain(m *testing.M) {
	code := m.Run()
	if gccDir != "" {
		os.RemoveAll(gccDir)
	}
	os.Exit(code)
}

func (n *node) run() Report { return Run(n.env) }

func find(t *testing.T, r Report, id string) Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.ID == id {
			return c
		}
	}
	t.Fatalf("no check %q in the report", id)
	return Check{}
}

func dump(r Report) string {
	var b strings.Builder
	r.WriteText(&b)
	return b.String()
}

func TestHealthyNode(t *testing.T) {
	n := newNode(t)
	r := n.run()
	for _, c := range r.Checks {
		if (c.ID == "gres" && c.Verdict == Info || c.ID == "nvml" && c.Verdict == Skip) && os.Geteuid() != 0 {
			continue // no device nodes without root, so no GPU table
		}
		if c.Verdict != OK {
			t.Errorf("%s: %s: %s", c.ID, c.Verdict, c.Summary)
		}
		if c.Fix != "" {
			t.Errorf("%s: a fix on an ok check: %s", c.ID, c.Fix)
		}
	}
	if !r.OK || t.Failed() {
		t.Fatalf("healthy node not ok:\n%s", dump(r))
	}
	p := find(t, r, "slurm-plugin")
	if !strings.Contains(p.Summary, "Slurm 24.11") {
		t.Errorf("slurm-plugin summary %q does not name the release", p.Summary)
	}
	want := "/usr/lib/gpufence/spank_gpufence.so -> /usr/lib/gpufence/slurm-24.11/spank_gpufence.so"
	if !strings.Contains(strings.Join(p.Detail, "\n"), want) {
		t.Errorf("slurm-plugin detail lacks the symlink %q:\n%s", want, strings.Join(p.Detail, "\n"))
	}
	g := find(t, r, "gres")
	if os.Geteuid() == 0 && !strings.Contains(strings.Join(g.Detail, " "), "/dev/nvidia0=195:0 /dev/nvidia1=195:1") {
		t.Errorf("gres detail: %q", g.Detail)
	}
	text := dump(r)
	for _, s := range []string{"OK    cgroup", "ready: "} {
		if !strings.Contains(text, s) {
			t.Errorf("text output lacks %q:\n%s", s, text)
		}
	}
}

// TestFailures breaks one thing at a time on a healthy node and checks that
// exactly the check that owns it reports it, with a fix.
func TestFailures(t *testing.T) {
	cases := []struct {
		name    string
		breakIt func(n *node)
		id      string
		verdict Verdict
		summary string // substring of the summary
		fix     string // substring of the fix
		// others are the checks this break also affects; every other
		// check must stay ok.
		others []string
	}{
		{"missing plugstack line", func(n *node) { n.remove("/etc/slurm/plugstack.conf.d/gpufence.conf") },
			"plugstack", Fail, "no line loads spank_gpufence.so", "/etc/slurm/plugstack.conf.d/gpufence.conf", nil},
		{"no plugstack.conf", func(n *node) { n.remove("/etc/slurm/plugstack.conf") },
			"plugstack", Fail, "no /etc/slurm/plugstack.conf", "required /usr/lib/gpufence/spank_gpufence.so", nil},
		{"PlugStackConfig elsewhere without the line", func(n *node) {
			n.write("/etc/slurm/slurm.conf", slurmConf+"PlugStackConfig=/etc/slurm/other.conf\n")
			n.write("/etc/slurm/other.conf", "optional /usr/lib/x/other.so\n")
		}, "plugstack", Fail, "no line loads", "/etc/slurm/other.conf", nil},
		{"optional plugstack line", func(n *node) {
			n.write("/etc/slurm/plugstack.conf.d/gpufence.conf", "optional /usr/lib/gpufence/spank_gpufence.so\n")
		}, "plugstack", Warn, "optional", `"required"`, nil},
		{"plugin socket differs from the agent's", func(n *node) {
			n.write("/etc/slurm/plugstack.conf.d/gpufence.conf", "required /usr/lib/gpufence/spank_gpufence.so socket=/run/other.sock\n")
		}, "plugstack", Fail, "connects to /run/other.sock but the agent listens on /run/gpufence/agent.sock", "socket=", nil},
		{"unknown plugin option", func(n *node) {
			n.write("/etc/slurm/plugstack.conf.d/gpufence.conf", "required /usr/lib/gpufence/spank_gpufence.so sokcet=/run/gpufence/agent.sock\n")
		}, "plugstack", Fail, `unknown option "sokcet=`, "arguments", nil},
		{"plugstack line listed twice", func(n *node) {
			n.write("/etc/slurm/plugstack.conf.d/zz.conf", "required /usr/lib/gpufence/spank_gpufence.so\n")
		}, "plugstack", Fail, "listed 2 times", "exactly one", nil},
		{"plugstack path missing", func(n *node) {
			n.write("/etc/slurm/plugstack.conf.d/gpufence.conf", "required /opt/gf/spank_gpufence.so\n")
		}, "plugstack", Fail, "/opt/gf/spank_gpufence.so does not exist", "Install", []string{"slurm-plugin"}},
		{"wrong plugin version, no build for it", func(n *node) { n.slurmd("slurm 23.11.4") },
			"slurm-plugin", Fail, "built for Slurm 24.11 but this node runs Slurm 23.11", "make build", nil},
		{"wrong plugin version, the right build is shipped", func(n *node) {
			n.slurmd("slurm 23.11.4")
			n.plugin("/usr/lib/gpufence/slurm-23.11/spank_gpufence.so", v2311)
		}, "slurm-plugin", Fail, "built for Slurm 24.11 but this node runs Slurm 23.11", "ln -sfn /usr/lib/gpufence/slurm-23.11/spank_gpufence.so", nil},
		{"wrong plugin version, link-plugin shipped", func(n *node) {
			n.slurmd("slurm-wlm 23.11.4")
			n.plugin("/usr/lib/gpufence/slurm-23.11/spank_gpufence.so", v2311)
			n.writeMode("/usr/lib/gpufence/link-plugin", "#!/bin/sh\n", 0o755)
		}, "slurm-plugin", Fail, "runs Slurm 23.11", "/usr/lib/gpufence/link-plugin", nil},
		{"build in the wrong folder", func(n *node) { n.plugin("/usr/lib/gpufence/slurm-23.11/spank_gpufence.so", v2411) },
			"slurm-plugin", Fail, "/usr/lib/gpufence/slurm-23.11/spank_gpufence.so is built for Slurm 24.11", "Reinstall", nil},
		{"plugin missing", func(n *node) { n.remove("/usr/lib/gpufence/slurm-24.11") },
			"slurm-plugin", Fail, "no plugin at /usr/lib/gpufence/slurm-24.11/spank_gpufence.so", "Build the plugin against Slurm 24.11", []string{"plugstack"}},
		{"plugin not a Slurm plugin", func(n *node) { n.write("/usr/lib/gpufence/slurm-24.11/spank_gpufence.so", "not elf") },
			"slurm-plugin", Fail, "spank_gpufence.so", "", nil},
		{"ConstrainDevices=yes noted as compatible", func(n *node) { n.write("/etc/slurm/cgroup.conf", "CgroupPlugin=cgroup/v2\nConstrainDevices=yes\n") },
			"slurm-cgroup", OK, "ConstrainDevices=yes, noted as compatible", "", nil},
		{"ConstrainDevices=yes with per-cgroup mode", func(n *node) {
			n.write("/etc/slurm/cgroup.conf", "CgroupPlugin=cgroup/v2\nConstrainDevices=yes\n")
			n.env.ProbeKernel = func() (devfilter.Mode, error) { return devfilter.ModePerCgroup, nil }
		}, "slurm-cgroup", Warn, "with per-cgroup mode", "scope mode", []string{"kernel"}},
		{"cgroup/v1 plugin", func(n *node) { n.write("/etc/slurm/cgroup.conf", "CgroupPlugin=cgroup/v1\n") },
			"slurm-cgroup", Fail, "CgroupPlugin=cgroup/v1", "CgroupPlugin=cgroup/v2", nil},
		{"proctrack/linuxproc", func(n *node) { n.write("/etc/slurm/slurm.conf", slurmConf+"ProctrackType=proctrack/linuxproc\n") },
			"slurm-cgroup", Fail, "ProctrackType=proctrack/linuxproc", "proctrack/cgroup", nil},
		{"no task/cgroup", func(n *node) { n.write("/etc/slurm/slurm.conf", slurmConf+"TaskPlugin=task/affinity\n") },
			"slurm-cgroup", Warn, "without task/cgroup", "task/cgroup", nil},
		{"cgroup v1 only", func(n *node) { n.write("/proc/self/mountinfo", mountsV1+mountBPF) },
			"cgroup", Fail, "cgroup v1 only", "unified_cgroup_hierarchy", nil},
		{"hybrid cgroups", func(n *node) { n.write("/proc/self/mountinfo", mountsHyb+mountBPF) },
			"cgroup", Warn, "hybrid cgroups: cgroup v2 at /sys/fs/cgroup/unified", "unified_cgroup_hierarchy", []string{"slurm-layout"}},
		{"no bpffs while the agent runs", func(n *node) { n.write("/proc/self/mountinfo", mountsV2) },
			"bpffs", Fail, "not a bpf file system", "mount -t bpf bpf /sys/fs/bpf", nil},
		{"no bpffs, agent down", func(n *node) {
			n.write("/proc/self/mountinfo", mountsV2)
			n.stopAgent(true)
		}, "bpffs", Warn, "the agent mounts it when it starts", "mount -t bpf bpf /sys/fs/bpf", []string{"agent-socket"}},
		{"no bpffs, systemd node", func(n *node) {
			n.write("/proc/self/mountinfo", mountsV2)
			n.write("/run/systemd/system/.keep", "")
		}, "bpffs", Fail, "not a bpf file system", "systemctl start sys-fs-bpf.mount", nil},
		{"pin_dir outside bpffs", func(n *node) { n.env.Config.PinDir = "/var/lib/gpufence/pins" },
			"bpffs", Fail, "/var/lib/gpufence/pins is not on a bpf file system", "set pin_dir below /sys/fs/bpf", nil},
		{"pin_dir empty", func(n *node) { n.env.Config.PinDir = "" },
			"bpffs", Warn, "pin_dir is empty", "pin_dir", nil},
		{"scope link defunct (scope recreated)", func(n *node) {
			n.env.InspectPins = func(string) (*devfilter.PinnedView, error) {
				return &devfilter.PinnedView{Pins: []string{"link", "policy", "prog"}, Mode: devfilter.ModeScope,
					Entries: map[uint64]devfilter.PinnedEntry{}, Link: &devfilter.PinnedLink{ID: 17, CgroupID: 0}}, nil
			}
		}, "bpffs", Fail, "the pinned scope link 17 is defunct", "systemctl restart gpufence", nil},
		{"scope link live", func(n *node) {
			n.env.InspectPins = func(string) (*devfilter.PinnedView, error) {
				return &devfilter.PinnedView{Pins: []string{"link", "policy", "prog"}, Mode: devfilter.ModeScope,
					Entries: map[uint64]devfilter.PinnedEntry{}, Link: &devfilter.PinnedLink{ID: 17, CgroupID: 4242}}, nil
			}
		}, "bpffs", OK, "is on bpffs", "", nil},
		{"slurmd link defunct (slurmd.service made again)", func(n *node) {
			n.env.InspectPins = func(string) (*devfilter.PinnedView, error) {
				return &devfilter.PinnedView{Pins: []string{"link", "link_slurmd", "policy", "prog"}, Mode: devfilter.ModeScope,
					Entries: map[uint64]devfilter.PinnedEntry{}, Link: &devfilter.PinnedLink{ID: 17, CgroupID: 4242},
					SlurmdLink: &devfilter.PinnedLink{ID: 18, CgroupID: 0}}, nil
			}
		}, "bpffs", Warn, "the pinned link 18 on slurmd's cgroup is defunct", "systemctl restart gpufence", nil},
		{"socket absent", func(n *node) { n.stopAgent(true) },
			"agent-socket", Fail, "no socket at /run/gpufence/agent.sock", "gpufence agent", nil},
		{"socket absent, systemd node", func(n *node) {
			n.stopAgent(true)
			n.write("/run/systemd/system/.keep", "")
		}, "agent-socket", Fail, "no socket", "systemctl start gpufence.socket", nil},
		{"stale socket", func(n *node) { n.stopAgent(false) },
			"agent-socket", Fail, "refuses connections", "gpufence agent", nil},
		{"socket open to others", func(n *node) { os.Chmod(n.path("/run/gpufence/agent.sock"), 0o666) },
			"agent-socket", Warn, "mode 0666", "chmod 0600", nil},
		{"socket of another user", func(n *node) { n.env.AdminUID = uint32(os.Geteuid()) + 1 },
			"agent-socket", Fail, "not the agent's", "remove it", []string{"audit"}},
		{"a file where the socket belongs", func(n *node) {
			n.stopAgent(true)
			n.write("/run/gpufence/agent.sock", "")
		}, "agent-socket", Fail, "is not a socket", "Remove", nil},
		{"kernel without the ancestor helper", func(n *node) {
			n.env.ProbeKernel = func() (devfilter.Mode, error) { return devfilter.ModePerCgroup, nil }
		}, "kernel", Warn, "per-cgroup fallback", "6.1", nil},
		{"mode scope forced on a per-cgroup kernel", func(n *node) {
			n.env.ProbeKernel = func() (devfilter.Mode, error) { return devfilter.ModePerCgroup, nil }
			n.env.Config.Mode = config.ModeScope
		}, "kernel", Fail, "mode: scope is configured", "mode: auto", nil},
		{"kernel without CGROUP_DEVICE programs", func(n *node) {
			n.env.ProbeKernel = func() (devfilter.Mode, error) { return "", errors.New("probe CGROUP_DEVICE programs: not supported") }
		}, "kernel", Fail, "cannot load", "CONFIG_CGROUP_BPF", nil},
		{"kernel not probed", func(n *node) {
			n.env.ProbeKernel, n.env.KernelSkip = nil, "needs root"
		}, "kernel", Skip, "needs root", "", nil},
		{"gres device with the wrong minor", func(n *node) { n.mknod("/dev/nvidia1", 195, 5) },
			"gres", Fail, "/dev/nvidia1 has minor 5 but its name says 1", "mknod /dev/nvidia1 c 195 1", nil},
		{"gres device of another major", func(n *node) { n.mknod("/dev/nvidia1", 1, 1) },
			"gres", Fail, "is device 1:1, not the NVIDIA major 195", "nvidia_major", nil},
		{"gres device is a regular file", func(n *node) { n.mknod("/dev/nvidia1", 195, 1); n.remove("/dev/nvidia1"); n.write("/dev/nvidia1", "") },
			"gres", Fail, "not a character device", "File=", nil},
		{"gres device missing", func(n *node) { n.mknod("/dev/nvidia1", 195, 1); n.remove("/dev/nvidia1") },
			"gres", Warn, "/dev/nvidia1 does not exist", "nvidia-modprobe", nil},
		{"gres lists nvidiactl", func(n *node) {
			n.write("/etc/slurm/gres.conf", "NodeName=gpu1 Name=gpu File=/dev/nvidia0,/dev/nvidiactl\n")
			n.mknod("/dev/nvidiactl", 195, 255)
		}, "gres", Fail, "minor 255, above the GPU range", "nvidiactl", nil},
		{"gres: two files, one GPU", func(n *node) {
			n.write("/etc/slurm/gres.conf", "NodeName=gpu1 Name=gpu File=/dev/nvidia0,/dev/gpu-a\n")
			n.mknod("/dev/gpu-a", 195, 0)
		}, "gres", Fail, "the agent refuses this GPU table", "Fix gres.conf", nil},
		{"gres MIG slice", func(n *node) {
			n.write("/etc/slurm/gres.conf", "NodeName=gpu1 Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21\nNodeName=gpu1 Name=gpu File=/dev/nvidia1\n")
			n.mknod("/dev/nvidia-caps/nvidia-cap21", 511, 21)
			n.env.Inventory = func() ([]inventory.GPU, error) {
				return []inventory.GPU{
					{Index: 0, Minor: 0, UUID: "GPU-aaaa", MIGEnabled: true, MIG: []inventory.MIGDevice{{UUID: "MIG-a", GI: 1, CI: 0, GICapMinor: 21, CICapMinor: 22}}},
					{Index: 1, Minor: 1, UUID: "GPU-bbbb"},
				}, nil
			}
		}, "gres", OK, "2 GPU(s) (1 MIG slices)", "", nil},
		{"gres MIG slice with the MIG config capability", func(n *node) {
			n.write("/etc/slurm/gres.conf", "NodeName=gpu1 Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap1\n")
			n.mknod("/dev/nvidia-caps/nvidia-cap1", 511, 1)
		}, "gres", Fail, "MIG config capability", "Fix gres.conf", nil},
		{"gres caps device with the wrong minor", func(n *node) {
			n.write("/etc/slurm/gres.conf", "NodeName=gpu1 Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21\n")
			n.mknod("/dev/nvidia-caps/nvidia-cap21", 511, 22)
		}, "gres", Fail, "nvidia-cap21 has minor 22 but its name says 21", "mknod /dev/nvidia-caps/nvidia-cap21 c 511 21", nil},
		{"gres without this node", func(n *node) { n.write("/etc/slurm/gres.conf", "NodeName=gpu2 Name=gpu File=/dev/nvidia[0-1]\n") },
			"gres", Info, "no GPU with File=", "", nil},
		{"gres autodetect only", func(n *node) { n.write("/etc/slurm/gres.conf", "AutoDetect=nvml\nNodeName=gpu1 Name=gpu Count=2\n") },
			"gres", Warn, "AutoDetect=nvml", "File=", nil},
		{"node not in slurm.conf", func(n *node) { n.env.Config.NodeName = "gpu9" },
			"slurm-conf", Warn, "node_name gpu9 is not among", "node_name", []string{"gres", "slurm-layout"}},
		{"slurm.conf missing", func(n *node) {
			n.remove("/etc/slurm/slurm.conf")
			n.write("/opt/slurm/etc/slurm.conf", slurmConf)
		}, "slurm-conf", Fail, "cannot read slurm.conf /etc/slurm/slurm.conf", "slurm_conf: /opt/slurm/etc/slurm.conf", []string{"slurm-cgroup", "slurm-layout", "gres"}},
		{"audit file world-readable", func(n *node) { os.Chmod(n.path("/var/log/gpufence/audit.jsonl"), 0o644) },
			"audit", Fail, "readable or writable by everyone", "chmod 0640", nil},
		{"OCSF file world-readable", func(n *node) {
			n.env.Config.Audit.OCSFFile = "/var/log/gpufence/audit.ocsf.jsonl"
			n.write("/var/log/gpufence/audit.ocsf.jsonl", "")
			os.Chmod(n.path("/var/log/gpufence/audit.ocsf.jsonl"), 0o644)
		}, "audit", Fail, "audit.ocsf.jsonl is readable or writable by everyone", "chmod 0640 /var/log/gpufence/audit.ocsf.jsonl", nil},
		{"OCSF file not yet, audit file world-readable", func(n *node) {
			n.env.Config.Audit.OCSFFile = "/var/log/gpufence/audit.ocsf.jsonl"
			os.Chmod(n.path("/var/log/gpufence/audit.jsonl"), 0o644)
		}, "audit", Fail, "audit.jsonl is readable or writable by everyone", "chmod 0640 /var/log/gpufence/audit.jsonl", nil},
		{"OCSF file a symbolic link", func(n *node) {
			n.env.Config.Audit.OCSFFile = "/var/log/gpufence/audit.ocsf.jsonl"
			os.Symlink("/etc/passwd", n.path("/var/log/gpufence/audit.ocsf.jsonl"))
		}, "audit", Fail, "audit.ocsf.jsonl is not a regular file", "must be a regular file", nil},
		{"audit folder world-writable", func(n *node) { os.Chmod(n.path("/var/log/gpufence"), 0o777) },
			"audit", Fail, "writable by everyone", "chmod 0750", nil},
		{"audit folder missing, agent down", func(n *node) { n.remove("/var/log/gpufence"); n.stopAgent(true) },
			"audit", Info, "the agent creates it", "", []string{"agent-socket"}},
		{"journald on without journald", func(n *node) { n.env.Config.Audit.Journald = "on" },
			"audit", Fail, "audit.journald is on", "audit.journald: auto", nil},
		{"no audit sink", func(n *node) { n.env.Config.Audit.File = ""; n.env.Config.Audit.Journald = "off" },
			"audit", Warn, "no audit sink", "audit.file", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			tc.breakIt(n)
			r := n.run()
			c := find(t, r, tc.id)
			if c.Verdict != tc.verdict || !strings.Contains(c.Summary, tc.summary) || !strings.Contains(c.Fix, tc.fix) {
				t.Errorf("%s: got %s %q (fix %q), want %s containing %q (fix containing %q)\n%s",
					tc.id, c.Verdict, c.Summary, c.Fix, tc.verdict, tc.summary, tc.fix, dump(r))
			}
			if (tc.verdict == Warn || tc.verdict == Fail) && c.Fix == "" {
				t.Errorf("%s: %s without a fix", tc.id, tc.verdict)
			}
			for _, o := range r.Checks {
				if o.ID == tc.id || slices.Contains(tc.others, o.ID) || o.Verdict == OK ||
					(o.ID == "gres" && o.Verdict == Info && os.Geteuid() != 0) ||
					// nvml compares with the gres table: it follows a broken one.
					(o.ID == "nvml" && find(t, r, "gres").Verdict != OK) {
					continue
				}
				t.Errorf("%s is %s too: %s", o.ID, o.Verdict, o.Summary)
			}
			anyFail := slices.ContainsFunc(r.Checks, func(c Check) bool { return c.Verdict == Fail })
			if r.OK == anyFail {
				t.Errorf("report ok=%v, a check failed: %v", r.OK, anyFail)
			}
		})
	}
}

func TestPluginVersion(t *testing.T) {
	so := buildPlugin(t, 0x160508)
	n, err := PluginVersion(so)
	if err != nil {
		t.Fatal(err)
	}
	if v := FromVersionNumber(n); n != 0x160508 || v.Release() != "22.05" || v.String() != "22.05.8" {
		t.Fatalf("plugin_version 0x%x = %s, want 0x160508 = 22.05.8", n, v)
	}
	if _, err := PluginVersion("/proc/self/status"); err == nil {
		t.Fatal("a text file has a plugin_version")
	}
	// A shared object without the symbol is not a Slurm plugin.
	if libc, err := filepath.Glob("/usr/lib/x86_64-linux-gnu/libc.so.6"); err == nil && len(libc) == 1 {
		if _, err := PluginVersion(libc[0]); err == nil || !strings.Contains(err.Error(), "no plugin_version") {
			t.Fatalf("libc: %v", err)
		}
	}
}

func TestParseSlurmVersion(t *testing.T) {
	for in, want := range map[string]string{
		"slurm 24.11.1\n":      "24.11",
		"slurm-wlm 22.05.8\n":  "22.05",
		"slurm 25.05.0-0rc1\n": "25.05",
		"slurm 23.02":          "23.02",
	} {
		v, err := ParseSlurmVersion(in)
		if err != nil || v.Release() != want {
			t.Errorf("%q: %v %v, want %s", in, v.Release(), err, want)
		}
	}
	if _, err := ParseSlurmVersion("slurmd: error: no config\n"); err == nil {
		t.Error("no version parsed from an error message")
	}
}

func TestMountOf(t *testing.T) {
	ms, err := readMountinfo(writeTemp(t, mountsHyb+mountBPF+"50 23 0:40 / /sys/fs/bpf rw - tmpfs over\\040bpf rw\n"))
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{
		"/sys/fs/cgroup/unified/system.slice": "cgroup2",
		"/sys/fs/cgroup/unifiedx":             "tmpfs",
		"/sys/fs/bpf/gpufence":                "tmpfs", // the later mount hides bpffs
		"/var/log":                            "ext4",
	} {
		if m, _ := mountOf(ms, p); m.FSType != want {
			t.Errorf("%s: on %s, want %s", p, m.FSType, want)
		}
	}
	if m, _ := mountOf(ms, "/sys/fs/bpf"); m.Source != "over bpf" {
		t.Errorf("source %q not unescaped", m.Source)
	}
}

func writeTemp(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParsePlugArgs(t *testing.T) {
	// golib= (older versions' Go library) is ignored, as the plugin does.
	good := []string{"socket=/run/x.sock", "timeout=5", "golib=relative", "failure=open", "spool=/var/s"}
	o, err := parsePlugArgs(good)
	if err != nil || o.Socket != "/run/x.sock" || o.Failure != "open" || o.Spool != "/var/s" {
		t.Fatalf("%+v %v", o, err)
	}
	for _, bad := range [][]string{{"socket=run/x"}, {"failure=maybe"}, {"timeout=1", "timeout=2"}, {"verbose"}, {"sock=/x"}, {"golib"}} {
		if _, err := parsePlugArgs(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestEscalate: the worst finding is the summary with its fix, and nothing
// found is lost from the detail.
func TestEscalate(t *testing.T) {
	c := newCheck("x", "x")
	c.ok("fine")
	c.warn("fix the warning", "a warning")
	c.info("a note")
	c.fail("fix the failure", "a failure")
	c.warn("fix another warning", "another warning")
	c.fail("fix the failure", "a second failure")
	if c.Verdict != Fail || c.Summary != "a failure" || c.Fix != "fix the failure" {
		t.Fatalf("got %s %q fix %q", c.Verdict, c.Summary, c.Fix)
	}
	want := []string{"warn: a warning", "  fix: fix the warning", "fine", "a note", "warn: another warning", "  fix: fix another warning", "also fail: a second failure"}
	if !slices.Equal(c.Detail, want) {
		t.Fatalf("detail\n%q\nwant\n%q", c.Detail, want)
	}
}

// TestParallelClusterLayout: Slurm in /opt/slurm (slurmd in its sbin, the
// configuration in its etc, plugstack lines from an absolute include glob).
func TestParallelClusterLayout(t *testing.T) {
	n := newNode(t)
	n.remove("/etc/slurm")
	n.remove("/usr/sbin/slurmd")
	n.writeMode("/opt/slurm/sbin/slurmd", "#!/bin/sh\necho 'slurm 24.11.5'\n", 0o755)
	n.write("/opt/slurm/etc/slurm.conf", slurmConf)
	n.write("/opt/slurm/etc/cgroup.conf", "CgroupMountpoint=/sys/fs/cgroup\n") // autodetect on pure v2
	if os.Geteuid() == 0 {
		n.write("/opt/slurm/etc/gres.conf", gresConf)
	} else {
		n.write("/opt/slurm/etc/gres.conf", "NodeName=gpu2 Name=gpu File=/dev/nvidia[0-1]\n") // as in newNode
	}
	n.write("/opt/slurm/etc/plugstack.conf", "include /opt/slurm/etc/plugstack.conf.d/*\n")
	n.write("/opt/slurm/etc/plugstack.conf.d/pyxis.conf", "required /usr/local/lib/slurm/spank_pyxis.so\n")
	n.write("/opt/slurm/etc/plugstack.conf.d/gpufence.conf", "required /usr/lib/gpufence/spank_gpufence.so\n")
	n.env.Config.SlurmConf = "/opt/slurm/etc/slurm.conf"
	r := n.run()
	for _, c := range r.Checks {
		if c.Verdict != OK && !((c.ID == "gres" && c.Verdict == Info || c.ID == "nvml" && c.Verdict == Skip) && os.Geteuid() != 0) {
			t.Errorf("%s: %s: %s", c.ID, c.Verdict, c.Summary)
		}
	}
	if v := find(t, r, "slurm-plugin"); !strings.Contains(strings.Join(v.Detail, " "), "/opt/slurm/sbin/slurmd -V: slurm 24.11.5") {
		t.Errorf("slurm-plugin did not run /opt/slurm/sbin/slurmd: %q", v.Detail)
	}
	if t.Failed() {
		t.Fatal(dump(r))
	}
	n.remove("/opt/slurm/etc/plugstack.conf.d/gpufence.conf")
	c := find(t, n.run(), "plugstack")
	if c.Verdict != Fail || !strings.Contains(c.Fix, "to /opt/slurm/etc/plugstack.conf.d/gpufence.conf") {
		t.Errorf("without the line: %s %q fix %q", c.Verdict, c.Summary, c.Fix)
	}
}

// TestNVML: the gres.conf table against what the driver reports, as the
// agent checks it at start.
func TestNVML(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the fixture's GPU device nodes are made with mknod")
	}
	gpu := func(i int, minor uint32) inventory.GPU {
		return inventory.GPU{Index: i, Minor: minor, UUID: fmt.Sprintf("GPU-%d", i), PCIBusID: "00000000:18:00.0", Name: "NVIDIA H100"}
	}
	for _, tc := range []struct {
		name    string
		nvml    string
		inv     func() ([]inventory.GPU, error)
		verdict Verdict
		summary string
	}{
		{"driver agrees", config.NVMLAuto, func() ([]inventory.GPU, error) { return []inventory.GPU{gpu(0, 0), gpu(1, 1)}, nil }, OK, "the 2 GPU(s) of gres.conf are the ones the driver reports"},
		{"driver has a third GPU", config.NVMLAuto, func() ([]inventory.GPU, error) { return []inventory.GPU{gpu(0, 0), gpu(1, 1), gpu(2, 2)}, nil }, Fail, "gives no GPU to any step"},
		{"gres.conf names a GPU the driver lacks", config.NVMLAuto, func() ([]inventory.GPU, error) { return []inventory.GPU{gpu(0, 0), gpu(1, 5)}, nil }, Fail, "no GPU with minor 1"},
		{"no driver, auto", config.NVMLAuto, func() ([]inventory.GPU, error) { return nil, fmt.Errorf("NVML init: %w", inventory.ErrNoDriver) }, Info, "uses gres.conf alone"},
		{"no driver, required", config.NVMLRequired, func() ([]inventory.GPU, error) { return nil, fmt.Errorf("NVML init: %w", inventory.ErrNoDriver) }, Fail, "nvml: required"},
		{"driver broken", config.NVMLAuto, func() ([]inventory.GPU, error) { return nil, errors.New("ERROR_UNKNOWN") }, Fail, "listing the GPUs failed"},
		{"nvml off", config.NVMLOff, nil, Info, "nvml: off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.env.Config.NVML = tc.nvml
			n.env.Inventory = tc.inv
			c := find(t, n.run(), "nvml")
			if c.Verdict != tc.verdict || !strings.Contains(c.Summary, tc.summary) {
				t.Errorf("nvml: %s %q, want %s with %q", c.Verdict, c.Summary, tc.verdict, tc.summary)
			}
			if (c.Verdict == Fail) != (c.Fix != "") {
				t.Errorf("fail verdict and fix disagree: %s, fix %q", c.Verdict, c.Fix)
			}
		})
	}
}

// TestLayout: the slurm-layout check knows each release's cgroup layout:
// the scope's name and slice (CgroupSlice, 25.11), job cgroups by SLUID
// (26.05 unless CgroupJobIdPaths=yes, 26.05.2), and the cgroup.conf keys a
// release refuses or dropped.
func TestLayout(t *testing.T) {
	const cg = "/sys/fs/cgroup"
	for _, tc := range []struct {
		name    string
		slurmd  string
		cgroup  string   // cgroup.conf
		scopes  []string // scope dirs made, below /sys/fs/cgroup
		scope   string   // configured scope
		verdict Verdict
		summary string
		detail  string // a substring of the detail
	}{
		{"Debian 22.05", "slurm-wlm 22.05.8", "CgroupPlugin=cgroup/v2\nCgroupAutomount=no\n", []string{"system.slice/gpu1_slurmstepd.scope"}, "",
			OK, "layout of Slurm 22.05: scope /sys/fs/cgroup/system.slice/gpu1_slurmstepd.scope", "job cgroups are job_<id>"},
		{"23.11 keeps CgroupAutomount", "slurm 23.11.10", "CgroupPlugin=cgroup/v2\nCgroupAutomount=yes\n", []string{"system.slice/slurmstepd.scope"}, "",
			Warn, "CgroupAutomount, which Slurm 23.11 removed", ""},
		{"24.05 with CgroupSlice", "slurm 24.05.8", "CgroupSlice=gpu.slice\n", []string{"system.slice/slurmstepd.scope"}, "",
			Fail, "CgroupSlice=gpu.slice, which Slurm 24.05 does not know", ""},
		{"25.11 from source", "slurm 25.11.7", "CgroupPlugin=cgroup/v2\n", []string{"system.slice/slurmstepd.scope"}, "",
			OK, "scope /sys/fs/cgroup/system.slice/slurmstepd.scope", "job cgroups are job_<id>"},
		{"25.11 CgroupSlice", "slurm 25.11.7", "CgroupSlice=gpu.slice\n", []string{"gpu.slice/slurmstepd.scope"}, "",
			OK, "scope /sys/fs/cgroup/gpu.slice/slurmstepd.scope", ""},
		{"25.11 CgroupSlice, old scope left", "slurm 25.11.7", "CgroupSlice=gpu.slice\n", []string{"system.slice/slurmstepd.scope"}, "",
			Warn, "a scope left from before CgroupSlice changed", ""},
		{"25.11 configured scope missing", "slurm 25.11.7", "", []string{"system.slice/slurmstepd.scope"}, "/sys/fs/cgroup/other/slurmstepd.scope",
			Fail, "the configured scope /sys/fs/cgroup/other/slurmstepd.scope does not exist", ""},
		{"25.11 configured scope elsewhere", "slurm 25.11.7", "", []string{"system.slice/slurmstepd.scope", "old.slice/slurmstepd.scope"}, "/sys/fs/cgroup/old.slice/slurmstepd.scope",
			Warn, "is not the one Slurm 25.11 uses here", ""},
		{"no scope yet", "slurm 25.11.7", "", nil, "", Info, "no slurmstepd scope yet", "or /sys/fs/cgroup/system.slice/slurmstepd.scope"},
		{"planted scope in a user's subtree", "slurm 25.11.7", "", []string{"system.slice/slurmstepd.scope", "user.slice/user-1000.slice/user@1000.service/gpu1_slurmstepd.scope"}, "",
			Warn, "1 cgroup(s) named like Slurm's scope that are not Slurm's: /sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/gpu1_slurmstepd.scope", "inside user.slice, a user's own cgroup subtree"},
		{"planted scope only", "slurm 25.11.7", "", []string{"user.slice/user-1000.slice/user@1000.service/gpu1_slurmstepd.scope"}, "",
			Info, "no slurmstepd scope yet", "not where slurmd makes its scope"},
		{"two scopes: ambiguous", "slurm 25.11.7", "", []string{"system.slice/slurmstepd.scope", "system.slice/gpu1_slurmstepd.scope"}, "",
			Fail, "Slurm's scope is ambiguous", ""},
		{"25.05 ConstrainDevices", "slurm 25.05.8", "ConstrainDevices=yes\n", []string{"system.slice/slurmstepd.scope"}, "",
			OK, "layout of Slurm 25.05", "fails a step whose own device program cannot be attached"},
		{"26.05 SLUID", "slurm 26.05.5", "", []string{"system.slice/gpu1_slurmstepd.scope"}, "",
			OK, "job cgroups by SLUID", "named by the job's SLUID"},
		{"26.05 CgroupJobIdPaths", "slurm 26.05.5", "CgroupJobIdPaths=yes\n", []string{"system.slice/gpu1_slurmstepd.scope"}, "",
			OK, "layout of Slurm 26.05: scope /sys/fs/cgroup/system.slice/gpu1_slurmstepd.scope", "job_<id> (CgroupJobIdPaths=yes)"},
		{"26.05.1 CgroupJobIdPaths", "slurm 26.05.1", "CgroupJobIdPaths=yes\n", []string{"system.slice/gpu1_slurmstepd.scope"}, "",
			Fail, "CgroupJobIdPaths, which Slurm 26.05.1 does not know", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.remove(cg + "/system.slice")
			for _, s := range tc.scopes {
				n.write(cg+"/"+s+"/cgroup.procs", "")
				n.write(cg+"/"+s+"/slurmd/cgroup.procs", "")
			}
			n.slurmd(tc.slurmd)
			n.write("/etc/slurm/cgroup.conf", tc.cgroup)
			n.env.Config.Scope = tc.scope
			c := find(t, n.run(), "slurm-layout")
			if c.Verdict != tc.verdict || !strings.Contains(c.Summary, tc.summary) || !strings.Contains(strings.Join(c.Detail, "\n"), tc.detail) {
				t.Errorf("got %s %q\n%s\nwant %s %q with %q in the detail", c.Verdict, c.Summary, strings.Join(c.Detail, "\n"), tc.verdict, tc.summary, tc.detail)
			}
			if (c.Verdict == Warn || c.Verdict == Fail) && c.Fix == "" {
				t.Errorf("%s without a fix", c.Verdict)
			}
		})
	}
}
