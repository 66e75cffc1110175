// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// slurmdNode is a Slurm install in ParallelCluster's layout, <prefix>/etc
// and <prefix>/sbin, whose slurmd is a script printing what slurmd -G
// would for the tree's fake devices, in the order given.
type slurmdNode struct {
	tr     *tree
	prefix string
}

func newSlurmdNode(tr *tree, gres string) *slurmdNode {
	n := &slurmdNode{tr: tr, prefix: tr.t.TempDir()}
	for _, d := range []string{"etc", "sbin"} {
		if err := os.Mkdir(filepath.Join(n.prefix, d), 0o755); err != nil {
			tr.t.Fatal(err)
		}
	}
	n.write("etc/slurm.conf", "ClusterName=c1\n", 0o644)
	n.write("etc/gres.conf", strings.ReplaceAll(gres, "DEV", tr.dev), 0o644)
	return n
}

func (n *slurmdNode) write(rel, body string, mode os.FileMode) {
	p := filepath.Join(n.prefix, rel)
	if err := os.WriteFile(p+".new", []byte(body), mode); err != nil {
		n.tr.t.Fatal(err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		n.tr.t.Fatal(err)
	}
}

// prints makes slurmd -G print the GPUs of these minors in this order, as
// 22.05 prints an AutoDetect table; exit, when not 0, makes it fail.
func (n *slurmdNode) prints(exit int, minors ...int) {
	var b strings.Builder
	fmt.Fprintf(&b, "#!/bin/sh\necho \"$@\" > %s/args\n", n.prefix)
	for _, m := range minors {
		fmt.Fprintf(&b, "echo 'slurmd: Gres Name=gpu Type=t4 Count=1 Index=%d ID=7696487 File=%s/nvidia%d Cores=0-1 CoreCnt=2 Links=(null)' >&2\n", m, n.tr.dev, m)
	}
	if exit != 0 {
		fmt.Fprintf(&b, "echo \"slurmd: fatal: can't stat gres.conf file /dev/nvidia9: No such file or directory\" >&2\nexit %d\n", exit)
	}
	n.write("sbin/slurmd", b.String(), 0o755)
}

func (n *slurmdNode) daemon(mode string, set ...func(*config.Config)) (*Daemon, string) {
	tr := n.tr
	cfg := config.Default()
	cfg.SlurmConf = filepath.Join(n.prefix, "etc", "slurm.conf")
	cfg.SlurmdGPUTable = mode
	cfg.NodeName = "gpu-7"
	cfg.Scope = tr.scope
	cfg.PinDir, cfg.FailOpenSpool = "", ""
	cfg.StateFile = filepath.Join(tr.t.TempDir(), "state.json")
	for _, f := range set {
		f(&cfg)
	}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{tr.t}), nil))
	d, err := New(cfg, log, NewKernelFilter(devfilter.Options{Mode: devfilter.ModeAuto, NvidiaMajor: 195, Logger: log, AuditAllowed: devfilter.AuditAllowedNone}), 195, tr.rec)
	if err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { d.Close() })
	return d, cfg.StateFile
}

// step registers job id holding gpus and its step 0 asking for them, and
// returns the answer and the step's task cgroup.
func (n *slurmdNode) step(d *Daemon, id uint32, gpus string) (*pb.Response, string) {
	tr := n.tr
	if r := call(d, 0, &pb.JobProlog{JobId: id, Uid: 1000, JobGpus: ptr(gpus)}); r.Error != "" {
		tr.t.Fatalf("prolog %d: %s", id, r.Error)
	}
	stepd := tr.sleeper(tr.mkdir(fmt.Sprintf("job_%d/step_0/slurm", id)))
	task := tr.mkdir(fmt.Sprintf("job_%d/step_0/user/task_0", id))
	return call(d, stepd, &pb.StepStart{JobId: id, StepId: 0, Uid: 1000, StepGpus: ptr(gpus)}), task
}

// TestPrivilegedSlurmdTableAutoDetect: with a gres.conf of AutoDetect=nvml
// alone, the agent takes slurmd's table, in slurmd's order: Slurm's GPU 0
// is /dev/nvidia2 here, and a job given GPU 0 opens nvidia2 and nothing
// else. Without slurmd -G the node could not give out a GPU at all.
func TestPrivilegedSlurmdTableAutoDetect(t *testing.T) {
	tr := newTree(t)
	n := newSlurmdNode(tr, "AutoDetect=nvml\n")
	n.prints(0, 2, 3, 0, 1)
	d, state := n.daemon(config.SlurmdGPUTableAuto)
	if o := d.Table().Origin(); o.Source != "slurmd -G" || o.AutoDetect != "nvml" || d.Table().Untrusted() != "" {
		t.Fatalf("origin %+v, untrusted %q", o, d.Table().Untrusted())
	}
	args, _ := os.ReadFile(filepath.Join(n.prefix, "args"))
	if want := fmt.Sprintf("-G -L /dev/null -f %s/etc/slurm.conf -N gpu-7\n", n.prefix); string(args) != want {
		t.Errorf("slurmd ran with %q, want %q", args, want)
	}
	r, task := n.step(d, 1, "0")
	if r.Error != "" || !slices.Equal(r.Gpus, []uint32{0}) {
		t.Fatalf("step 1.0: %+v", r)
	}
	tr.expect(task, 2)
	r, task = n.step(d, 2, "2,3")
	if r.Error != "" {
		t.Fatalf("step 2.0: %+v", r)
	}
	tr.expect(task, 0, 1)
	// gpufence status reads the source from the state file, written at start.
	st, _, err := statefile.Read(state)
	if err != nil || st.GPUTable == nil || st.GPUTable.Source != "slurmd -G" || len(st.GPUTable.GPUs) != 4 || st.GPUTable.GPUs[0].Files[0] != tr.dev+"/nvidia2" {
		t.Fatalf("state file gpu_table: %+v, %v", st, err)
	}
	if recs := tr.rec.Records(audit.EventGPUTableMismatch); len(recs) != 0 {
		t.Errorf("audit records for a table whose sources agree: %+v", recs)
	}
}

// TestPrivilegedSlurmdTableDisagrees: a static gres.conf and slurmd -G that
// name another device for one index, or slurmd -G failing under
// AutoDetect, give no job a GPU, say why, and audit it; a CPU-only step
// still runs.
func TestPrivilegedSlurmdTableDisagrees(t *testing.T) {
	for _, tc := range []struct {
		name, gres string
		exit       int
		minors     []int
		refusal    string
		kind       string
	}{
		{name: "static gres.conf slurmd swaps two", gres: "Name=gpu File=DEV/nvidia[0-3]\n", minors: []int{1, 0, 2, 3},
			refusal: "slurmd -G and gres.conf disagree on which device a GPU index is (GPU index 0 is " + "DEV/nvidia1 for slurmd -G, DEV/nvidia0 in gres.conf)", kind: "sources_differ"},
		{name: "AutoDetect slurmd fails", gres: "AutoDetect=nvml\nName=gpu File=DEV/nvidia[0-3]\n", exit: 1, minors: []int{0},
			refusal: "gres.conf sets AutoDetect=nvml, so only slurmd knows which device each GPU index is, and slurmd -G failed", kind: "slurmd_failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTree(t)
			n := newSlurmdNode(tr, tc.gres)
			n.prints(tc.exit, tc.minors...)
			d, _ := n.daemon(config.SlurmdGPUTableAuto)
			refusal := strings.ReplaceAll(tc.refusal, "DEV", tr.dev)
			r, _ := n.step(d, 1, "0")
			if !strings.Contains(r.Error, refusal) {
				t.Fatalf("GPU step: %+v, want the refusal %q", r, refusal)
			}
			if r, _ := n.step(d, 2, ""); r.Error != "" {
				t.Errorf("CPU-only step: %s", r.Error)
			}
			recs := tr.rec.Records(audit.EventGPUTableMismatch)
			if len(recs) != 1 || recs[0].Severity != audit.SeverityError || !strings.HasPrefix(recs[0].Error, tc.kind+": ") {
				t.Errorf("gpu_table_mismatch records %+v, want one error of kind %s", recs, tc.kind)
			}
		})
	}
	t.Run("required", func(t *testing.T) {
		tr := newTree(t)
		n := newSlurmdNode(tr, "Name=gpu File=DEV/nvidia[0-3]\n")
		n.prints(1)
		cfg := config.Default()
		cfg.SlurmConf = filepath.Join(n.prefix, "etc", "slurm.conf")
		cfg.SlurmdGPUTable = config.SlurmdGPUTableRequired
		cfg.Scope, cfg.PinDir, cfg.StateFile, cfg.FailOpenSpool = tr.scope, "", "", ""
		_, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), NewKernelFilter(devfilter.Options{NvidiaMajor: 195}), 195, tr.rec)
		if err == nil || !strings.Contains(err.Error(), "slurmd_gpu_table is required") || !strings.Contains(err.Error(), "fatal: can't stat gres.conf file /dev/nvidia9") {
			t.Fatalf("New = %v, want the slurmd failure", err)
		}
	})
}

// TestPrivilegedSlurmdTableReload: SIGHUP's recheck finds slurmd's table
// changed, and from then on no step gets a GPU until it matches again;
// the table in use never changes under running jobs.
func TestPrivilegedSlurmdTableReload(t *testing.T) {
	tr := newTree(t)
	n := newSlurmdNode(tr, "AutoDetect=nvml\n")
	n.prints(0, 0, 1, 2, 3)
	d, state := n.daemon(config.SlurmdGPUTableAuto)
	if !d.ReloadGPUTable(context.Background()) {
		t.Fatalf("unchanged table untrusted: %s", d.Table().Untrusted())
	}
	n.prints(0, 3, 1, 2, 0)
	if d.ReloadGPUTable(context.Background()) {
		t.Fatal("a changed table was kept trusted")
	}
	r, _ := n.step(d, 1, "0")
	want := fmt.Sprintf("changed since the agent started: GPU index 0 is %s/nvidia3 now, %s/nvidia0 in the table in use", tr.dev, tr.dev)
	if !strings.Contains(r.Error, want) {
		t.Fatalf("GPU step after the change: %+v, want %q", r, want)
	}
	if recs := tr.rec.Records(audit.EventGPUTableMismatch); len(recs) != 1 || !strings.HasPrefix(recs[0].Error, "table_changed: ") {
		t.Errorf("records %+v, want one table_changed", recs)
	}
	if st, _, err := statefile.Read(state); err != nil || st.GPUTable == nil || !strings.Contains(st.GPUTable.Untrusted, "changed since") {
		t.Errorf("state file after the reload: %+v, %v", st.GPUTable, err)
	}
	n.prints(0, 0, 1, 2, 3)
	if !d.ReloadGPUTable(context.Background()) {
		t.Fatalf("table back as it was, still untrusted: %s", d.Table().Untrusted())
	}
	r, task := n.step(d, 2, "0")
	if r.Error != "" {
		t.Fatalf("GPU step after the table came back: %+v", r)
	}
	tr.expect(task, 0)
}

// TestPrivilegedSlurmdTableExplicitBinary: the slurmd setting names the
// binary run as slurmd -G, where no search would find it.
func TestPrivilegedSlurmdTableExplicitBinary(t *testing.T) {
	tr := newTree(t)
	n := newSlurmdNode(tr, "AutoDetect=nvml\n")
	n.prints(0, 1, 0)
	bin := filepath.Join(n.prefix, "slurm-22.05", "slurmd")
	if err := os.Mkdir(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(n.prefix, "sbin", "slurmd"), bin); err != nil {
		t.Fatal(err)
	}
	d, _ := n.daemon(config.SlurmdGPUTableAuto, func(c *config.Config) { c.Slurmd = bin })
	o := d.Table().Origin()
	if o.Source != "slurmd -G" || !strings.HasPrefix(o.Slurmd, bin+" -G ") || d.Table().Untrusted() != "" {
		t.Fatalf("origin %+v, untrusted %q", o, d.Table().Untrusted())
	}
	r, task := n.step(d, 1, "0")
	if r.Error != "" {
		t.Fatalf("step 1.0: %+v", r)
	}
	tr.expect(task, 1)
}

// TestPrivilegedSlurmdTableLate: the boot order of the packaged unit on an
// AutoDetect node: slurmd -G fails at the agent's start, then works once
// slurmd runs. The first job's prolog asks again and waits for the answer;
// its step opens slurmd's GPU 0 (nvidia2 here) and nothing else, the
// state file and the audit say the table is slurmd's.
func TestPrivilegedSlurmdTableLate(t *testing.T) {
	tr := newTree(t)
	n := newSlurmdNode(tr, "AutoDetect=nvml\n")
	n.prints(1)
	d, state := n.daemon(config.SlurmdGPUTableAuto)
	if !d.Table().Pending() || d.Table().Untrusted() == "" {
		t.Fatalf("at start: pending %v, untrusted %q", d.Table().Pending(), d.Table().Untrusted())
	}
	n.prints(0, 2, 3, 0, 1) // slurmd runs now
	r, task := n.step(d, 1, "0")
	if r.Error != "" || len(r.Gpus) != 1 || r.Gpus[0] != 0 {
		t.Fatalf("step 1.0: %+v", r)
	}
	tr.expect(task, 2)
	if o := d.Table().Origin(); o.Source != "slurmd -G" || d.Table().Pending() {
		t.Fatalf("origin %+v, pending %v", o, d.Table().Pending())
	}
	st, _, err := statefile.Read(state)
	if err != nil || st.GPUTable == nil || st.GPUTable.Source != "slurmd -G" || st.GPUTable.Untrusted != "" || len(st.GPUTable.GPUs) != 4 {
		t.Fatalf("state file gpu_table: %+v, %v", st.GPUTable, err)
	}
	recs := tr.rec.Records(audit.EventGPUTableMismatch)
	if len(recs) != 2 || !strings.HasPrefix(recs[0].Error, "slurmd_failed: ") || !strings.HasPrefix(recs[1].Error, "slurmd_late_switched: ") || recs[1].Severity != audit.SeverityInfo {
		t.Fatalf("gpu_table_mismatch records %+v, want slurmd_failed then slurmd_late_switched", recs)
	}
	// Settled: SIGHUP now rechecks as usual.
	if !d.ReloadGPUTable(context.Background()) {
		t.Fatalf("recheck after the late answer: %s", d.Table().Untrusted())
	}
}
