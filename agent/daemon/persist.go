package daemon

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// saveLocked writes the state file, and tells the observer, since every
// change of jobs comes through here. d.mu is held.
func (d *Daemon) saveLocked() {
	d.publishLocked()
	if d.cfg.StateFile == "" {
		return
	}
	st := statefile.File{Scope: d.scope, Jobs: []statefile.Job{}}
	for _, j := range d.jobs {
		sj := statefile.Job{ID: j.ID, UID: j.UID, GPUs: j.GPUs, Broken: j.broken, NoProlog: j.noProlog, Dir: j.dir, Created: j.created}
		for _, s := range j.steps {
			sj.Steps = append(sj.Steps, statefile.Step{ID: s.stepID, UID: s.uid, CgroupID: s.cg.ID, Cgroup: s.cg.Path, GPUs: s.gpus})
		}
		st.Jobs = append(st.Jobs, sj)
	}
	if err := statefile.Write(d.cfg.StateFile, st); err != nil {
		d.log.Error("save agent state; a restart would lose job attribution", "file", d.cfg.StateFile, "err", err)
	}
}

// restoreLocked takes the saved jobs back: steps whose cgroup still exists
// (same inode) are kept with their kernel entry, the others are released.
// d.mu is held.
func (d *Daemon) restoreLocked(st *statefile.File) {
	if st == nil {
		return
	}
	for _, sj := range st.Jobs {
		j := &job{Job: policy.Job{ID: sj.ID, UID: sj.UID, GPUs: sj.GPUs}, broken: sj.Broken, noProlog: sj.NoProlog, dir: sj.Dir, created: sj.Created, steps: map[uint32]*step{}}
		if j.GPUs == nil {
			j.GPUs = []int{}
		}
		d.jobs[j.ID] = j
		for _, ss := range sj.Steps {
			s := &step{jobID: sj.ID, stepID: ss.ID, uid: ss.UID, cg: devfilter.Cgroup{ID: ss.CgroupID, Path: ss.Cgroup}, gpus: ss.GPUs}
			j.steps[ss.ID] = s
			d.watchLocked(s.cg)
			d.owners[s.cg.ID] = owner{jobID: sj.ID, stepID: ss.ID, uid: ss.UID}
		}
	}
}

// cleanStaleLocked removes pinned kernel entries of cgroups that no longer
// exist (left by an earlier run whose steps ended while no agent ran), and
// audits each removal. d.mu is held.
func (d *Daemon) cleanStaleLocked(scope string) {
	if d.cfg.PinDir == "" {
		return
	}
	if _, err := os.Stat(d.cfg.PinDir); err != nil {
		return // nothing pinned yet
	}
	live := map[uint64]bool{}
	for _, pattern := range []string{"*", "*/*"} {
		dirs, _ := filepath.Glob(filepath.Join(scope, pattern))
		for _, dir := range dirs {
			if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
				if id, err := jobcgroup.ID(dir); err == nil {
					live[id] = true
				}
			}
		}
	}
	removed, err := devfilter.CleanStale(d.cfg.PinDir, func(id uint64) bool { return live[id] })
	if err != nil {
		d.log.Error("clean stale pinned entries", "err", err)
		return
	}
	for _, id := range removed {
		o, known := d.owners[id]
		d.log.Info("stale kernel entry removed", "cgroup_id", id)
		d.lifecycle(audit.EventStaleEntryRemoved, audit.SeverityNotice,
			fmt.Sprintf("removed the kernel entry of cgroup %d, which no longer exists (left by an earlier run)", id), func(r *audit.Record) {
				r.CgroupID = id
				if known && o.exempt == "" {
					r.JobID, r.StepID = o.jobID, policy.StepName(o.stepID)
				}
			})
	}
}

// sweepOrphansLocked removes kernel entries that no known step owns and
// whose cgroup is gone: entries of steps whose attribution was lost (state
// file lost while jobs ran) would otherwise stay until the next start.
// d.mu is held.
func (d *Daemon) sweepOrphansLocked() {
	if d.filter == nil {
		return
	}
	entries, err := d.filter.Policies()
	if err != nil {
		d.log.Error("list kernel entries", "err", err)
		return
	}
	for id := range entries {
		if _, known := d.owners[id]; known {
			continue
		}
		if exists, err := devfilter.CgroupExists(id); err != nil || exists {
			continue
		}
		if err := d.filter.Remove(devfilter.Cgroup{ID: id}); err != nil {
			d.log.Error("remove orphaned kernel entry", "cgroup_id", id, "err", err)
			continue
		}
		d.supp.mu.Lock()
		if d.supp.forget == nil {
			d.supp.forget = map[uint64]owner{}
		}
		d.supp.forget[id] = owner{}
		d.supp.mu.Unlock()
		d.log.Info("orphaned kernel entry removed", "cgroup_id", id)
		d.lifecycle(audit.EventStaleEntryRemoved, audit.SeverityNotice,
			fmt.Sprintf("removed the kernel entry of cgroup %d, which no longer exists and no known step owned", id), func(r *audit.Record) {
				r.CgroupID = id
			})
	}
}
