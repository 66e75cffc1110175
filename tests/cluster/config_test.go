// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func testParams() confParams {
	return confParams{
		Root: "/var/tmp/r", Host: "node1", CPUs: 2, GPUs: 4, CtldPort: 7001, SlurmdPort: 7002,
		MungeSocket: "/var/tmp/r/run/munge/munge.socket", CgroupMount: "/sys/fs/cgroup/unified",
		ClusterName: "gpufence", SlurmUser: "slurm", KillWaitSecs: 5,
		ExtraSlurm: []string{"MinJobAge=10"},
	}
}

func TestRenderSlurmConf(t *testing.T) {
	got := renderSlurmConf(testParams())
	for _, want := range []string{
		"SlurmctldHost=node1(127.0.0.1)\n",
		"AuthInfo=socket=/var/tmp/r/run/munge/munge.socket\n",
		"SlurmctldPort=7001\n",
		"SlurmdPort=7002\n",
		"StateSaveLocation=/var/tmp/r/state/ctld\n",
		"SlurmdLogFile=/var/tmp/r/logs/slurmd.log\n",
		"PlugStackConfig=/var/tmp/r/etc/plugstack.conf\n",
		"PrologFlags=Contain\n",
		"ProctrackType=proctrack/cgroup\n",
		"TaskPlugin=task/affinity,task/cgroup\n",
		"SelectType=select/cons_tres\n",
		"GresTypes=gpu\n",
		"NodeName=node1 NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:4 State=UNKNOWN\n",
		"PartitionName=debug Nodes=node1 Default=YES",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("slurm.conf lacks %q:\n%s", want, got)
		}
	}
	if !strings.HasSuffix(got, "MinJobAge=10\n") {
		t.Errorf("extra lines not appended last:\n%s", got)
	}
	if strings.Contains(got, "$ROOT") || strings.Contains(got, "%!") {
		t.Errorf("unrendered placeholder:\n%s", got)
	}
}

func TestRenderGresConf(t *testing.T) {
	for _, tc := range []struct {
		gpus int
		want string
	}{
		{1, "Name=gpu File=/var/tmp/r/dev/nvidia[0-0]\n"},
		{4, "Name=gpu File=/var/tmp/r/dev/nvidia[0-3]\n"},
		{8, "Name=gpu File=/var/tmp/r/dev/nvidia[0-7]\n"},
	} {
		p := testParams()
		p.GPUs = tc.gpus
		if got := renderGresConf(p); got != tc.want {
			t.Errorf("GPUs=%d: %q, want %q", tc.gpus, got, tc.want)
		}
	}
}

func TestRenderCgroupConf(t *testing.T) {
	for _, constrain := range []bool{false, true} {
		p := testParams()
		p.Constrain = constrain
		got := renderCgroupConf(p)
		want := "ConstrainDevices=no\n"
		if constrain {
			want = "ConstrainDevices=yes\n"
		}
		for _, w := range []string{want, "CgroupPlugin=cgroup/v2\n", "CgroupMountpoint=/sys/fs/cgroup/unified\n",
			"IgnoreSystemd=yes\n", "CgroupAutomount=no\n"} {
			if !strings.Contains(got, w) {
				t.Errorf("constrain=%v: cgroup.conf lacks %q:\n%s", constrain, w, got)
			}
		}
	}
}

func TestRenderPlugstack(t *testing.T) {
	if got := renderPlugstack(nil); got != "" {
		t.Errorf("empty plugstack: %q", got)
	}
	if got := renderPlugstack([]string{"required /a.so x=1", "optional /b.so"}); got != "required /a.so x=1\noptional /b.so\n" {
		t.Errorf("plugstack: %q", got)
	}
}

func TestFakeDevices(t *testing.T) {
	got := fakeDevices(2)
	want := []fakeDevice{
		{"nvidia0", 195, 0}, {"nvidia1", 195, 1}, {"nvidiactl", 195, 255},
		{"nvidia-modeset", 195, 254}, {"nvidia-uvm", 240, 0}, {"nvidia-uvm-tools", 240, 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fakeDevices(2) = %v, want %v", got, want)
	}
}

func TestIsHybrid(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"0::/\n", false},
		{"0::/user.slice/session-1.scope\n", false},
		{"9:name=systemd:/\n8:pids:/\n0::/\n", true},
		{"1:name=systemd:/\n", true},
	} {
		if got := isHybrid(tc.in); got != tc.want {
			t.Errorf("isHybrid(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestCgroup2Mount(t *testing.T) {
	hybrid := `25 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 31 0:28 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
`
	pure := "35 25 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
	optional := "35 25 0:30 / /sys/fs/cgroup rw shared:9 master:2 - cgroup2 cgroup2 rw\n"
	for _, tc := range []struct{ in, want string }{
		{hybrid, "/sys/fs/cgroup/unified"}, {pure, "/sys/fs/cgroup"}, {optional, "/sys/fs/cgroup"},
	} {
		got, err := cgroup2Mount(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("cgroup2Mount = %q, %v; want %q", got, err, tc.want)
		}
	}
	if _, err := cgroup2Mount("33 31 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"); err == nil {
		t.Error("no cgroup2 mount: want an error")
	}
}

func TestSortDeepestFirst(t *testing.T) {
	in := []string{"/s/job_1", "/s/slurmd", "/s/job_1/step_0/user/task_0", "/s/job_1/step_0", "/s/job_1/step_0/user"}
	sortDeepestFirst(in)
	want := []string{"/s/job_1/step_0/user/task_0", "/s/job_1/step_0/user", "/s/job_1/step_0", "/s/job_1", "/s/slurmd"}
	if !reflect.DeepEqual(in, want) {
		t.Errorf("got %v, want %v", in, want)
	}
}

func TestParseOpen(t *testing.T) {
	out := `env CUDA_VISIBLE_DEVICES=0
env SLURM_JOB_GPUS (unset)
env SLURM_STEP_GPUS=2
cgroup 0::/system.slice/vm_slurmstepd.scope/job_3/step_0/user/task_special
/r/dev/nvidia0 ENXIO
/r/dev/nvidia1 EPERM
srun: job 3 queued and waiting for resources
/r/dev/nvidia1 ENXIO
`
	got := ParseOpen(out)
	want := OpenReport{
		Open:   map[string]string{"/r/dev/nvidia0": "ENXIO", "/r/dev/nvidia1": "ENXIO"},
		Env:    map[string]string{"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "2"},
		Unset:  map[string]bool{"SLURM_JOB_GPUS": true},
		Cgroup: "/system.slice/vm_slurmstepd.scope/job_3/step_0/user/task_special",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseOpen:\n got %+v\nwant %+v", got, want)
	}
}

func TestProcessIdentity(t *testing.T) {
	st, err := procStartTime(os.Getpid())
	if err != nil || st == 0 {
		t.Fatalf("procStartTime(self) = %d, %v", st, err)
	}
	self := &Process{Name: "self", PID: os.Getpid(), StartTime: st}
	if !self.Alive() {
		t.Error("own process not alive")
	}
	// A recorded PID whose start time differs is a reused PID: never ours.
	reused := &Process{Name: "reused", PID: os.Getpid(), StartTime: st + 1}
	if reused.Alive() {
		t.Error("a PID with another start time counts as ours")
	}
	if err := reused.Stop(); err != nil {
		t.Errorf("Stop of a reused PID: %v", err)
	}
}

func TestLastLines(t *testing.T) {
	if got := lastLines("a\nb\nc\n", 2); got != "b\nc" {
		t.Errorf("lastLines = %q", got)
	}
	if got := lastLines("a\n", 5); got != "a" {
		t.Errorf("lastLines = %q", got)
	}
}

func TestRenderMIGGresConf(t *testing.T) {
	p := testParams()
	p.MIG = true
	want := "Name=gpu Type=a100 File=/var/tmp/r/dev/nvidia0\n" +
		"Name=gpu Type=1g.10gb MultipleFiles=/var/tmp/r/dev/nvidia1,/var/tmp/r/dev/nvidia-caps/nvidia-cap138,/var/tmp/r/dev/nvidia-caps/nvidia-cap139\n" +
		"Name=gpu Type=1g.10gb MultipleFiles=/var/tmp/r/dev/nvidia1,/var/tmp/r/dev/nvidia-caps/nvidia-cap147,/var/tmp/r/dev/nvidia-caps/nvidia-cap148\n" +
		"Name=gpu Type=1g.10gb MultipleFiles=/var/tmp/r/dev/nvidia1,/var/tmp/r/dev/nvidia-caps/nvidia-cap156,/var/tmp/r/dev/nvidia-caps/nvidia-cap157\n"
	if got := renderGresConf(p); got != want {
		t.Errorf("MIG gres.conf:\n%s\nwant:\n%s", got, want)
	}
	// slurm.conf names the same types, or slurmd drops them.
	if n := strings.Count(want, "\n"); n != migGPUs || !strings.Contains(renderSlurmConf(p), " Gres=gpu:a100:1,gpu:1g.10gb:3 ") {
		t.Errorf("MIG layout has %d records (want %d); slurm.conf:\n%s", n, migGPUs, renderSlurmConf(p))
	}
}

func TestFakeCapsDevices(t *testing.T) {
	got := fakeCapsDevices(236)
	want := []fakeDevice{
		{"nvidia-caps/nvidia-cap1", 236, 1}, {"nvidia-caps/nvidia-cap2", 236, 2},
		{"nvidia-caps/nvidia-cap138", 236, 138}, {"nvidia-caps/nvidia-cap139", 236, 139},
		{"nvidia-caps/nvidia-cap147", 236, 147}, {"nvidia-caps/nvidia-cap148", 236, 148},
		{"nvidia-caps/nvidia-cap156", 236, 156}, {"nvidia-caps/nvidia-cap157", 236, 157},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fakeCapsDevices(236) = %v, want %v", got, want)
	}
}

func TestPickCapsMajor(t *testing.T) {
	devs := "Character devices:\n  1 mem\n195 nvidia\n239 nvidia-caps\n238 x\n\nBlock devices:\n237 blk\n"
	if m, err := pickCapsMajor(devs); err != nil || m != 237 {
		t.Errorf("pickCapsMajor = %d, %v; want 237 (239, 238 taken; block majors do not count)", m, err)
	}
	full := "Character devices:\n"
	for m := 230; m <= 239; m++ {
		full += strconv.Itoa(m) + " x\n"
	}
	if _, err := pickCapsMajor(full); err == nil {
		t.Error("pickCapsMajor found a major in a full range")
	}
}

// TestRenderPerRelease: the files follow what each release accepts.
func TestRenderPerRelease(t *testing.T) {
	for _, tc := range []struct {
		name         string
		mod          func(*confParams)
		cgroup, conf []string // lines cgroup.conf / slurm.conf must have
		notCgroup    []string // lines cgroup.conf must not have
		notConf      []string
	}{
		{"22.05", func(p *confParams) { p.Release = "22.05" }, []string{"CgroupAutomount=no"}, nil, nil, []string{"SchedulerParameters=bf_interval=1"}},
		{"default is 22.05", func(p *confParams) {}, []string{"CgroupAutomount=no"}, nil, nil, nil},
		{"23.11 dropped CgroupAutomount, backfills every second", func(p *confParams) { p.Release = "23.11" }, nil, []string{"SchedulerParameters=bf_interval=1"}, []string{"CgroupAutomount=no"}, nil},
		{"24.05 backfills every second", func(p *confParams) { p.Release = "24.05" }, nil, []string{"SchedulerParameters=bf_interval=1"}, []string{"CgroupAutomount=no"}, nil},
		{"24.11 does not", func(p *confParams) { p.Release = "24.11" }, nil, nil, nil, []string{"SchedulerParameters=bf_interval=1"}},
		{"25.11 CgroupSlice", func(p *confParams) { p.Release = "25.11"; p.Slice = "gpufence_test.slice" }, []string{"CgroupSlice=gpufence_test.slice"}, nil, []string{"CgroupAutomount=no"}, nil},
		{"26.05 CgroupJobIdPaths", func(p *confParams) { p.Release = "26.05"; p.JobIDPaths = true }, []string{"CgroupJobIdPaths=yes"}, nil, nil, nil},
		{"namespace/linux", func(p *confParams) { p.Release = "25.11"; p.Namespace = true }, nil, []string{"NamespaceType=namespace/linux"}, nil, nil},
		{"ParallelCluster: no ConstrainDevices line", func(p *confParams) { p.Release = "23.11"; p.PCluster = true }, nil, []string{"NodeName=node1 NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:a10g:4 State=UNKNOWN"}, []string{"ConstrainDevices=no"}, nil},
		{"ParallelCluster with ConstrainDevices", func(p *confParams) { p.PCluster = true; p.Constrain = true }, []string{"ConstrainDevices=yes"}, nil, nil, nil},
		{"fake driver", func(p *confParams) { p.Release = "26.05"; p.FakeDriver = true }, nil, []string{"NodeName=node1 NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:tesla_t4:4 State=UNKNOWN"}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testParams()
			tc.mod(&p)
			cg, conf := renderCgroupConf(p), renderSlurmConf(p)
			has := func(text, line string) bool { return strings.Contains("\n"+text, "\n"+line+"\n") }
			for _, l := range tc.cgroup {
				if !has(cg, l) {
					t.Errorf("cgroup.conf lacks %q:\n%s", l, cg)
				}
			}
			for _, l := range tc.notCgroup {
				if has(cg, l) {
					t.Errorf("cgroup.conf has %q:\n%s", l, cg)
				}
			}
			for _, l := range tc.conf {
				if !has(conf, l) {
					t.Errorf("slurm.conf lacks %q:\n%s", l, conf)
				}
			}
			for _, l := range tc.notConf {
				if has(conf, l) {
					t.Errorf("slurm.conf has %q:\n%s", l, conf)
				}
			}
		})
	}
	p := testParams()
	p.PCluster = true
	files := renderPlugstackFiles(p)
	if files["etc/plugstack.conf"] != "include /var/tmp/r/etc/plugstack.conf.d/*\n" || len(files) != 2 {
		t.Errorf("ParallelCluster plugstack files: %q", files)
	}
	if g := renderGresConf(p); !strings.Contains(g, "include /var/tmp/r/etc/"+pclusterGresFile) {
		t.Errorf("ParallelCluster gres.conf: %q", g)
	}
	if g := renderPClusterGres(p); g != "NodeName=node1 Name=gpu Type=a10g File=/var/tmp/r/dev/nvidia[0-3]\n" {
		t.Errorf("ParallelCluster's gres line: %q", g)
	}
	p = testParams()
	p.FakeDriver = true
	if g := renderGresConf(p); g != "AutoDetect=nvidia\nName=gpu Type=tesla_t4 File=/dev/nvidia[0-3] Flags=env_uuid\n" {
		t.Errorf("fake driver gres.conf: %q", g)
	}
}

func TestRenderSharedLayout(t *testing.T) {
	for _, tc := range []struct {
		kind      string
		slurm     []string
		gres      string
		noPrologs bool
	}{
		{kind: "", slurm: []string{"GresTypes=gpu\n", "Gres=gpu:4 State", "OverSubscribe=NO\n"},
			gres: "Name=gpu File=/var/tmp/r/dev/nvidia[0-3]\n", noPrologs: true},
		{kind: "shard", slurm: []string{"GresTypes=gpu,shard\n", "Gres=gpu:4,shard:40 State", "OverSubscribe=FORCE:24\n", "Prolog=/var/tmp/r/etc/prolog-env.sh\n"},
			gres: "Name=gpu File=/var/tmp/r/dev/nvidia[0-3]\nName=shard Count=10 File=/var/tmp/r/dev/nvidia0\nName=shard Count=10 File=/var/tmp/r/dev/nvidia1\nName=shard Count=10 File=/var/tmp/r/dev/nvidia2\nName=shard Count=10 File=/var/tmp/r/dev/nvidia3\n"},
		{kind: "mps", slurm: []string{"GresTypes=gpu,mps\n", "Gres=gpu:4,mps:400 State", "OverSubscribe=FORCE:24\n"},
			gres: "Name=gpu File=/var/tmp/r/dev/nvidia[0-3]\nName=mps Count=100 File=/var/tmp/r/dev/nvidia0\nName=mps Count=100 File=/var/tmp/r/dev/nvidia1\nName=mps Count=100 File=/var/tmp/r/dev/nvidia2\nName=mps Count=100 File=/var/tmp/r/dev/nvidia3\n"},
	} {
		p := testParams()
		p.Shared = tc.kind
		conf := renderSlurmConf(p)
		for _, want := range tc.slurm {
			if !strings.Contains(conf, want) {
				t.Errorf("%q: slurm.conf lacks %q:\n%s", tc.kind, want, conf)
			}
		}
		if tc.noPrologs && strings.Contains(conf, "Prolog=") {
			t.Errorf("%q: slurm.conf has a Prolog= line:\n%s", tc.kind, conf)
		}
		if got := renderGresConf(p); got != tc.gres {
			t.Errorf("%q: gres.conf\n%s\nwant\n%s", tc.kind, got, tc.gres)
		}
	}
}

func TestRenderSharedPCluster(t *testing.T) {
	p := testParams()
	p.PCluster, p.Shared = true, "shard"
	want := "NodeName=node1 Name=gpu Type=a10g File=/var/tmp/r/dev/nvidia[0-3]\n" +
		"NodeName=node1 Name=shard Count=10 File=/var/tmp/r/dev/nvidia0\n" +
		"NodeName=node1 Name=shard Count=10 File=/var/tmp/r/dev/nvidia1\n" +
		"NodeName=node1 Name=shard Count=10 File=/var/tmp/r/dev/nvidia2\n" +
		"NodeName=node1 Name=shard Count=10 File=/var/tmp/r/dev/nvidia3\n"
	if got := renderPClusterGres(p); got != want {
		t.Errorf("ParallelCluster's gres file\n%s\nwant\n%s", got, want)
	}
	if conf := renderSlurmConf(p); !strings.Contains(conf, "Gres=gpu:a10g:4,shard:40 State") {
		t.Errorf("slurm.conf lacks the typed GPUs and the shards:\n%s", conf)
	}
}
