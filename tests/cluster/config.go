// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"fmt"
	"strings"

	"github.com/gpufence/gpufence/tests/slurmrel"
)

// confParams is everything the rendered Slurm config files depend on; it is
// kept apart from Start so the rendering can be tested without root.
type confParams struct {
	Root         string
	Host         string
	CPUs         int
	GPUs         int
	CtldPort     int
	SlurmdPort   int
	MungeSocket  string
	CgroupMount  string
	Constrain    bool
	MIG          bool
	ExtraSlurm   []string
	Plugstack    []string
	ClusterName  string
	SlurmUser    string
	KillWaitSecs int
	Release      string // major.minor of the Slurm that reads the files ("" = 22.05)
	Slice        string // CgroupSlice ("" = Slurm's default, system.slice)
	JobIDPaths   bool   // CgroupJobIdPaths=yes (26.05)
	PCluster     bool   // AWS ParallelCluster's way of writing the files
	Namespace    bool   // NamespaceType=namespace/linux (25.11) with etc/namespace.yaml
	FakeDriver   bool   // gres.conf AutoDetect=nvidia, Flags=env_uuid (SetFakeDriver)
	AutoDetect   bool   // gres.conf AutoDetect=nvml alone, fake_gpus.conf (SetAutoDetect)
	IMEXMajor    uint32 // SwitchType=switch/nvidia_imex with this imex_dev_major (SetIMEX); 0: off
	Shared       string // gres/shard or gres/mps next to gres/gpu (SetShared): "", "shard" or "mps"
	// Nodes are the slurmd of a multi-node cluster (multinode.go), each
	// with GPUs GPUs of its own; empty: one node named Host.
	Nodes []confNode
}

// confNode is one node of a multi-node cluster: its name (slurmd -N), its
// SlurmdPort and the device minor of its GPU 0.
type confNode struct {
	Name       string
	Port       int
	FirstMinor int
}

// atLeast reports whether the files are for Slurm v (major.minor) or newer.
func (p confParams) atLeast(v string) bool {
	r := p.Release
	if r == "" {
		r = slurmrel.Default
	}
	return slurmrel.Number(r) >= slurmrel.Number(v)
}

func (p confParams) path(rel string) string { return p.Root + "/" + rel }

func renderSlurmConf(p confParams) string {
	var b strings.Builder
	line := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	line("# Written by the gpufence test harness (tests/cluster); removed with the cluster.")
	line("ClusterName=%s", p.ClusterName)
	line("SlurmctldHost=%s(127.0.0.1)", p.Host)
	line("SlurmUser=%s", p.SlurmUser)
	line("SlurmdUser=root")
	line("AuthType=auth/munge")
	line("CredType=cred/munge")
	// Our own munged listens on its own socket so it never meets a system one.
	line("AuthInfo=socket=%s", p.MungeSocket)
	line("SlurmctldPort=%d", p.CtldPort)
	line("SlurmdPort=%d", p.SlurmdPort)
	line("StateSaveLocation=%s", p.path("state/ctld"))
	if len(p.Nodes) > 0 {
		// One slurmd per node on this host: %n is the node's name.
		line("SlurmdSpoolDir=%s", p.path("state/d/%n"))
	} else {
		line("SlurmdSpoolDir=%s", p.path("state/d"))
	}
	line("SlurmctldPidFile=%s", p.path("run/slurmctld.pid"))
	if len(p.Nodes) > 0 {
		line("SlurmdPidFile=%s", p.path("run/slurmd-%n.pid"))
	} else {
		line("SlurmdPidFile=%s", p.path("run/slurmd.pid"))
	}
	line("SlurmctldLogFile=%s", p.path("logs/slurmctld.log"))
	if len(p.Nodes) > 0 {
		line("SlurmdLogFile=%s", p.path("logs/slurmd-%n.log"))
	} else {
		line("SlurmdLogFile=%s", p.path("logs/slurmd.log"))
	}
	if p.IMEXMajor != 0 {
		// switch/nvidia_imex logs each channel it hands out at debug level
		// ("allocating channel N to JobId=J"): the channel a job should
		// open, from slurmctld, not from the job.
		line("SlurmctldDebug=debug")
		line("SlurmdDebug=debug")
		line("DebugFlags=Cgroup,Switch")
		line("SwitchType=switch/nvidia_imex")
		line("SwitchParameters=imex_dev_major=%d", p.IMEXMajor)
	} else {
		line("SlurmctldDebug=info")
		line("SlurmdDebug=debug")
		line("DebugFlags=Cgroup")
	}
	line("PlugStackConfig=%s", p.path("etc/plugstack.conf"))
	// Contain gives every job an extern step (pam_slurm_adopt-style tests).
	line("PrologFlags=Contain")
	line("ProctrackType=proctrack/cgroup")
	line("TaskPlugin=task/affinity,task/cgroup")
	line("JobAcctGatherType=jobacct_gather/none")
	line("AccountingStorageType=accounting_storage/none")
	line("JobCompType=jobcomp/none")
	line("MpiDefault=none")
	line("MailProg=/bin/true")
	line("SchedulerType=sched/backfill")
	if p.atLeast("23.02") && !p.atLeast("24.11") {
		// Without accounting, the main scheduler of 23.11 and 24.05 (built
		// from source; measured) finds every new job's association
		// invalid ("has invalid account") and leaves it to the backfill
		// scheduler, which runs every 30 s by default: run it every second.
		// 22.05, 24.11, 25.11 and 26.05 start jobs at once.
		line("SchedulerParameters=bf_interval=1")
	}
	line("SelectType=select/cons_tres")
	line("SelectTypeParameters=CR_Core")
	line("ReturnToService=2")
	// Short so that cancelling jobs at Stop does not wait the default 30 s.
	line("KillWait=%d", p.KillWaitSecs)
	if p.Shared != "" {
		line("GresTypes=gpu,%s", p.Shared)
	} else {
		line("GresTypes=gpu")
	}
	gres := fmt.Sprintf("gpu:%d", p.GPUs)
	if p.FakeDriver {
		gres = fmt.Sprintf("gpu:%s:%d", fakeType, p.GPUs)
	}
	if p.PCluster {
		// ParallelCluster types the GPUs by their model.
		gres = fmt.Sprintf("gpu:%s:%d", PClusterGPUType, p.GPUs)
	}
	if p.MIG {
		// Typed as in gres.conf, or slurmd drops the types ("more configured
		// than expected") and typed requests find no node.
		gres = fmt.Sprintf("gpu:a100:1,gpu:%s:%d", MIGSlices[0].Profile, len(MIGSlices))
	}
	if p.AutoDetect {
		// Untyped, as in the recorded autodetect-links layout: slurmd
		// drops fake_gpus.conf's type.
		gres = fmt.Sprintf("gpu:%d", p.GPUs)
	}
	oversubscribe := "NO"
	if p.Shared != "" {
		gres += fmt.Sprintf(",%s:%d", p.Shared, p.GPUs*sharedPerGPU(p.Shared))
		// The load case runs more shard jobs at once than this machine
		// has cores: each core goes to up to sharedJobsPerCPU jobs (FORCE
		// needs no --oversubscribe); GPUs and shards are still counted.
		oversubscribe = fmt.Sprintf("FORCE:%d", sharedJobsPerCPU)
		// What slurmd gives the job prolog for a shared GPU, for the
		// tests to compare with what the SPANK plugin's job_prolog sees.
		line("Prolog=%s", p.path(PrologEnvScript))
	}
	if len(p.Nodes) > 0 {
		// Several slurmd on this host (multiple-slurmd): each its own
		// NodeName and port, all at this host's address.
		var names []string
		for _, n := range p.Nodes {
			line("NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%d CPUs=%d Gres=%s State=UNKNOWN", n.Name, p.Host, n.Port, p.CPUs, gres)
			names = append(names, n.Name)
		}
		line("PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=%s", strings.Join(names, ","), oversubscribe)
	} else {
		line("NodeName=%s NodeAddr=127.0.0.1 CPUs=%d Gres=%s State=UNKNOWN", p.Host, p.CPUs, gres)
		line("PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=%s", p.Host, oversubscribe)
	}
	if p.Namespace {
		// namespace/linux (Slurm 25.11) reads namespace.yaml beside slurm.conf.
		line("NamespaceType=namespace/linux")
	}
	for _, l := range p.ExtraSlurm {
		line("%s", l)
	}
	return b.String()
}

func renderGresConf(p confParams) string {
	if p.AutoDetect {
		return renderAutoDetectGres()
	}
	if p.FakeDriver {
		// The devices AutoDetect finds, as it names them, with their UUIDs
		// in CUDA_VISIBLE_DEVICES (Slurm 26.05).
		return fmt.Sprintf("AutoDetect=nvidia\nName=gpu Type=%s File=/dev/nvidia[0-%d] Flags=env_uuid\n", fakeType, p.GPUs-1)
	}
	if p.MIG {
		return renderMIGGresConf(p)
	}
	if p.PCluster {
		// As ParallelCluster writes it: gres.conf includes the file its
		// node daemon generates.
		return fmt.Sprintf("# Written by the gpufence test harness as AWS ParallelCluster writes it.\ninclude %s\n", p.path("etc/"+pclusterGresFile))
	}
	if len(p.Nodes) > 0 {
		return renderNodesGres(p, "")
	}
	gpu := fmt.Sprintf("Name=gpu File=%s/dev/nvidia[0-%d]\n", p.Root, p.GPUs-1)
	if p.Shared == "" {
		return gpu
	}
	// One record per GPU, as gres.conf(5) asks for shard and mps, so that
	// each GPU's count is its own and slurmctld's per-GPU detail lists
	// them in GPU order.
	var b strings.Builder
	b.WriteString(gpu)
	for i := 0; i < p.GPUs; i++ {
		fmt.Fprintf(&b, "Name=%s Count=%d File=%s/dev/nvidia%d\n", p.Shared, sharedPerGPU(p.Shared), p.Root, i)
	}
	return b.String()
}

// sharedPerGPU is how many gres/shard (10, enough for the load case's 40
// one-shard jobs on 4 GPUs) or gres/mps (100, a percentage) each GPU has
// in the shared layouts (SetShared).
func sharedPerGPU(kind string) int {
	if kind == "mps" {
		return 100
	}
	return 10
}

// SharedPerGPU is sharedPerGPU for the tests.
func SharedPerGPU(kind string) int { return sharedPerGPU(kind) }

// PrologEnvScript is the Prolog= of the shared layouts, relative to Root:
// it writes the prolog's environment to work/prolog.<job id>.env.
const PrologEnvScript = "etc/prolog-env.sh"

// sharedJobsPerCPU is the partition's OverSubscribe=FORCE count in the
// shared layouts: 2 cores here take 40 jobs.
const sharedJobsPerCPU = 24

// PClusterGPUType is the GPU type of the ParallelCluster layout's gres.conf
// (ParallelCluster names the model, e.g. a10g on g5 instances).
const PClusterGPUType = "a10g"

// pclusterGresFile is the file ParallelCluster generates with the node's
// GPUs, which its gres.conf includes.
const pclusterGresFile = "pcluster/slurm_parallelcluster_gres.conf"

// renderPClusterGres is ParallelCluster's generated line for the node:
// NodeName=, Name=gpu, Type=, File=/dev/nvidia[0-N].
func renderPClusterGres(p confParams) string {
	if len(p.Nodes) > 0 {
		return renderNodesGres(p, " Type="+PClusterGPUType)
	}
	gpu := fmt.Sprintf("NodeName=%s Name=gpu Type=%s File=%s/dev/nvidia[0-%d]\n", p.Host, PClusterGPUType, p.Root, p.GPUs-1)
	if p.Shared == "" {
		return gpu
	}
	// ParallelCluster writes no shares; an administrator adding them
	// would write them beside its lines, per GPU.
	var b strings.Builder
	b.WriteString(gpu)
	for i := 0; i < p.GPUs; i++ {
		fmt.Fprintf(&b, "NodeName=%s Name=%s Count=%d File=%s/dev/nvidia%d\n", p.Host, p.Shared, sharedPerGPU(p.Shared), p.Root, i)
	}
	return b.String()
}

// MIGSlice is one MIG slice of the MIG layout: its gres index, the fake GPU
// it is part of, and the minors of its GPU instance and compute instance
// access capabilities, numbered as the driver numbers them for that GPU
// (/proc/driver/nvidia-caps/mig-minors: gpu1/gi0/access is 138).
type MIGSlice struct {
	Index   int
	GPU     int
	Caps    []uint32
	Profile string
}

// MIGSlices are the slices of the MIG layout: GPU 1 split into three 1g.10gb
// slices (GPU instances 0, 1, 2 with one compute instance each). Index 0 is
// GPU 0 whole; GPUs 2 and 3 are not in gres.conf then.
var MIGSlices = []MIGSlice{
	{Index: 1, GPU: 1, Caps: []uint32{138, 139}, Profile: "1g.10gb"},
	{Index: 2, GPU: 1, Caps: []uint32{147, 148}, Profile: "1g.10gb"},
	{Index: 3, GPU: 1, Caps: []uint32{156, 157}, Profile: "1g.10gb"},
}

// MIGAdminCaps are the MIG config (create and destroy instances) and
// monitor capabilities, which no job gets.
var MIGAdminCaps = []uint32{1, 2}

// migGPUs is the number of gres records of the MIG layout: the default
// GPU count, so that the fake devices and Gres counts of both layouts agree.
const migGPUs = 4

// renderMIGGresConf writes the MIG layout: one whole GPU, then one
// MultipleFiles= record per slice (Slurm >= 21.08), its parent GPU first,
// as AutoDetect=nvml would list it.
func renderMIGGresConf(p confParams) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Name=gpu Type=a100 File=%s/dev/nvidia0\n", p.Root)
	for _, s := range MIGSlices {
		files := []string{fmt.Sprintf("%s/dev/nvidia%d", p.Root, s.GPU)}
		for _, c := range s.Caps {
			files = append(files, p.Root+"/dev/"+capsNodeName(c))
		}
		fmt.Fprintf(&b, "Name=gpu Type=%s MultipleFiles=%s\n", s.Profile, strings.Join(files, ","))
	}
	return b.String()
}

func capsNodeName(minor uint32) string { return fmt.Sprintf("nvidia-caps/nvidia-cap%d", minor) }

func renderCgroupConf(p confParams) string {
	var b strings.Builder
	line := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	line("CgroupPlugin=cgroup/v2")
	line("CgroupMountpoint=%s", p.CgroupMount)
	line("IgnoreSystemd=yes")
	if !p.atLeast("23.11") {
		// With automount and IgnoreSystemd, slurmd would write into the
		// cgroup2 root's subtree_control, a cgroup that is not ours.
		// Slurm 23.11 removed the option (and refuses it).
		line("CgroupAutomount=no")
	}
	if p.Slice != "" {
		line("CgroupSlice=%s", p.Slice)
	}
	if p.JobIDPaths {
		line("CgroupJobIdPaths=yes")
	}
	line("ConstrainCores=no")
	line("ConstrainRAMSpace=no")
	line("ConstrainSwapSpace=no")
	// ParallelCluster leaves ConstrainDevices out (Slurm's default: no).
	if p.Constrain || !p.PCluster {
		line("ConstrainDevices=%s", map[bool]string{true: "yes", false: "no"}[p.Constrain])
	}
	return b.String()
}

// renderPlugstackFiles are the plugstack files: plugstack.conf with the
// lines, or in the ParallelCluster layout plugstack.conf including
// plugstack.conf.d/* (as ParallelCluster's head node has it) and the lines
// in plugstack.conf.d/gpufence.conf.
func renderPlugstackFiles(p confParams) map[string]string {
	if !p.PCluster {
		return map[string]string{"etc/plugstack.conf": renderPlugstack(p.Plugstack)}
	}
	return map[string]string{
		"etc/plugstack.conf":                 "include " + p.path("etc/plugstack.conf.d/*") + "\n",
		"etc/plugstack.conf.d/gpufence.conf": renderPlugstack(p.Plugstack),
	}
}

func renderPlugstack(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}

// fakeDevice is one device node the harness creates under <Root>/dev.
type fakeDevice struct {
	Name         string
	Major, Minor uint32
}

// fakeDevices lists the nodes that stand in for an NVIDIA driver's: the
// GPUs, then the control and UVM nodes every CUDA process opens.
func fakeDevices(gpus int) []fakeDevice {
	var d []fakeDevice
	for i := 0; i < gpus; i++ {
		d = append(d, fakeDevice{fmt.Sprintf("nvidia%d", i), 195, uint32(i)})
	}
	return append(d,
		fakeDevice{"nvidiactl", 195, 255},
		fakeDevice{"nvidia-modeset", 195, 254},
		fakeDevice{"nvidia-uvm", 240, 0},
		fakeDevice{"nvidia-uvm-tools", 240, 1},
	)
}

// fakeCapsDevices are the MIG capability nodes of the MIG layout, of the
// fake nvidia-caps major: every slice's, and the config and monitor ones.
func fakeCapsDevices(major uint32) []fakeDevice {
	var d []fakeDevice
	for _, m := range MIGAdminCaps {
		d = append(d, fakeDevice{capsNodeName(m), major, m})
	}
	for _, s := range MIGSlices {
		for _, m := range s.Caps {
			d = append(d, fakeDevice{capsNodeName(m), major, m})
		}
	}
	return d
}

// pickCapsMajor returns a char major no driver registered in /proc/devices
// (the kernel gives nvidia-caps a dynamic one from the same range), besides
// 195 and the fake nvidia-uvm's 240.
func pickCapsMajor(procDevices string) (uint32, error) {
	used := map[uint32]bool{195: true, 240: true}
	inChar := false
	for _, l := range strings.Split(procDevices, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "Character devices:":
			inChar = true
		case strings.HasSuffix(l, "devices:"):
			inChar = false
		case inChar && l != "":
			var n uint32
			if _, err := fmt.Sscan(l, &n); err == nil {
				used[n] = true
			}
		}
	}
	for m := uint32(239); m >= 230; m-- {
		if !used[m] {
			return m, nil
		}
	}
	return 0, fmt.Errorf("no unused char major in 230-239 for the fake nvidia-caps nodes")
}

// isHybrid reports whether a /proc/self/cgroup text has cgroup v1 lines next
// to the unified `0::` one; Slurm 22.05's cgroup/v2 plugin refuses that.
func isHybrid(procSelfCgroup string) bool {
	for _, l := range strings.Split(strings.TrimSpace(procSelfCgroup), "\n") {
		if l != "" && !strings.HasPrefix(l, "0::") {
			return true
		}
	}
	return false
}

// cgroup2Mount finds the cgroup2 mount point in a /proc/self/mountinfo text.
func cgroup2Mount(mountinfo string) (string, error) {
	for _, l := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if !ok {
			continue
		}
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if len(f) >= 5 && len(g) >= 1 && g[0] == "cgroup2" {
			return f[4], nil
		}
	}
	return "", fmt.Errorf("no cgroup2 mount in /proc/self/mountinfo")
}
