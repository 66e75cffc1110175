package daemon

import (
	"time"

	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// job is the agent's record of one job on this node.
type job struct {
	policy.Job
	// broken, when set, is why the job's trusted list could not be used;
	// every GPU step of the job is refused with it (fail closed).
	broken string
	// noProlog marks a record made for a step whose job never sent a
	// prolog; it carries no trusted list.
	noProlog bool
	// recovered names the slurmctld output the trusted list was read from,
	// when it came from there and not from the prolog.
	recovered string
	// dir is the job's cgroup, once a step showed it; created is when the
	// record was made, stepless since when it has no step. They decide when
	// Reconcile asks slurmctld whether a job whose epilog never reached the
	// agent has ended (nextCheck, then every checkEvery).
	dir        string
	created    time.Time
	stepless   time.Time
	nextCheck  time.Time
	checkEvery time.Duration
	steps      map[uint32]*step
}

// step is one registered step and the cgroup its policy is keyed by.
type step struct {
	jobID, stepID uint32
	uid           uint32
	cg            devfilter.Cgroup
	gpus          []int
}

// owner is what a cgroup id stands for, for attributing kernel events.
type owner struct {
	jobID, stepID, uid uint32
	exempt             string
}
