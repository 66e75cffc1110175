package daemon

import (
	"cmp"
	"slices"

	"github.com/gpufence/gpufence/agent/devices"
)

// Allocation is one job's trusted GPUs on this node: what metrics and
// dcgm-exporter's job mapping attribute a GPU to.
type Allocation struct {
	JobID, UID uint32
	GPUs       []devices.GPU
}

// Observer follows which jobs hold which GPUs.
type Observer interface {
	// Allocations receives the complete set after every change of the
	// daemon's jobs. It is called with the daemon's lock held, so it must
	// only take the value and return.
	Allocations(a []Allocation)
}

// SetObserver registers o and hands it the current jobs (restored ones
// included) at once.
func (d *Daemon) SetObserver(o Observer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.observer = o
	d.publishLocked()
}

// publishLocked hands the observer the jobs that hold GPUs. Jobs without a
// usable trusted list hold none. d.mu is held.
func (d *Daemon) publishLocked() {
	if d.observer == nil {
		return
	}
	out := make([]Allocation, 0, len(d.jobs))
	for _, j := range d.jobs {
		if j.broken != "" || j.noProlog || len(j.GPUs) == 0 {
			continue
		}
		a := Allocation{JobID: j.ID, UID: j.UID}
		for _, g := range j.GPUs {
			if gpu, ok := d.gpus[g]; ok {
				a.GPUs = append(a.GPUs, gpu)
			}
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Allocation) int { return cmp.Compare(a.JobID, b.JobID) })
	d.observer.Allocations(out)
}

// Counts is what the daemon holds now, for gauges.
type Counts struct {
	Jobs  int // jobs with a record (prolog, recovered or restored)
	Steps int // step policies in the kernel
	// Exempt counts allow-all entries of Slurm's own cgroups (system, slurmd).
	Exempt int
	// FilterAttached is false until Slurm's scope exists or when attaching
	// failed; then GPU steps are refused.
	FilterAttached bool
}

// Counts returns the daemon's current jobs, steps and filter state.
func (d *Daemon) Counts() Counts {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := Counts{Jobs: len(d.jobs), Exempt: len(d.exempts), FilterAttached: d.filter != nil}
	for _, j := range d.jobs {
		c.Steps += len(j.steps)
	}
	return c
}
