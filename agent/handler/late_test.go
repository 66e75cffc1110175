// SPDX-License-Identifier: Apache-2.0

package handler

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/gputable"
	"github.com/gpufence/gpufence/agent/slurm"
)

// files is a table of whole GPUs of these minors in index order; the files
// do not exist, so their minors come from their names.
func files(minors ...int) []slurm.GPU {
	var out []slurm.GPU
	for i, m := range minors {
		p := "/nonexistent/dev/nvidia" + string(rune('0'+m))
		out = append(out, slurm.GPU{Index: i, Path: p, Files: []string{p}})
	}
	return out
}

var errBoot = errors.New("slurmd -G: exit status 1: fatal: Unable to initialize cgroup plugin")

// lateEnv is an env whose GPU table is a real one made while slurmd -G
// failed (start), and slurmd's late answers are ask's.
func lateEnv(t *testing.T, start gputable.Input, ask func() gputable.Input) (*env, *gputable.Table, *gputable.Late) {
	tab, err := gputable.Build(start, 195, 0)
	if err != nil {
		t.Fatal(err)
	}
	var l *gputable.Late
	v := newEnv(t, func(v *env) {
		l = &gputable.Late{Table: tab, Ask: func(context.Context) gputable.Input { return ask() }, Held: v.reg.HoldsGPUs,
			Recorder: v.rec, Log: v.h.Log, First: 10 * time.Millisecond, Max: 10 * time.Millisecond}
		v.h.Table, v.h.Late = tab, l
		v.h.Recovery.Table = tab
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l.Start(ctx)
	return v, tab, l
}

// TestLateAutoDetectBoot: an AutoDetect node whose agent started before
// slurmd has no table; the first job's prolog asks slurmd, waits for its
// answer and is recorded against it, and its step opens slurmd's GPU 0,
// which is /dev/nvidia2 here.
func TestLateAutoDetectBoot(t *testing.T) {
	auto := gputable.Input{Gres: slurm.GresConf{AutoDetect: "nvml"}, GresErr: slurm.ErrNoGPUs}
	start := auto
	start.SlurmdErr = errBoot
	var asked atomic.Int32
	v, tab, _ := lateEnv(t, start, func() gputable.Input {
		asked.Add(1)
		in := auto
		in.Slurmd = slurm.SlurmdView{GPUs: files(2, 3, 0, 1), Command: "/usr/sbin/slurmd -G"}
		return in
	})
	if tab.Untrusted() == "" || !tab.Pending() {
		t.Fatalf("at start: untrusted %q, pending %v", tab.Untrusted(), tab.Pending())
	}
	// A CPU-only step does not wait.
	v.prolog(1, 1000, nil)
	if r := v.mustStart(1, 0, 1000, nil); len(r.Gpus) != 0 {
		t.Fatalf("cpu-only step got %v", r.Gpus)
	}
	v.prolog(2, 1000, str("0"))
	if j, _ := v.reg.Job(2); j.Broken != "" || len(j.GPUs) != 1 {
		t.Fatalf("job 2 recorded as %+v", j)
	}
	r := v.mustStart(2, 0, 1000, str("0"))
	if len(r.Gpus) != 1 || r.Gpus[0] != 0 {
		t.Fatalf("step 2.0 got %v", r.Gpus)
	}
	if p, _ := v.entry(stepDir(2, 0)); !same(p.GPUMinors, []uint32{2}) {
		t.Fatalf("step 2.0's entry %+v, want slurmd's GPU 0 = minor 2", p)
	}
	if o := tab.Origin(); o.Source != gputable.SourceSlurmd || tab.Pending() {
		t.Fatalf("origin %+v, pending %v", o, tab.Pending())
	}
	if !strings.Contains(v.logs.String(), `msg="GPU table settled by slurmd's late answer" outcome=switched source="slurmd -G" gpus=4`) {
		t.Errorf("log:\n%s", v.logs)
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("slurmd asked %d times, want 1", n)
	}
}

// TestLateAfterJobHoldsGPUs: without AutoDetect, gres.conf's table gives
// GPUs while slurmd -G fails; slurmd then answers with another table. The
// table stays (a step's entry was made from it), that step keeps its
// entry, and a new GPU step is refused until the agent restarts; CPU-only
// steps still run.
func TestLateAfterJobHoldsGPUs(t *testing.T) {
	gres := gputable.Input{Gres: slurm.GresConf{GPUs: files(0, 1, 2, 3)}}
	start := gres
	start.SlurmdErr = errBoot
	var answer atomic.Bool
	v, tab, l := lateEnv(t, start, func() gputable.Input {
		if !answer.Load() {
			return start
		}
		in := gres
		in.Slurmd = slurm.SlurmdView{GPUs: files(1, 0, 2, 3)}
		return in
	})
	v.prolog(1, 1000, str("0"))
	v.mustStart(1, 0, 1000, str("0")) // slurmd -G failed again: gres.conf's table, as at start
	if p, _ := v.entry(stepDir(1, 0)); !same(p.GPUMinors, []uint32{0}) || !tab.Pending() {
		t.Fatalf("step 1.0's entry %+v, pending %v", p, tab.Pending())
	}
	answer.Store(true)
	time.Sleep(20 * time.Millisecond) // the pause after the failure
	l.Kick(false)
	for end := time.Now().Add(5 * time.Second); tab.Pending() && time.Now().Before(end); time.Sleep(time.Millisecond) {
	}
	if tab.Pending() || !strings.Contains(tab.Untrusted(), "until the agent restarts") {
		t.Fatalf("pending %v, untrusted %q", tab.Pending(), tab.Untrusted())
	}
	v.prolog(2, 1000, str("1"))
	r := v.start(v.stepd(2, 0), 2, 0, 1000, str("1"))
	if !strings.Contains(r.Error, "answered late with another table than the one in use, while jobs hold GPUs from it") {
		t.Fatalf("step 2.0: %+v", r)
	}
	if _, ok := v.entry(stepDir(2, 0)); ok {
		t.Error("the refused step has an entry")
	}
	if p, _ := v.entry(stepDir(1, 0)); !same(p.GPUMinors, []uint32{0}) {
		t.Errorf("step 1.0's entry is now %+v", p)
	}
	if r := v.start(v.stepd(2, 1), 2, 1, 1000, nil); r.Error != "" {
		t.Errorf("cpu-only step refused: %s", r.Error)
	}
	if !strings.Contains(v.logs.String(), "outcome=kept") {
		t.Errorf("log:\n%s", v.logs)
	}
}

// autoDetectBoot is an AutoDetect node booted while slurmd -G failed:
// slurmd answers (GPU 0 is /dev/nvidia2, minor 2) once answer is set.
func autoDetectBoot(t *testing.T) (*env, *gputable.Table, *gputable.Late, *atomic.Bool) {
	auto := gputable.Input{Gres: slurm.GresConf{AutoDetect: "nvml"}, GresErr: slurm.ErrNoGPUs}
	start := auto
	start.SlurmdErr = errBoot
	answer := new(atomic.Bool)
	v, tab, l := lateEnv(t, start, func() gputable.Input {
		if !answer.Load() {
			return start
		}
		in := auto
		in.Slurmd = slurm.SlurmdView{GPUs: files(2, 3, 0, 1)}
		return in
	})
	return v, tab, l, answer
}

// TestLatePendingProlog: while slurmd -G keeps failing on an AutoDetect
// node, a prolog's GPUs are recorded as given (not a broken job), and its
// GPU step is refused with the table's reason; once slurmd answers, a new
// step of the same job gets its GPU.
func TestLatePendingProlog(t *testing.T) {
	v, tab, l, answer := autoDetectBoot(t)
	v.prolog(1, 1000, str("0"))
	if j, _ := v.reg.Job(1); j.Broken != "" || len(j.GPUs) != 1 {
		t.Fatalf("job 1 recorded as %+v", j)
	}
	r := v.start(v.stepd(1, 0), 1, 0, 1000, str("0"))
	if !strings.Contains(r.Error, "only slurmd knows which device each GPU index is") {
		t.Fatalf("step 1.0 while pending: %+v", r)
	}
	answer.Store(true)
	time.Sleep(20 * time.Millisecond)
	l.Kick(false)
	for end := time.Now().Add(5 * time.Second); tab.Pending() && time.Now().Before(end); time.Sleep(time.Millisecond) {
	}
	v.mustStart(1, 1, 1000, str("0"))
	if p, _ := v.entry(stepDir(1, 1)); !same(p.GPUMinors, []uint32{2}) {
		t.Fatalf("step 1.1's entry %+v, want slurmd's GPU 0 = minor 2", p)
	}
}

// TestLatePendingUnknownGPU: the leniency of TestLatePendingProlog is for
// a table that gives no GPU until slurmd answers (AutoDetect). Where the
// pending table is gres.conf's and trusted, a prolog naming a GPU it lacks
// is a broken job as ever (tests/crash holds this too); and a list
// recorded while pending that still names a GPU the settled table lacks
// refuses the job's steps, even one that asks only for a GPU the table has.
func TestLatePendingUnknownGPU(t *testing.T) {
	t.Run("trusted gres.conf", func(t *testing.T) {
		start := gputable.Input{Gres: slurm.GresConf{GPUs: files(0, 1, 2, 3)}, SlurmdErr: errBoot}
		v, _, _ := lateEnv(t, start, func() gputable.Input { return start })
		v.prolog(1, 1000, str("1,9"))
		if j, _ := v.reg.Job(1); j.Broken == "" {
			t.Fatalf("job 1 with GPU 9 beyond a 4-GPU table recorded as %+v, want broken", j)
		}
		if r := v.start(v.stepd(1, 0), 1, 0, 1000, str("1")); !strings.Contains(r.Error, "GPU 9") {
			t.Fatalf("step 1.0 of a broken job: %+v", r)
		}
	})
	t.Run("AutoDetect, settled without the GPU", func(t *testing.T) {
		v, tab, l, answer := autoDetectBoot(t)
		v.prolog(1, 1000, str("1,9"))
		answer.Store(true)
		time.Sleep(20 * time.Millisecond)
		l.Kick(false)
		for end := time.Now().Add(5 * time.Second); tab.Pending() && time.Now().Before(end); time.Sleep(time.Millisecond) {
		}
		if tab.Pending() {
			t.Fatal("the table did not settle")
		}
		r := v.start(v.stepd(1, 0), 1, 0, 1000, str("1"))
		if !strings.Contains(r.Error, "GPU 9") {
			t.Fatalf("step 1.0 asking GPU 1 of a job given GPUs 1,9 with a 4-GPU table: %+v, want refused naming GPU 9", r)
		}
		if _, ok := v.entry(stepDir(1, 0)); ok {
			t.Fatal("a refused step has a kernel entry")
		}
	})
}
