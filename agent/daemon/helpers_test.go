// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"github.com/gpufence/gpufence/agent/registry"
)

// flush reports the kernel's counters now (the periodic flush).
func (d *Daemon) flush() {
	if f := d.enf.Filter(); f != nil {
		d.ev.Flush(f)
	}
}

// owned is how many cgroups are registered: steps and exempt ones.
func (d *Daemon) owned() (steps, exempt int) {
	c := d.reg.Counts()
	return c.Steps, c.Exempt
}

// job is job id's record and its steps; ok false when there is none.
func (d *Daemon) job(id uint32) (registry.Job, []registry.Step, bool) {
	j, ok := d.reg.Job(id)
	return j, d.reg.StepsOf(id), ok
}

// filter is the attached filter.
func (d *Daemon) filter() Filter { return d.enf.Filter() }
