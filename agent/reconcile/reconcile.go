// SPDX-License-Identifier: Apache-2.0

// Package reconcile keeps the agent's records true to the node between
// requests: steps whose cgroup Slurm removed (told by inotify at once, and
// found by a periodic pass when a watch was missed), jobs slurmctld says
// have ended although their epilog never came, adopted jobs slurmctld
// could not confirm yet, the filter on Slurm's live
// scope, entries nobody owns, and the plugin's fail-open spool.
package reconcile

import (
	"context"
	"log/slog"
	"time"

	"github.com/gpufence/gpufence/agent/enforcer"
	"github.com/gpufence/gpufence/agent/failopen"
	"github.com/gpufence/gpufence/agent/handler"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/recovery"
	"github.com/gpufence/gpufence/agent/registry"
)

// How soon a job with no step left is first asked about, and how the
// interval grows while slurmctld says it still runs (a job whose user
// cancelled its extern step keeps its allocation and its record).
const (
	EndCheckFirst = 30 * time.Second
	EndCheckMax   = 15 * time.Minute
	// A step-less job whose cgroup still exists is asked about after this.
	EndCheckIdle = 10 * time.Minute
)

// Cgroups tells a cgroup directory's id (cgroupfs); jobcgroup.Node is
// the node's.
type Cgroups interface {
	ID(dir string) (uint64, error)
}

// Watcher reports step cgroups removed (by id) and slurmd's cgroup or pid
// file made; *cgwatch.Watcher implements it.
type Watcher interface {
	Gone() <-chan uint64
	Made() <-chan string
}

// Reconciler runs the passes.
type Reconciler struct {
	Log      *slog.Logger
	Registry *registry.Registry
	Enforcer *enforcer.Enforcer
	Handler  *handler.Handler
	Recovery *recovery.Recovery // nil: jobs are dropped at their epilog only
	Spool    *failopen.Spool
	Watcher  Watcher // nil: the periodic pass alone finds step ends
	Cgroups  Cgroups // nil: this node's
	// Table, when set, asks slurmd again for a GPU table made without its
	// answer (*gputable.Late): at each pass, and at once when slurmd's
	// pid file is written.
	Table interface{ Kick(up bool) }
}

func (r *Reconciler) cgroups() Cgroups {
	if r.Cgroups == nil {
		return jobcgroup.Node{}
	}
	return r.Cgroups
}

// Pass is one reconcile pass.
func (r *Reconciler) Pass() {
	if r.Spool != nil {
		r.Spool.Ingest()
	}
	for _, s := range r.Registry.Steps() {
		if id, err := r.cgroups().ID(s.Cgroup.Path); err != nil || id != s.Cgroup.ID {
			r.Handler.StepGone(s.Cgroup.ID, "step cgroup vanished")
		}
	}
	r.Enforcer.ForgetEnded()
	r.Handler.RetryUnconfirmed()
	r.dropEnded(time.Now())
	r.Enforcer.Reconcile()
	if r.Table != nil {
		r.Table.Kick(false)
	}
}

// dropEnded asks slurmctld about the jobs with no step whose end is due to
// be checked, and drops the records of those it says have ended. A record
// is never dropped because its steps or its cgroup are gone: a job user can
// end every step of their job, the extern step included, while the
// allocation lives on.
func (r *Reconciler) dropEnded(now time.Time) {
	if r.Recovery == nil {
		return
	}
	for _, j := range r.Registry.Jobs() {
		if len(r.Registry.StepsOf(j.ID)) > 0 || now.Before(j.NextCheck) {
			continue
		}
		since := j.Stepless
		if since.IsZero() {
			since = j.Created
		}
		// A record with no Dir (restored from the store, or a prolog no
		// step followed) is asked about once EndCheckFirst passed:
		// slurmctld, not the cgroup, decides either way.
		gone := now.Sub(since) >= EndCheckFirst
		if j.Dir != "" {
			_, err := r.cgroups().ID(j.Dir)
			gone = err != nil
		}
		if !gone && now.Sub(since) < EndCheckIdle {
			continue
		}
		ended, why, err := r.Recovery.Ended(j.ID)
		if !ended {
			every := min(max(2*j.CheckEvery, EndCheckFirst), EndCheckMax)
			r.Registry.SetCheck(j.ID, time.Now().Add(every), every)
			if err != nil {
				r.Log.Warn("job with no step left kept: slurmctld could not say whether it ended", "job_id", j.ID, "err", err, "next_check", every)
			} else {
				r.Log.Info("job with no step left kept: "+why, "job_id", j.ID, "next_check", every)
			}
			continue
		}
		if r.Registry.DropIf(j.ID, j) {
			r.Recovery.Forget(j.ID)
			r.Log.Info("job record dropped: its epilog never reached the agent and "+why, "job_id", j.ID)
		}
	}
}

// Run passes every interval, and releases each step whose cgroup the
// watcher says went, until ctx ends.
func (r *Reconciler) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var gone <-chan uint64
	var made <-chan string
	if r.Watcher != nil {
		gone, made = r.Watcher.Gone(), r.Watcher.Made()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Pass()
		case id, ok := <-gone:
			if !ok {
				gone = nil
				continue
			}
			r.Handler.StepGone(id, "step cgroup removed")
			r.Enforcer.ForgetEnded()
		case _, ok := <-made:
			if !ok {
				made = nil
				continue
			}
			// slurmd's cgroup made again or its pid file written (a
			// slurmd restart): the filter goes on it now, not at the next
			// pass.
			r.Enforcer.RefreshSlurmd()
			if r.Table != nil {
				r.Table.Kick(true)
			}
		}
	}
}
