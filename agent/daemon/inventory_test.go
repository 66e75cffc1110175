// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// nvmlGPUs is what NVML would report for minors 0..n-1.
func nvmlGPUs(n int) []inventory.GPU {
	out := make([]inventory.GPU, n)
	for i := range out {
		out[i] = inventory.GPU{Index: i, Minor: uint32(i), UUID: fmt.Sprintf("GPU-%08d-aaaa-bbbb-cccc-000000000000", i),
			PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x18+i), Name: "NVIDIA H100 80GB HBM3"}
	}
	return out
}

func TestSetInventory(t *testing.T) {
	if _, err := jobcgroup.Mountpoint(); err != nil {
		t.Skip("no cgroup v2")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "slurm.conf"), []byte("TaskPlugin=task/cgroup\n"), 0o644)
	// Slurm's order differs from NVML's; the minors tie them.
	os.WriteFile(filepath.Join(dir, "gres.conf"), []byte("Name=gpu File=/nonexistent/nvidia[3,2,1,0]\n"), 0o644)
	newDaemon := func(logs io.Writer) *Daemon {
		cfg := config.Default()
		cfg.SlurmdGPUTable = config.SlurmdGPUTableOff // gres.conf alone: slurmd_test.go runs slurmd -G
		cfg.SlurmConf = filepath.Join(dir, "slurm.conf")
		cfg.Scope = "/sys/fs/cgroup/none-such-scope"
		cfg.PinDir, cfg.StateFile, cfg.FailOpenSpool = "", "", ""
		d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), func(string, func(Filter) error) (Filter, error) {
			return nil, errors.New("no filter in this test")
		}, 195, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tc := range []struct {
		name       string
		gpus       []inventory.GPU
		untrusted  string // substring of the refusal; "" when trusted
		logs       []string
		uuidOfIdx0 string // Slurm index 0 is /dev/nvidia3
	}{
		{name: "matching", gpus: nvmlGPUs(4), uuidOfIdx0: "GPU-00000003-aaaa-bbbb-cccc-000000000000",
			logs: []string{"gpu identified by NVML", "gpu=0", "nvml_index=3", "bus_id=00000000:1B:00.0", `name="NVIDIA H100 80GB HBM3"`, "mig=off"}},
		{name: "NVML has 3", gpus: nvmlGPUs(3), untrusted: "gres.conf names 4 GPU devices for this node but the NVIDIA driver (NVML) sees 3 GPUs (and 1 more)",
			logs: []string{"GPU table mismatch", "kind=not_in_nvml", "failing closed"}},
		{name: "MIG whole is only a warning", gpus: func() []inventory.GPU {
			g := nvmlGPUs(4)
			g[2].MIGEnabled = true
			return g
		}(), uuidOfIdx0: "GPU-00000003-aaaa-bbbb-cccc-000000000000", logs: []string{"GPU table warning", "kind=mig_whole_gpu", "mig=\"on, 0 devices\""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs strings.Builder
			d := newDaemon(&logs)
			if _, ok := d.table.UUID(0); ok || d.table.Untrusted() != "" {
				t.Fatal("inventory known before SetInventory")
			}
			d.SetInventory(tc.gpus)
			if got := d.table.Untrusted(); (tc.untrusted == "") != (got == "") || !strings.Contains(got, tc.untrusted) {
				t.Errorf("untrusted = %q, want %q", got, tc.untrusted)
			}
			for _, l := range tc.logs {
				if !strings.Contains(logs.String(), l) {
					t.Errorf("log lacks %q:\n%s", l, logs.String())
				}
			}
			uuid, _ := d.table.UUID(0)
			if tc.uuidOfIdx0 != "" && uuid != tc.uuidOfIdx0 {
				t.Errorf("GPUUUID(0) = %q, want %q", uuid, tc.uuidOfIdx0)
			}
			// An access to /dev/nvidia3 is GPU index 0, with that UUID.
			g, _, ok := d.table.Of(195, 3, nil)
			uuid, _ = d.table.UUID(g.Index)
			if !ok || g.Index != 0 || uuid != tc.uuidOfIdx0 {
				t.Errorf("device 195:3 is GPU %+v uuid %q, want index 0 uuid %q", g, uuid, tc.uuidOfIdx0)
			}
		})
	}
}

// TestPrivilegedInventoryMismatchFailsClosed: with a table NVML contradicts,
// a GPU step is refused and a CPU-only step still runs; with a matching
// one, the same step gets its GPU and denials carry the GPU's UUID.
func TestPrivilegedInventoryMismatchFailsClosed(t *testing.T) {
	tr := newTree(t)
	d, _ := tr.daemon(devfilter.ModeAuto)
	d.SetInventory(nvmlGPUs(3)) // gres.conf lists 4

	for _, m := range []*pb.JobProlog{{JobId: 1, Uid: 1000, JobGpus: ptr("1")}, {JobId: 2, Uid: 1000}} {
		if r := call(d, 0, m); r.Error != "" {
			t.Fatalf("prolog %d: %s", m.JobId, r.Error)
		}
	}
	stepd1 := tr.sleeper(tr.mkdir("job_1/step_0/slurm"))
	if r := call(d, stepd1, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("1")}); !strings.Contains(r.Error, "does not match the NVIDIA driver") {
		t.Errorf("GPU step with an untrusted table: %+v", r)
	}
	mism := tr.rec.Records(audit.EventGPUTableMismatch)
	if len(mism) == 0 || mism[0].Severity != audit.SeverityError || !strings.Contains(mism[0].Error, "count") {
		t.Errorf("gpu_table_mismatch records: %+v, want an error one for the count", mism)
	}
	stepd2 := tr.sleeper(tr.mkdir("job_2/step_0/slurm"))
	if r := call(d, stepd2, &pb.StepStart{JobId: 2, StepId: 0, Uid: 1000}); r.Error != "" {
		t.Errorf("CPU-only step with an untrusted table: %s", r.Error)
	}

	d2, _ := tr.daemon(devfilter.ModeAuto)
	d.Close()
	d2.SetInventory(nvmlGPUs(4))
	call(d2, 0, &pb.JobProlog{JobId: 1, Uid: 1000, JobGpus: ptr("1")})
	r := call(d2, stepd1, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("1")})
	if r.Error != "" || !slices.Equal(r.Gpus, []uint32{1}) {
		t.Fatalf("GPU step with a matching table: %+v", r)
	}
	task := tr.mkdir("job_1/step_0/user/task_0")
	tr.expect(task, 1)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, rec := range tr.rec.Records(audit.EventGPUAccess) {
			if rec.JobID == 1 && rec.Decision == audit.DecisionDenied && rec.GPU != nil && rec.GPU.Index == 0 {
				if want := nvmlGPUs(1)[0].UUID; rec.GPU.UUID != want {
					t.Fatalf("denied record GPU %+v, want UUID %s", rec.GPU, want)
				}
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no denied record for GPU 0 of job 1")
}

// TestSetInventoryMIGSlice: a MIG slice's UUID is its MIG device's, found
// by its caps minors; a slice of a GPU whose MIG mode is off fails closed.
func TestSetInventoryMIGSlice(t *testing.T) {
	if _, err := jobcgroup.Mountpoint(); err != nil {
		t.Skip("no cgroup v2")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "slurm.conf"), []byte("TaskPlugin=task/cgroup\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "gres.conf"), []byte("Name=gpu File=/nonexistent/nvidia0\n"+
		"Name=gpu Type=3g.40gb MultipleFiles=/nonexistent/nvidia1,/nonexistent/nvidia-caps/nvidia-cap147,/nonexistent/nvidia-caps/nvidia-cap148\n"), 0o644)
	cfg := config.Default()
	cfg.SlurmdGPUTable = config.SlurmdGPUTableOff // gres.conf alone: slurmd_test.go runs slurmd -G
	cfg.SlurmConf = filepath.Join(dir, "slurm.conf")
	cfg.Scope = "/sys/fs/cgroup/none-such-scope"
	cfg.PinDir, cfg.StateFile, cfg.FailOpenSpool = "", "", ""
	cfg.NvidiaCapsMajor = 237
	for _, tc := range []struct {
		name      string
		migOn     bool
		uuid      string
		untrusted string
	}{
		{name: "slice is a MIG device", migOn: true, uuid: "MIG-slice"},
		{name: "MIG off", untrusted: "whose MIG mode is off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(string, func(Filter) error) (Filter, error) {
				return nil, errors.New("no filter in this test")
			}, 195, nil)
			if err != nil {
				t.Fatal(err)
			}
			gpus := nvmlGPUs(2)
			if tc.migOn {
				gpus[1].MIGEnabled = true
				gpus[1].MIG = []inventory.MIGDevice{{UUID: "MIG-slice", Profile: "3g.40gb", GI: 1, CI: 0, GICapMinor: 147, CICapMinor: 148}}
			}
			d.SetInventory(gpus)
			if got, _ := d.table.UUID(1); got != tc.uuid {
				t.Errorf("GPUUUID(1) = %q, want %q", got, tc.uuid)
			}
			if got, _ := d.table.UUID(0); got != gpus[0].UUID {
				t.Errorf("GPUUUID(0) = %q", got)
			}
			if got := d.table.Untrusted(); !strings.Contains(got, tc.untrusted) || (tc.untrusted == "") != (got == "") {
				t.Errorf("untrusted = %q, want %q", got, tc.untrusted)
			}
		})
	}
}
