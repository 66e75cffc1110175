// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// migCapsMajor stands in for the dynamic nvidia-caps major; nothing on the
// test machine registers it, so an allowed open fails with ENXIO.
const migCapsMajor = 236

// migGres: index 0 is GPU 0 whole, 1 and 2 are 1g slices of GPU 1 (GPU
// instance access minors 147 and 156, compute instance 148 and 157).
func (tr *tree) migGres() {
	tr.t.Helper()
	if err := os.MkdirAll(filepath.Join(tr.dev, "nvidia-caps"), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	for _, m := range []uint32{1, 2, 147, 148, 156, 157} {
		tr.mknod(filepath.Join("nvidia-caps", "nvidia-cap"+strconv.FormatUint(uint64(m), 10)), migCapsMajor, m)
	}
	caps := tr.dev + "/nvidia-caps/nvidia-cap"
	gres := "Name=gpu Type=a100 File=" + tr.dev + "/nvidia0\n" +
		"Name=gpu Type=1g.10gb MultipleFiles=" + tr.dev + "/nvidia1," + caps + "147," + caps + "148\n" +
		"Name=gpu Type=1g.10gb MultipleFiles=" + tr.dev + "/nvidia1," + caps + "156," + caps + "157\n"
	if err := os.WriteFile(filepath.Join(tr.gres, "gres.conf"), []byte(gres), 0o644); err != nil {
		tr.t.Fatal(err)
	}
}

// openNames reports what each named node under tr.dev gives a process in
// cgroup dir.
func (tr *tree) openNames(dir string, names ...string) map[string]string {
	tr.t.Helper()
	var paths []string
	for _, n := range names {
		paths = append(paths, filepath.Join(tr.dev, n))
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "GPUFENCE_TEST_OPEN="+strings.Join(paths, ","))
	var out []byte
	err := tr.inCgroup(dir, cmd, func() (err error) { out, err = cmd.CombinedOutput(); return err })
	if err != nil {
		tr.t.Fatalf("open helper: %v\n%s", err, out)
	}
	res := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(l, " ")
		res[k] = v
	}
	return res
}

var migNodes = []string{"nvidia0", "nvidia1", "nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2",
	"nvidia-caps/nvidia-cap147", "nvidia-caps/nvidia-cap148", "nvidia-caps/nvidia-cap156", "nvidia-caps/nvidia-cap157"}

func (tr *tree) expectNodes(dir string, allowed ...string) {
	tr.t.Helper()
	got := tr.openNames(dir, migNodes...)
	for _, n := range migNodes {
		want := "EPERM"
		for _, a := range allowed {
			if a == n {
				want = "ENXIO"
			}
		}
		if got[filepath.Base(n)] != want {
			tr.t.Errorf("%s: %s = %s, want %s", dir, n, got[filepath.Base(n)], want)
		}
	}
}

func TestPrivilegedDaemonMIGScope(t *testing.T)     { testDaemonMIG(t, devfilter.ModeScope) }
func TestPrivilegedDaemonMIGPerCgroup(t *testing.T) { testDaemonMIG(t, devfilter.ModePerCgroup) }

// testDaemonMIG: two jobs on two slices of one GPU each open the parent GPU
// and their own capability nodes only; denials name the slice and its file.
func testDaemonMIG(t *testing.T, mode devfilter.Mode) {
	tr := newTree(t)
	if mode == devfilter.ModeScope {
		if m, _ := devfilter.Probe(); m != devfilter.ModeScope {
			t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", m)
		}
	}
	tr.migGres()
	cfg := config.Default()
	cfg.SlurmdGPUTable = config.SlurmdGPUTableOff // gres.conf alone: slurmd_test.go runs slurmd -G
	cfg.SlurmConf = filepath.Join(tr.gres, "slurm.conf")
	cfg.Scope = tr.scope
	cfg.PinDir, cfg.FailOpenSpool = "", ""
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	cfg.NvidiaCapsMajor = migCapsMajor
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	d, err := New(cfg, log, NewKernelFilter(devfilter.Options{Mode: mode, NvidiaMajor: 195, CapsMajor: migCapsMajor, Logger: log,
		AuditAllowed: devfilter.AuditAllowedNone}), 195, tr.rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })

	task1 := tr.mkdir("job_1/step_0/user/task_0")
	stepd1 := tr.sleeper(tr.mkdir("job_1/step_0/slurm"))
	task2 := tr.mkdir("job_2/step_batch/user/task_0")
	stepd2 := tr.sleeper(tr.mkdir("job_2/step_batch/slurm"))
	task3 := tr.mkdir("job_3/step_0/user/task_0")
	stepd3 := tr.sleeper(tr.mkdir("job_3/step_0/slurm"))
	for _, m := range []*pb.JobProlog{{JobId: 1, Uid: 1000, JobGpus: ptr("1")}, {JobId: 2, Uid: 1001, JobGpus: ptr("2")}, {JobId: 3, Uid: 1002, JobGpus: ptr("0")}} {
		if r := call(d, 0, m); r.Error != "" {
			t.Fatalf("prolog %d: %s", m.JobId, r.Error)
		}
	}
	// A forged SLURM_STEP_GPUS asking for the other slice is narrowed away.
	if r := call(d, stepd1, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("1,2")}); r.Error != "" || len(r.Gpus) != 1 || r.Gpus[0] != 1 {
		t.Fatalf("step 1.0: %+v", r)
	}
	if r := call(d, stepd2, &pb.StepStart{JobId: 2, StepId: 0xfffffffb, Uid: 1001}); r.Error != "" {
		t.Fatalf("step 2.batch: %+v", r)
	}
	if r := call(d, stepd3, &pb.StepStart{JobId: 3, StepId: 0, Uid: 1002, StepGpus: ptr("0")}); r.Error != "" {
		t.Fatalf("step 3.0: %+v", r)
	}
	tr.expectNodes(task1, "nvidia1", "nvidia-caps/nvidia-cap147", "nvidia-caps/nvidia-cap148")
	tr.expectNodes(task2, "nvidia1", "nvidia-caps/nvidia-cap156", "nvidia-caps/nvidia-cap157")
	// The whole GPU: unchanged, and no capability.
	tr.expectNodes(task3, "nvidia0")
	if mode == devfilter.ModeScope {
		tr.expectNodes(filepath.Join(tr.scope, "slurmd"), migNodes...)
	}

	d.flush()
	var rec *audit.Record
	for deadline := time.Now().Add(5 * time.Second); rec == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, r := range tr.rec.Records(audit.EventGPUAccess) {
			if r.JobID == 1 && r.Decision == audit.DecisionDenied && r.Device.Major == migCapsMajor && r.Device.Minor == 156 {
				rec = &r
				break
			}
		}
	}
	if rec == nil {
		t.Fatal("no denied record of job 1 opening the other slice's GPU instance")
	}
	if rec.GPU == nil || rec.GPU.Index != 2 || rec.GPU.MIG == nil || rec.GPU.MIG.Profile != "1g.10gb" ||
		rec.Device.Path != filepath.Join(tr.dev, "nvidia-caps", "nvidia-cap156") || !strings.Contains(rec.Message, "MIG slice GPU 2") {
		t.Errorf("caps denial attributed as %+v gpu %+v device %+v", rec.Message, rec.GPU, rec.Device)
	}
	var cfgRec *audit.Record
	for _, r := range tr.rec.Records(audit.EventGPUAccess) {
		if r.JobID == 1 && r.Device.Major == migCapsMajor && r.Device.Minor == 1 {
			cfgRec = &r
		}
	}
	if cfgRec == nil || cfgRec.Decision != audit.DecisionDenied || cfgRec.GPU != nil {
		t.Errorf("MIG config denial: %+v", cfgRec)
	}
}

// TestMIGNeedsCapsMajor: a gres.conf with MIG slices whose caps major is
// unknown is refused at start, naming the line.
func TestMIGNeedsCapsMajor(t *testing.T) {
	if _, err := jobcgroup.Mountpoint(); err != nil {
		t.Skip("no cgroup v2")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "slurm.conf"), []byte("TaskPlugin=task/cgroup\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "gres.conf"), []byte("Name=gpu File="+dir+"/nvidia0\nName=gpu MultipleFiles="+dir+"/nvidia1,"+dir+"/nvidia-caps/nvidia-cap147\n"), 0o644)
	cfg := config.Default()
	cfg.SlurmdGPUTable = config.SlurmdGPUTableOff // gres.conf alone: slurmd_test.go runs slurmd -G
	cfg.SlurmConf = filepath.Join(dir, "slurm.conf")
	cfg.Scope = "/sys/fs/cgroup/none-such-scope"
	cfg.PinDir, cfg.StateFile, cfg.FailOpenSpool = "", "", ""
	_, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(string, func(Filter) error) (Filter, error) {
		return nil, errors.New("no filter in this test")
	}, 195, nil)
	if err == nil || !strings.Contains(err.Error(), "gres.conf:2") || !strings.Contains(err.Error(), "nvidia-caps major is unknown") {
		t.Fatalf("New with MIG slices and no caps major: %v", err)
	}
}
