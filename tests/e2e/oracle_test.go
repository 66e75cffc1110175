// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/tests/cluster"
)

// The differential suite holds gpufence to Slurm's own ConstrainDevices:
// every job shape runs once under ConstrainDevices=yes with no gpufence at
// all (agent stopped, its filter unpinned, the plugin out of plugstack), and
// once under gpufence with ConstrainDevices=no, on the same cluster. Per
// task, the devices that open must be the same, the GPUs expressed as
// positions in the job's own allocation as slurmctld reports it. Every
// difference is either in oracleKnown, with its reason, or fails the test;
// an entry of oracleKnown that no longer differs fails it too.

// Columns of the table.
const (
	colConstrain = "constrain"      // ConstrainDevices=yes, no gpufence
	colGpufence  = "gpufence"       // gpufence, task_binding: step (the default)
	colSlurmBind = "gpufence-slurm" // gpufence, task_binding: slurm, where the agent takes it
)

// oracleDiff is one device that opened in one column and not in the other,
// for one task of one shape.
type oracleDiff struct {
	Layout, Shape, Unit string
	Column              string // the gpufence column compared with colConstrain
	Label               string // "#N" (position N of the allocation), a gres file outside it, or a device name
	Gres                bool   // Label is one of the layout's gres.conf files
	Constrain           bool   // it opened under ConstrainDevices (and not under Column)
	// Shared: under Column the task ran in its step's shared
	// user/task_special cgroup, not in one of its own.
	Shared bool
}

func (d oracleDiff) String() string {
	where := map[bool]string{true: colConstrain + " only", false: d.Column + " only"}[d.Constrain]
	return fmt.Sprintf("%s/%s %s [%s]: %s opens with %s", d.Layout, d.Shape, d.Unit, d.Column, d.Label, where)
}

// oracleKnownDiff is a documented, deliberate difference from
// ConstrainDevices. It explains the differences it matches; each must
// match at least one, or the list has gone stale.
type oracleKnownDiff struct {
	Name    string
	Layouts []string // nil: every layout
	Shapes  []string // nil: every shape
	Columns []string // the gpufence columns it holds for
	Gres    bool     // it is about gres files (GPU positions), else about Devices
	// Own limits a Gres entry to positions of the job's own allocation
	// ("#N"): a GPU outside it is never explained.
	Own     bool
	Devices []string // device labels it covers (Gres false)
	// Constrain is the side that opens: true, ConstrainDevices opens what
	// gpufence denies.
	Constrain bool
	// Shared limits the entry to tasks that ran in their step's shared
	// cgroup under the gpufence column; it can go stale only in a run
	// that had such a task.
	Shared bool
	Reason string
}

func (k oracleKnownDiff) matches(d oracleDiff) bool {
	return (k.Layouts == nil || slices.Contains(k.Layouts, d.Layout)) &&
		(k.Shapes == nil || slices.Contains(k.Shapes, d.Shape)) &&
		slices.Contains(k.Columns, d.Column) &&
		k.Gres == d.Gres && (k.Gres || slices.Contains(k.Devices, d.Label)) &&
		(!k.Own || strings.HasPrefix(d.Label, "#")) &&
		(!k.Shared || d.Shared) &&
		k.Constrain == d.Constrain
}

// bindingShapes are the shapes whose tasks Slurm binds to GPUs of their
// own (--gpus-per-task, --gpu-bind=single/map_gpu/per_task/closest).
var bindingShapes = []string{
	"srun -n2 --gpus-per-task=1",
	"srun -n2 --gpus-per-task=1 --gpu-bind=closest",
	"srun -n2 --gres=gpu:2 --gpu-bind=single:1",
	"srun -n2 --gres=gpu:2 --gpu-bind=map_gpu:1,0",
	"srun -n2 --gpus=2 --gpu-bind=per_task:1",
}

// oracleKnown is the table of documented differences (docs/security.md,
// "Compared with ConstrainDevices").
var oracleKnown = []oracleKnownDiff{
	{
		Name: "per-task binding", Shapes: bindingShapes, Columns: []string{colGpufence}, Gres: true, Own: true, Constrain: false,
		Reason: "task_binding: step (the default) gives every task of a step the step's GPUs; ConstrainDevices narrows each task to " +
			"its bound GPU. NCCL and CUDA IPC between the tasks of a node need the other tasks' GPUs, and the ParallelCluster " +
			"users this is for run without ConstrainDevices today",
	},
	{
		Name: "task_binding: slurm without a task cgroup", Shapes: bindingShapes, Columns: []string{colSlurmBind},
		Gres: true, Own: true, Shared: true, Constrain: false,
		Reason: "ConstrainDevices makes a cgroup per task; Slurm's cgroup/v2 otherwise makes one only when cgroup.conf " +
			"constrains memory (or cores from 25.05) or jobacct_gather/cgroup runs, else every task of a step shares " +
			"user/task_special and task_binding: slurm has nothing to narrow: each task keeps its step's GPUs",
	},
	{
		Name: "GPU minors not in gres.conf", Columns: []string{colGpufence, colSlurmBind}, Devices: []string{"nvidia9"}, Constrain: true,
		Reason: "ConstrainDevices denies only the files gres.conf names; gpufence denies every NVIDIA GPU minor (major 195, " +
			"0-253) a job was not given, so a GPU left out of gres.conf is not open to every job",
	},
	{
		Name: "GPUs the MIG layout leaves out", Layouts: []string{"mig"}, Columns: []string{colGpufence, colSlurmBind},
		Devices: []string{"nvidia2", "nvidia3"}, Constrain: true,
		Reason: "the same rule: in the MIG layout gres.conf names GPUs 0 and 1 only",
	},
	{
		Name: "MIG capability nodes not in gres.conf", Columns: []string{colGpufence, colSlurmBind},
		Devices: capsLabels(cluster.MIGAdminCaps), Constrain: true,
		Reason: "the MIG config and monitor capabilities (nvidia-cap1, nvidia-cap2) create and watch every GPU instance; " +
			"ConstrainDevices leaves them open to every job, gpufence to none",
	},
	{
		Name: "MIG capability nodes outside the MIG layout", Layouts: []string{"plain", "shard", "mps"},
		Columns: []string{colGpufence, colSlurmBind}, Devices: capsLabels(sliceCaps()), Constrain: true,
		Reason: "with no MIG record in gres.conf ConstrainDevices leaves every nvidia-caps node open; gpufence opens a " +
			"slice's access capabilities only to a job holding that slice",
	},
	{
		Name: "NVSwitch and NVLink management nodes", Columns: []string{colGpufence, colSlurmBind},
		Devices: []string{"nvidia-nvswitchctl", "nvidia-nvswitch0", "nvidia-nvlink"}, Constrain: true,
		Reason: "fabric management nodes reconfigure the NVLink fabric of every job on the node; ConstrainDevices " +
			"leaves them open, gpufence denies them to jobs (fabric_management: allow opens them)",
	},
}

func capsLabels(minors []uint32) []string {
	var l []string
	for _, m := range minors {
		l = append(l, fmt.Sprintf("nvidia-cap%d", m))
	}
	return l
}

func sliceCaps() []uint32 {
	var m []uint32
	for _, s := range cluster.MIGSlices {
		m = append(m, s.Caps...)
	}
	return m
}

// oracleExplain sorts differences into explained and not, and returns the
// known entries that explained none.
// shared says whether a task of shape ran in its step's shared cgroup
// under column.
func oracleExplain(known []oracleKnownDiff, diffs []oracleDiff, columns []string, layouts, shapes map[string]bool, shared func(column, shape string) bool) (unexplained []oracleDiff, used map[string]int, stale []string) {
	used = map[string]int{}
	for _, d := range diffs {
		i := slices.IndexFunc(known, func(k oracleKnownDiff) bool { return k.matches(d) })
		if i < 0 {
			unexplained = append(unexplained, d)
			continue
		}
		used[known[i].Name]++
	}
	for _, k := range known {
		if used[k.Name] > 0 || !oracleApplies(k, columns, layouts, shapes, shared) {
			continue
		}
		stale = append(stale, k.Name)
	}
	return unexplained, used, stale
}

// oracleApplies says whether a run covered some of what k is about: a run
// without the column, layout or shape cannot show that k went stale.
func oracleApplies(k oracleKnownDiff, columns []string, layouts, shapes map[string]bool, shared func(column, shape string) bool) bool {
	hit := func(want []string, ran map[string]bool) bool {
		if want == nil {
			return len(ran) > 0
		}
		return slices.ContainsFunc(want, func(s string) bool { return ran[s] })
	}
	sharedHit := !k.Shared
	for _, c := range k.Columns {
		for sh := range shapes {
			if k.Shapes == nil || slices.Contains(k.Shapes, sh) {
				sharedHit = sharedHit || shared(c, sh)
			}
		}
	}
	return slices.ContainsFunc(k.Columns, func(c string) bool { return slices.Contains(columns, c) }) &&
		hit(k.Layouts, layouts) && hit(k.Shapes, shapes) && sharedHit
}

// oracleCompare lists the differences between the constrain column and
// another one: per unit, the labels that opened in only one of them. A
// unit present in one column only is an error. shared says which units
// ran in their step's shared cgroup under column.
func oracleCompare(layout, shape, column string, constrain, other map[string]map[string]bool, gres func(string) bool, shared map[string]bool) ([]oracleDiff, error) {
	var diffs []oracleDiff
	for u := range other {
		if _, ok := constrain[u]; !ok {
			return nil, fmt.Errorf("%s/%s: unit %q ran under %s only", layout, shape, u, column)
		}
	}
	for _, u := range sortedKeys(constrain) {
		o, ok := other[u]
		if !ok {
			return nil, fmt.Errorf("%s/%s: unit %q ran under %s only", layout, shape, u, colConstrain)
		}
		c := constrain[u]
		for _, l := range sortedKeys(union(c, o)) {
			if c[l] != o[l] {
				diffs = append(diffs, oracleDiff{Layout: layout, Shape: shape, Unit: u, Column: column, Label: l, Gres: gres(l), Constrain: c[l], Shared: shared[u]})
			}
		}
	}
	return diffs, nil
}

func union(a, b map[string]bool) map[string]bool {
	u := map[string]bool{}
	for k, v := range a {
		u[k] = v
	}
	for k, v := range b {
		u[k] = u[k] || v
	}
	return u
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}

// oracleLabels names what a task opened: the files of the layout's gres
// records as positions in the job's allocation ("#0" is the allocation's
// first record), a gres file no allocated record holds by its name, any
// other device by its name. records[i] are the files of gres record i;
// alloc the job's records from slurmctld, in its order.
func oracleLabels(open map[string]bool, records [][]string, alloc []int) map[string]bool {
	out := map[string]bool{}
	for path, ok := range open {
		if !ok {
			continue
		}
		var pos []int
		for p, r := range alloc {
			if r >= 0 && r < len(records) && slices.Contains(records[r], path) {
				pos = append(pos, p)
			}
		}
		if len(pos) == 0 {
			out[filepath.Base(path)] = true
			continue
		}
		for _, p := range pos {
			out["#"+strconv.Itoa(p)] = true
		}
	}
	return out
}

func TestOracleLabels(t *testing.T) {
	plain := [][]string{{"/d/nvidia0"}, {"/d/nvidia1"}, {"/d/nvidia2"}, {"/d/nvidia3"}}
	mig := [][]string{{"/d/nvidia0"}, {"/d/nvidia1", "/d/caps/nvidia-cap138"}, {"/d/nvidia1", "/d/caps/nvidia-cap147"}}
	for _, c := range []struct {
		name    string
		open    []string
		records [][]string
		alloc   []int
		want    []string
	}{
		{"own two", []string{"/d/nvidia1", "/d/nvidia3", "/d/nvidiactl"}, plain, []int{1, 3}, []string{"#0", "#1", "nvidiactl"}},
		{"one outside", []string{"/d/nvidia2"}, plain, []int{1}, []string{"nvidia2"}},
		{"cpu-only", []string{"/d/nvidiactl"}, plain, nil, []string{"nvidiactl"}},
		{"slice", []string{"/d/nvidia1", "/d/caps/nvidia-cap147"}, mig, []int{2}, []string{"#0"}},
		{"other slice's cap", []string{"/d/nvidia1", "/d/caps/nvidia-cap138"}, mig, []int{2}, []string{"#0", "nvidia-cap138"}},
	} {
		open := map[string]bool{}
		for _, p := range c.open {
			open[p] = true
		}
		open["/d/denied"] = false
		got := sortedKeys(oracleLabels(open, c.records, c.alloc))
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestOracleExplain(t *testing.T) {
	set := func(l ...string) map[string]bool {
		m := map[string]bool{}
		for _, s := range l {
			m[s] = true
		}
		return m
	}
	gres := func(l string) bool { return strings.HasPrefix(l, "#") }
	known := []oracleKnownDiff{
		{Name: "binding", Shapes: []string{"bind"}, Columns: []string{colGpufence}, Gres: true, Own: true},
		{Name: "ctl", Columns: []string{colGpufence}, Devices: []string{"nvidia9"}, Constrain: true},
		{Name: "shared", Shapes: []string{"bind"}, Columns: []string{colSlurmBind}, Gres: true, Own: true, Shared: true},
	}
	cons := map[string]map[string]bool{"task 0": set("#0", "nvidia9"), "task 1": set("#1", "nvidia9")}
	bound := map[string]map[string]bool{"task 0": set("#0", "#1"), "task 1": set("#0", "#1")}
	same := map[string]map[string]bool{"task 0": set("#0"), "task 1": set("#1")}
	shapes := map[string]bool{"bind": true}
	noShared := func(string, string) bool { return false }
	layouts := map[string]bool{"plain": true}

	d, err := oracleCompare("plain", "bind", colGpufence, cons, bound, gres, nil)
	if err != nil {
		t.Fatal(err)
	}
	un, used, stale := oracleExplain(known, d, []string{colGpufence}, layouts, shapes, noShared)
	if len(d) != 4 || len(un) != 0 || used["binding"] != 2 || used["ctl"] != 2 || len(stale) != 0 {
		t.Errorf("binding differences: %v unexplained %v used %v stale %v", d, un, used, stale)
	}
	// The binding no longer differs: its entry is stale.
	d, _ = oracleCompare("plain", "bind", colGpufence, cons, same, gres, nil)
	if _, _, stale = oracleExplain(known, d, []string{colGpufence}, layouts, shapes, noShared); !slices.Equal(stale, []string{"binding"}) {
		t.Errorf("stale %v, want [binding]", stale)
	}
	// The same difference in another column, or the other way round, is
	// not explained.
	d, _ = oracleCompare("plain", "bind", colSlurmBind, cons, bound, gres, nil)
	if un, _, _ = oracleExplain(known, d, []string{colSlurmBind}, layouts, shapes, noShared); len(un) != 4 {
		t.Errorf("task_binding: slurm differences %v unexplained %v, want all 4", d, un)
	}
	d, _ = oracleCompare("plain", "bind", colGpufence, bound, cons, gres, nil)
	if un, _, _ = oracleExplain(known, d, []string{colGpufence}, layouts, shapes, noShared); len(un) != 4 {
		t.Errorf("reversed differences %v unexplained %v, want all 4", d, un)
	}
	// A GPU outside the allocation in a binding shape is no binding
	// matter.
	wide := map[string]map[string]bool{"task 0": set("#0", "nvidia3", "nvidia9"), "task 1": set("#1", "nvidia9")}
	d, _ = oracleCompare("plain", "bind", colGpufence, cons, wide, func(l string) bool { return gres(l) || l == "nvidia3" }, nil)
	if un, _, _ = oracleExplain(known, d, []string{colGpufence}, layouts, shapes, noShared); len(un) != 1 || un[0].Label != "nvidia3" {
		t.Errorf("a foreign GPU in a binding shape: unexplained %v, want nvidia3 only", un)
	}
	if _, err := oracleCompare("plain", "bind", colGpufence, cons, map[string]map[string]bool{"task 0": set()}, gres, nil); err == nil {
		t.Error("a unit missing from one column compared without error")
	}
	// task_binding: slurm: a task in its step's shared cgroup is
	// explained, one in a cgroup of its own is not; the entry goes stale
	// only in a run that had a task in the shared cgroup.
	d, _ = oracleCompare("plain", "bind", colSlurmBind, cons, bound, gres, map[string]bool{"task 0": true})
	un, used, _ = oracleExplain(known, d, []string{colSlurmBind}, layouts, shapes, noShared)
	if len(un) != 3 || used["shared"] != 1 {
		t.Errorf("task_binding: slurm, task 0 shared: unexplained %v used %v, want task 0's #1 explained", un, used)
	}
	d, _ = oracleCompare("plain", "bind", colSlurmBind, cons, same, gres, nil)
	if _, _, stale = oracleExplain(known, d, []string{colSlurmBind}, layouts, shapes, noShared); len(stale) != 0 {
		t.Errorf("stale %v with no task in a shared cgroup", stale)
	}
	sharedRan := func(c, sh string) bool { return c == colSlurmBind && sh == "bind" }
	if _, _, stale = oracleExplain(known, d, []string{colSlurmBind}, layouts, shapes, sharedRan); !slices.Equal(stale, []string{"shared"}) {
		t.Errorf("stale %v, want [shared]: a task in the shared cgroup opened its own GPU only", stale)
	}
	// A column the run did not have cannot make an entry stale.
	if _, _, stale = oracleExplain(known, nil, []string{colSlurmBind}, layouts, shapes, noShared); len(stale) != 0 {
		t.Errorf("stale %v in a run without the gpufence column", stale)
	}
}

// oracleShape is one job shape: how it launches, in which gres layout.
type oracleShape struct {
	Name   string
	Layout string // plain, shard, mps, mig
	Kind   string // srun, sbatch, salloc
	// Job is the job's own options; Steps the options of each srun step
	// started in it (batch and salloc shapes), or of the one srun (srun
	// shapes).
	Job   []string
	Steps [][]string
	// Env is set in srun's or sbatch's environment: forged GPU variables.
	Env    []string
	Extern bool // salloc: probe from the extern step too (pam_slurm_adopt's way in)
	// Hold is the number of whole GPUs another job holds meanwhile, so that
	// this job's allocation does not start at GPU 0.
	Hold int
}

func oracleShapes() []oracleShape {
	srun := func(layout string, args ...string) oracleShape {
		return oracleShape{Name: strings.Join(append([]string{"srun"}, args...), " "), Layout: layout, Kind: "srun", Steps: [][]string{args}}
	}
	sh := []oracleShape{
		srun("plain", "--gres=gpu:1"),
		srun("plain", "--gres=gpu:2"),
		srun("plain", "--gres=gpu:4"),
		srun("plain", "--gpus=2"),
		srun("plain", "-n2", "--gres=gpu:1"),
		srun("plain"),
		srun("plain", "-n2", "--gres=gpu:2", "--gpu-bind=none"),
		{Name: "sbatch cpu-only", Layout: "plain", Kind: "sbatch"},
		{Name: "sbatch --gres=gpu:2, steps gpu:1 and all", Layout: "plain", Kind: "sbatch", Job: []string{"--gres=gpu:2"},
			Steps: [][]string{{"--gres=gpu:1"}, {}}},
		{Name: "salloc --gres=gpu:2, steps and extern", Layout: "plain", Kind: "salloc", Job: []string{"--gres=gpu:2"},
			Steps: [][]string{{"--gres=gpu:1"}, {"--gres=gpu:2"}}, Extern: true},
		{Name: "sbatch --gres=shard:5", Layout: "shard", Kind: "sbatch", Job: []string{"--gres=shard:5"}, Steps: [][]string{{}}},
		{Name: "salloc --gres=shard:3, extern", Layout: "shard", Kind: "salloc", Job: []string{"--gres=shard:3"}, Steps: [][]string{{}}, Extern: true},
		{Name: "sbatch --gres=mps:50", Layout: "mps", Kind: "sbatch", Job: []string{"--gres=mps:50"}, Steps: [][]string{{}}},
		srun("mig", "--gres=gpu:1g.10gb:1"),
		srun("mig", "--gres=gpu:1g.10gb:2"),
		srun("mig", "--gres=gpu:a100:1"),
	}
	for _, b := range bindingShapes {
		sh = append(sh, srun("plain", strings.Fields(b)[1:]...))
	}
	// One core each for the holder and the job: this machine has two, so
	// no two-task shape runs beside a holder.
	held := srun("plain", "--gres=gpu:1")
	held.Name, held.Hold = "srun --gres=gpu:1, GPUs 0-1 held", 2
	forged := srun("plain", "--gres=gpu:1")
	forged.Name, forged.Hold = "srun --gres=gpu:1, GPUs 0-1 held, forged variables", 2
	forged.Env = forgedGPUVars
	forgedBatch := oracleShape{Name: "sbatch --gres=gpu:1, GPU 0 held, forged variables, step", Layout: "plain", Kind: "sbatch",
		Job: []string{"--gres=gpu:1"}, Steps: [][]string{{}}, Hold: 1, Env: forgedGPUVars}
	sh = append(sh, held, forged, forgedBatch,
		oracleShape{Name: "sbatch --gres=gpu:2, GPU 0 held, steps gpu:1 and all", Layout: "plain", Kind: "sbatch", Job: []string{"--gres=gpu:2"},
			Steps: [][]string{{"--gres=gpu:1"}, {}}, Hold: 1},
		oracleShape{Name: "sbatch --gres=shard:5, GPUs 0-2 held", Layout: "shard", Kind: "sbatch", Job: []string{"--gres=shard:5"},
			Steps: [][]string{{}}, Hold: 3},
		oracleShape{Name: "sbatch --gres=mps:50, GPUs 0-2 held", Layout: "mps", Kind: "sbatch", Job: []string{"--gres=mps:50"},
			Steps: [][]string{{}}, Hold: 3})
	return sh
}

// forgedGPUVars claim every GPU of the node.
var forgedGPUVars = []string{"SLURM_JOB_GPUS=0,1,2,3", "SLURM_STEP_GPUS=0,1,2,3", "CUDA_VISIBLE_DEVICES=0,1,2,3", "GPU_DEVICE_ORDINAL=0,1,2,3"}

// oracleRun is one run of the suite on one cluster.
type oracleRun struct {
	st *suite
	// paths are every device each task probes; records[layout] the files
	// of each gres record of that layout, in gres.conf order.
	paths   []string
	records map[string][][]string
	// results[layout][shape][column][unit] are the labels that opened.
	results map[string]map[string]map[string]map[string]map[string]bool
	// allocs[layout][shape][column] is slurmctld's allocation, for the table.
	allocs map[string]map[string]map[string]string
	// shared[layout/shape/column][unit]: the task ran in its step's shared
	// user/task_special cgroup.
	shared map[string]map[string]bool
	seq    int
	// fabricYAML tells the agent the fake NVSwitch and NVLink majors.
	fabricYAML string
}

func (o *oracleRun) put(layout, shape, column string, alloc string, units map[string]map[string]bool) {
	if o.results[layout] == nil {
		o.results[layout] = map[string]map[string]map[string]map[string]bool{}
		o.allocs[layout] = map[string]map[string]string{}
	}
	if o.results[layout][shape] == nil {
		o.results[layout][shape] = map[string]map[string]map[string]bool{}
		o.allocs[layout][shape] = map[string]string{}
	}
	o.results[layout][shape][column] = units
	o.allocs[layout][shape][column] = alloc
}

// oracleAlloc is slurmctld's view of one running job found by name: its
// id and the gres records it holds, in slurmctld's order.
func (st *suite) oracleAlloc(t *testing.T, name string) (string, []int, string) {
	t.Helper()
	r := st.c.Run(st.ctx, "", "squeue", "-h", "-n", name, "-t", "R", "-o", "%i")
	mustOK(t, r)
	ids := strings.Fields(r.Stdout)
	if len(ids) != 1 {
		t.Fatalf("squeue finds %d running jobs named %s: %q", len(ids), name, r.Stdout)
	}
	id, err := strconv.ParseUint(ids[0], 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := st.sharedAllocated(t)[uint32(id)]
	if !ok {
		t.Fatalf("job %s (%s) is not running in squeue --json", ids[0], name)
	}
	return ids[0], a.GPUs(), strings.Join(a.Detail, ";")
}

// labeled splits `srun -l` output by task and parses each task's probe.
var taskLabel = regexp.MustCompile(`^\s*(\d+): (.*)$`)

func (o *oracleRun) perTask(t *testing.T, out, prefix string, into map[string]cluster.OpenReport) {
	t.Helper()
	lines := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if m := taskLabel.FindStringSubmatch(l); m != nil {
			lines[m[1]] = append(lines[m[1]], m[2])
		}
	}
	if len(lines) == 0 {
		t.Fatalf("%s: no task printed anything:\n%s", prefix, out)
	}
	for task, l := range lines {
		into[prefix+"task "+task] = cluster.ParseOpen(strings.Join(l, "\n"))
	}
}

// runShape runs one shape once and returns, per task, what it opened.
func (o *oracleRun) runShape(t *testing.T, sh oracleShape, column string) {
	t.Helper()
	st := o.st
	o.seq++
	name := fmt.Sprintf("oracle-%d", o.seq)
	dir := filepath.Join(st.c.Root(), "work", fmt.Sprintf("%s-%d", name, time.Now().UnixNano()))
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if sh.Hold > 0 {
		release := st.hold(t, sh.Hold)
		defer release()
	}
	probe := st.open + " -env " + strings.Join(o.paths, " ")
	gate := fmt.Sprintf("touch %[1]s/started; while [ ! -e %[1]s/go ]; do sleep 0.05; done", dir)
	reps := map[string]cluster.OpenReport{}
	var id, detail string
	var alloc []int
	// started waits for the job's gate, or for the launch to end early.
	started := func(done <-chan struct{}) {
		t.Helper()
		deadline := time.After(2 * time.Minute)
		for {
			if _, err := os.Stat(filepath.Join(dir, "started")); err == nil {
				return
			}
			select {
			case <-done:
				return
			case <-deadline:
				t.Fatalf("%s: job never started", sh.Name)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	open := func() {
		if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	switch sh.Kind {
	case "srun":
		args := append([]string{"-J", name, "-l"}, sh.Steps[0]...)
		args = append(args, "sh", "-c", gate+"; exec "+probe)
		var r cluster.Result
		done := make(chan struct{})
		go func() { defer close(done); r = st.c.RunEnv(st.ctx, user, sh.Env, "srun", args...) }()
		started(done)
		if _, err := os.Stat(filepath.Join(dir, "started")); err == nil {
			id, alloc, detail = st.oracleAlloc(t, name)
		}
		open()
		<-done
		mustOK(t, r)
		o.perTask(t, r.Stdout, "", reps)
	case "sbatch":
		script := fmt.Sprintf("#!/bin/sh\n%s\n%s > %s/batch\n", gate, probe, dir)
		for i, s := range sh.Steps {
			script += fmt.Sprintf("srun -l %s %s > %s/step%d\n", strings.Join(s, " "), probe, dir, i)
		}
		f := filepath.Join(dir, "job.sh")
		if err := os.WriteFile(f, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		r := st.c.RunEnv(st.ctx, user, sh.Env, "sbatch", append(append([]string{"--parsable", "-J", name, "-o", dir + "/slurm.out"}, sh.Job...), f)...)
		mustOK(t, r)
		jid := strings.TrimSpace(strings.Split(r.Stdout, ";")[0])
		t.Cleanup(func() { st.c.Run(st.ctx, "", "scancel", jid) })
		started(nil)
		id, alloc, detail = st.oracleAlloc(t, name)
		open()
		state, err := st.c.WaitJob(st.ctx, jid)
		if err != nil || state != "COMPLETED" {
			log, _ := os.ReadFile(dir + "/slurm.out")
			t.Fatalf("%s: job %s %q %v\n%s", sh.Name, jid, state, err, log)
		}
		reps["batch"] = st.readOut(t, dir+"/batch")
		for i, s := range sh.Steps {
			b, err := os.ReadFile(fmt.Sprintf("%s/step%d", dir, i))
			if err != nil {
				t.Fatal(err)
			}
			o.perTask(t, string(b), fmt.Sprintf("step %d (srun %s) ", i, strings.Join(s, " ")), reps)
		}
	case "salloc":
		jid := st.allocate(t, user, append([]string{"-J", name}, sh.Job...)...)
		id, alloc, detail = st.oracleAlloc(t, name)
		if id != strconv.FormatUint(uint64(jid), 10) {
			t.Fatalf("salloc granted %d, squeue names %s", jid, id)
		}
		for i, s := range sh.Steps {
			args := append(append([]string{"--jobid=" + id, "--overlap", "-l"}, s...), strings.Fields(probe)...)
			r := st.c.Run(st.ctx, user, "srun", args...)
			mustOK(t, r)
			o.perTask(t, r.Stdout, fmt.Sprintf("step %d (srun %s) ", i, strings.Join(s, " ")), reps)
		}
		if sh.Extern {
			reps["extern"] = o.inExtern(t, id)
		}
		st.c.Run(st.ctx, "", "scancel", id)
		if _, err := st.c.WaitJob(st.ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if id == "" {
		t.Fatalf("%s: no job id from slurmctld", sh.Name)
	}
	units := map[string]map[string]bool{}
	for u, rep := range reps {
		open := map[string]bool{}
		for _, p := range o.paths {
			switch res := rep.Open[p]; res {
			case "ENXIO", "OK":
				open[p] = true
			case "EPERM":
				open[p] = false
			default:
				t.Fatalf("%s %s: %s gave %q, want ENXIO, OK or EPERM", sh.Name, u, p, res)
			}
		}
		units[u] = oracleLabels(open, o.records[sh.Layout], alloc)
		if strings.HasSuffix(rep.Cgroup, "/user/task_special") {
			k := sh.Layout + "/" + sh.Name + "/" + column
			if o.shared[k] == nil {
				o.shared[k] = map[string]bool{}
			}
			o.shared[k][u] = true
		}
	}
	pos := make([]string, len(alloc))
	for i, a := range alloc {
		pos[i] = strconv.Itoa(a)
	}
	t.Logf("%s [%s]: job %s, slurmctld %q", sh.Name, column, id, detail)
	o.put(sh.Layout, sh.Name, column, "["+strings.Join(pos, ",")+"]", units)
}

// inExtern probes from a populated cgroup of the job's extern step, as
// pam_slurm_adopt places an ssh session there: srun cannot start a task
// in the extern step.
func (o *oracleRun) inExtern(t *testing.T, id string) cluster.OpenReport {
	t.Helper()
	st := o.st
	name, err := st.c.JobDirName(st.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ext := filepath.Join(st.c.ScopeDir(), name, "step_extern")
	// The user leaf (task_special, where 22.05 keeps the extern step's
	// sleep) where it has a process, else slurmstepd's own leaf: 25.11
	// keeps no process in the extern step's user part.
	var leaf string
	for deadline := time.Now().Add(30 * time.Second); leaf == "" && time.Now().Before(deadline); {
		var user, any string
		filepath.Walk(ext, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.IsDir() {
				if b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs")); len(strings.TrimSpace(string(b))) > 0 {
					any = p
					if strings.Contains(strings.TrimPrefix(p, ext), "/user") {
						user = p
					}
				}
			}
			return nil
		})
		if leaf = user; leaf == "" {
			leaf = any
		}
		if leaf == "" {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if leaf == "" {
		t.Fatalf("job %s has no populated cgroup under %s", id, ext)
	}
	t.Logf("job %s: probing from the extern step's %s", id, strings.TrimPrefix(leaf, ext+"/"))
	return st.runInCgroup(t, leaf, o.paths, false)
}

// toConstrain switches the cluster to ConstrainDevices=yes with no
// gpufence: the agent stopped, its pinned filter removed (which detaches
// it), the plugin out of plugstack.
func (o *oracleRun) toConstrain(t *testing.T) {
	t.Helper()
	st := o.st
	st.waitIdle(t)
	if err := st.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	unpin(t, filepath.Join(st.bpffs, "gpufence"))
	if _, err := policyEntries(st.c.ScopeDir()); err == nil {
		t.Fatal("gpufence's filter is still attached to the scope with the agent stopped and its pins removed")
	}
	if err := st.c.WritePlugstack(nil); err != nil {
		t.Fatal(err)
	}
	if err := st.c.RestartSlurmd(true); err != nil {
		t.Fatal(err)
	}
}

// unpin detaches every link pinned in dir (as package removal does: a
// link's last reference may be held elsewhere) and removes the pins.
func unpin(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range ents {
		if l, err := link.LoadPinnedLink(filepath.Join(dir, e.Name()), nil); err == nil {
			if err := l.Detach(); err != nil {
				t.Errorf("detach %s: %v", e.Name(), err)
			}
			l.Close()
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
}

// toGpufence switches the cluster to gpufence with ConstrainDevices=no
// and an agent with yaml. It reports false when the agent refuses yaml
// naming refusedKey (a setting this build does not have); the suite's
// usual agent is then running.
func (o *oracleRun) toGpufence(t *testing.T, yaml, refusedKey string) bool {
	t.Helper()
	st := o.st
	st.waitIdle(t)
	if err := st.c.WritePlugstack([]string{st.plugstackLine()}); err != nil {
		t.Fatal(err)
	}
	if err := st.c.RestartSlurmd(false); err != nil {
		t.Fatal(err)
	}
	if err := st.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := st.startAgent(agentOpts{yaml: yaml}); err != nil {
		b, _ := os.ReadFile(st.agent.Log)
		if refusedKey == "" || st.agent.Alive() || !strings.Contains(string(b), refusedKey) {
			t.Fatalf("agent start: %v\n%s", err, tailLines(string(b), 20))
		}
		t.Logf("this agent refuses %q: %s", strings.TrimSpace(yaml), tailLines(string(b), 3))
		if err := st.startAgent(agentOpts{yaml: o.fabricYAML}); err != nil {
			t.Fatal(err)
		}
		return false
	}
	return true
}

// TestPrivilegedConstrainDevicesOracle is the differential suite.
func TestPrivilegedConstrainDevicesOracle(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	t0 := time.Now()
	o := &oracleRun{st: st, results: map[string]map[string]map[string]map[string]map[string]bool{}, allocs: map[string]map[string]map[string]string{},
		shared: map[string]map[string]bool{}}

	// Devices besides the gres files: a GPU minor gres.conf does not name,
	// and fake NVSwitch and NVLink management nodes of majors the agent is
	// told (as it reads them from /proc/devices on a real node).
	dev := filepath.Join(st.c.Root(), "work", fmt.Sprintf("oracle-dev-%d", time.Now().UnixNano()))
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dev) })
	m := st.unusedMajors(t, 2)
	extra := []struct {
		name         string
		major, minor uint32
	}{{"nvidia9", 195, 9}, {"nvidia-nvswitchctl", m[0], 255}, {"nvidia-nvswitch0", m[0], 0}, {"nvidia-nvlink", m[1], 0}}
	var extraPaths []string
	for _, e := range extra {
		p := filepath.Join(dev, e.name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(e.major, e.minor))); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		if err := os.Chmod(p, 0o666); err != nil {
			t.Fatal(err)
		}
		extraPaths = append(extraPaths, p)
	}
	o.fabricYAML = fmt.Sprintf("nvswitch_major: %d\nnvlink_major: %d\n", m[0], m[1])
	rootDev := func(n string) string { return filepath.Join(st.c.Root(), "dev", n) }
	o.paths = append(append([]string{}, st.c.DevPaths()...), st.c.CtlPath(), rootDev("nvidia-modeset"), rootDev("nvidia-uvm"), rootDev("nvidia-uvm-tools"))
	for _, c := range append(slices.Clone(cluster.MIGAdminCaps), sliceCaps()...) {
		o.paths = append(o.paths, st.c.CapsPath(c))
	}
	o.paths = append(append(o.paths, extraPaths...), "/dev/null", "/dev/zero")
	perGPU := make([][]string, 4)
	for i := range perGPU {
		perGPU[i] = []string{st.c.DevPath(i)}
	}
	migRecords := [][]string{{st.c.DevPath(0)}}
	for _, s := range cluster.MIGSlices {
		r := []string{st.c.DevPath(s.GPU)}
		for _, c := range s.Caps {
			r = append(r, st.c.CapsPath(c))
		}
		migRecords = append(migRecords, r)
	}
	o.records = map[string][][]string{"plain": perGPU, "shard": perGPU, "mps": perGPU, "mig": migRecords}
	gresFile := map[string]map[string]bool{}
	for layout, recs := range o.records {
		gresFile[layout] = map[string]bool{}
		for _, r := range recs {
			for _, f := range r {
				gresFile[layout][filepath.Base(f)] = true
			}
		}
	}

	// Back to the suite's usual cluster, whatever failed: first the jobs a
	// failed shape left (t.Cleanup would cancel them only after this).
	defer func() {
		st.c.Run(st.ctx, "", "scancel", "-u", user)
		st.waitIdle(t)
		if err := st.c.SetMIG(false); err != nil {
			t.Error(err)
		}
		if err := st.c.SetShared(""); err != nil {
			t.Error(err)
		}
		if err := st.c.WritePlugstack([]string{st.plugstackLine()}); err != nil {
			t.Error(err)
		}
		if err := st.c.RestartSlurmd(false); err != nil {
			t.Error(err)
		}
		if err := st.agent.Stop(); err != nil {
			t.Error(err)
		}
		if err := st.startAgent(); err != nil {
			t.Error(err)
		}
	}()

	columns := []string{colConstrain, colGpufence}
	slurmBind := true
	timing := map[string]time.Duration{}
	layouts, shapesRan := map[string]bool{}, map[string]bool{}
	for _, layout := range []string{"plain", "shard", "mps", "mig"} {
		var shapes []oracleShape
		for _, sh := range oracleShapes() {
			if sh.Layout == layout {
				shapes = append(shapes, sh)
			}
		}
		tl := time.Now()
		st.waitIdle(t)
		switch layout {
		case "shard", "mps":
			if err := st.c.SetShared(layout); err != nil {
				t.Fatal(err)
			}
		case "mig":
			if err := st.c.SetShared(""); err != nil {
				t.Fatal(err)
			}
			if err := st.c.SetMIG(true); err != nil {
				t.Fatal(err)
			}
		}
		run := func(column string) {
			for _, sh := range shapes {
				o.runShape(t, sh, column)
				shapesRan[sh.Name] = true
			}
		}
		o.toConstrain(t)
		run(colConstrain)
		o.toGpufence(t, o.fabricYAML, "")
		run(colGpufence)
		if slurmBind && layout == "plain" {
			// task_binding: slurm is another change's; where the agent
			// takes it, its column must match ConstrainDevices on the
			// binding shapes too.
			if slurmBind = o.toGpufence(t, o.fabricYAML+"task_binding: slurm\n", "task_binding"); slurmBind {
				columns = append(columns, colSlurmBind)
				run(colSlurmBind)
			}
		} else if slurmBind && slices.Contains(columns, colSlurmBind) {
			o.toGpufence(t, o.fabricYAML+"task_binding: slurm\n", "")
			run(colSlurmBind)
		}
		layouts[layout] = true
		timing[layout] = time.Since(tl)
	}

	var diffs []oracleDiff
	var table strings.Builder
	fmt.Fprintf(&table, "Slurm %s: devices each task opened; #N is position N of the job's allocation (slurmctld); * the task ran in user/task_special\n", st.c.SlurmVersion())
	fmt.Fprintf(&table, "%-6s %-58s %-34s %-10s", "layout", "shape", "task", "allocation")
	for _, c := range columns {
		fmt.Fprintf(&table, " %-16s", c)
	}
	table.WriteString("\n")
	// others[column][device] counts the tasks the device opened in.
	others := map[string]map[string]int{}
	tasks := 0
	for _, layout := range []string{"plain", "shard", "mps", "mig"} {
		for _, sh := range oracleShapes() {
			res := o.results[layout][sh.Name]
			if sh.Layout != layout || res == nil {
				continue
			}
			isGres := func(l string) bool { return strings.HasPrefix(l, "#") || gresFile[layout][l] }
			for _, c := range columns[1:] {
				d, err := oracleCompare(layout, sh.Name, c, res[colConstrain], res[c], isGres, o.shared[layout+"/"+sh.Name+"/"+c])
				if err != nil {
					t.Error(err)
				}
				diffs = append(diffs, d...)
			}
			for _, u := range sortedKeys(res[colConstrain]) {
				tasks++
				fmt.Fprintf(&table, "%-6s %-58s %-34s %-10s", layout, sh.Name, u, o.allocs[layout][sh.Name][colConstrain])
				for _, c := range columns {
					var g []string
					for _, l := range sortedKeys(res[c][u]) {
						if isGres(l) {
							g = append(g, l)
						}
						if !isGres(l) {
							if others[c] == nil {
								others[c] = map[string]int{}
							}
							others[c][l]++
						}
					}
					cell := "{" + strings.Join(g, ",") + "}"
					if c != colConstrain && o.shared[layout+"/"+sh.Name+"/"+c][u] {
						cell += "*"
					}
					fmt.Fprintf(&table, " %-16s", cell)
				}
				table.WriteString("\n")
			}
		}
	}
	fmt.Fprintf(&table, "devices outside the job's gres files: in how many of the %d tasks each opened\n%-20s", tasks, "device")
	for _, c := range columns {
		fmt.Fprintf(&table, " %-16s", c)
	}
	table.WriteString("\n")
	all := map[string]int{}
	for _, c := range columns {
		for d := range others[c] {
			all[d]++
		}
	}
	for _, d := range sortedKeys(all) {
		fmt.Fprintf(&table, "%-20s", d)
		for _, c := range columns {
			fmt.Fprintf(&table, " %-16d", others[c][d])
		}
		table.WriteString("\n")
	}
	t.Logf("\n%s", table.String())

	sharedRan := func(column, shape string) bool {
		for l := range layouts {
			if len(o.shared[l+"/"+shape+"/"+column]) > 0 {
				return true
			}
		}
		return false
	}
	unexplained, used, stale := oracleExplain(oracleKnown, diffs, columns[1:], layouts, shapesRan, sharedRan)
	for _, d := range unexplained {
		t.Errorf("undocumented difference from ConstrainDevices: %s", d)
	}
	for _, k := range stale {
		t.Errorf("documented difference %q no longer differs: remove it from oracleKnown and docs/security.md", k)
	}
	var known []string
	for _, k := range oracleKnown {
		known = append(known, fmt.Sprintf("%s: %d", k.Name, used[k.Name]))
	}
	var times []string
	for _, l := range []string{"plain", "shard", "mps", "mig"} {
		times = append(times, fmt.Sprintf("%s %s", l, timing[l].Round(time.Second)))
	}
	t.Logf("Slurm %s: %d differences, %d documented (%s), %d undocumented; columns %v; took %s (%s)",
		st.c.SlurmVersion(), len(diffs), len(diffs)-len(unexplained), strings.Join(known, ", "), len(unexplained), columns,
		time.Since(t0).Round(time.Second), strings.Join(times, ", "))
}
