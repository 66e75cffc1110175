package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// stateVersion is bumped when the file's meaning changes; an unknown
// version is not read (the jobs then count as lost, see adopt).
const stateVersion = 1

// savedState is what the agent needs across restarts to attribute events
// and release policies: the kernel keeps enforcing from the pinned maps, this
// file keeps who each entry belongs to.
type savedState struct {
	Version int        `json:"version"`
	Scope   string     `json:"scope,omitempty"`
	Jobs    []savedJob `json:"jobs"`
}

type savedJob struct {
	ID       uint32      `json:"id"`
	UID      uint32      `json:"uid"`
	GPUs     []int       `json:"gpus"`
	Broken   string      `json:"broken,omitempty"`
	NoProlog bool        `json:"no_prolog,omitempty"`
	Dir      string      `json:"dir,omitempty"`
	Created  time.Time   `json:"created"`
	Steps    []savedStep `json:"steps,omitempty"`
}

type savedStep struct {
	ID       uint32 `json:"id"`
	UID      uint32 `json:"uid"`
	CgroupID uint64 `json:"cgroup_id"`
	Cgroup   string `json:"cgroup"`
	GPUs     []int  `json:"gpus"`
}

// saveLocked writes the state atomically (temp file, fsync, rename), so a
// crash leaves either the old or the new file. d.mu is held.
func (d *Daemon) saveLocked() {
	if d.cfg.StateFile == "" {
		return
	}
	st := savedState{Version: stateVersion, Scope: d.scope, Jobs: []savedJob{}}
	for _, j := range d.jobs {
		sj := savedJob{ID: j.ID, UID: j.UID, GPUs: j.GPUs, Broken: j.broken, NoProlog: j.noProlog, Dir: j.dir, Created: j.created}
		for _, s := range j.steps {
			sj.Steps = append(sj.Steps, savedStep{ID: s.stepID, UID: s.uid, CgroupID: s.cg.ID, Cgroup: s.cg.Path, GPUs: s.gpus})
		}
		st.Jobs = append(st.Jobs, sj)
	}
	if err := writeAtomic(d.cfg.StateFile, st); err != nil {
		d.log.Error("save agent state; a restart would lose job attribution", "file", d.cfg.StateFile, "err", err)
	}
}

func writeAtomic(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".state-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// loadState reads the saved state; a missing file is an empty state.
func loadState(path string) (savedState, error) {
	var st savedState
	if path == "" {
		return st, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", path, err)
	}
	if st.Version != stateVersion {
		return savedState{}, fmt.Errorf("%s: state version %d, this agent reads %d", path, st.Version, stateVersion)
	}
	return st, nil
}

// restoreLocked takes the saved jobs back: steps whose cgroup still exists
// (same inode) are kept with their kernel entry, the others are released.
// d.mu is held.
func (d *Daemon) restoreLocked(st savedState) {
	for _, sj := range st.Jobs {
		j := &job{Job: policy.Job{ID: sj.ID, UID: sj.UID, GPUs: sj.GPUs}, broken: sj.Broken, noProlog: sj.NoProlog, dir: sj.Dir, created: sj.Created, steps: map[uint32]*step{}}
		if j.GPUs == nil {
			j.GPUs = []int{}
		}
		d.jobs[j.ID] = j
		for _, ss := range sj.Steps {
			s := &step{jobID: sj.ID, stepID: ss.ID, uid: ss.UID, cg: devfilter.Cgroup{ID: ss.CgroupID, Path: ss.Cgroup}, gpus: ss.GPUs}
			j.steps[ss.ID] = s
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
