// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"fmt"
	"strings"
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
	line("SlurmdSpoolDir=%s", p.path("state/d"))
	line("SlurmctldPidFile=%s", p.path("run/slurmctld.pid"))
	line("SlurmdPidFile=%s", p.path("run/slurmd.pid"))
	line("SlurmctldLogFile=%s", p.path("logs/slurmctld.log"))
	line("SlurmdLogFile=%s", p.path("logs/slurmd.log"))
	line("SlurmctldDebug=info")
	line("SlurmdDebug=debug")
	line("DebugFlags=Cgroup")
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
	line("SelectType=select/cons_tres")
	line("SelectTypeParameters=CR_Core")
	line("ReturnToService=2")
	// Short so that cancelling jobs at Stop does not wait the default 30 s.
	line("KillWait=%d", p.KillWaitSecs)
	line("GresTypes=gpu")
	gres := fmt.Sprintf("gpu:%d", p.GPUs)
	if p.MIG {
		// Typed as in gres.conf, or slurmd drops the types ("more configured
		// than expected") and typed requests find no node.
		gres = fmt.Sprintf("gpu:a100:1,gpu:%s:%d", MIGSlices[0].Profile, len(MIGSlices))
	}
	line("NodeName=%s NodeAddr=127.0.0.1 CPUs=%d Gres=%s State=UNKNOWN", p.Host, p.CPUs, gres)
	line("PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO", p.Host)
	for _, l := range p.ExtraSlurm {
		line("%s", l)
	}
	return b.String()
}

func renderGresConf(p confParams) string {
	if p.MIG {
		return renderMIGGresConf(p)
	}
	return fmt.Sprintf("Name=gpu File=%s/dev/nvidia[0-%d]\n", p.Root, p.GPUs-1)
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
	constrain := "no"
	if p.Constrain {
		constrain = "yes"
	}
	// CgroupAutomount=no: with automount and IgnoreSystemd slurmd would write
	// into the cgroup2 root's subtree_control, a cgroup that is not ours.
	return fmt.Sprintf(`CgroupPlugin=cgroup/v2
CgroupMountpoint=%s
IgnoreSystemd=yes
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainSwapSpace=no
ConstrainDevices=%s
`, p.CgroupMount, constrain)
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
