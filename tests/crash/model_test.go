// SPDX-License-Identifier: Apache-2.0

package crash

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
)

// The model is what the test's clients were told, and what follows from it
// by the project's rules (docs/architecture.md, "Trust"): a job's prolog
// list is its ceiling, a batch step gets the whole list, an srun step the
// part of its SLURM_STEP_GPUS inside it, and a job whose list was unusable
// gets no GPU step at all. Expected values come from the test's own plan,
// never from what the agent says.

// outcome is how far a request got.
type outcome int

const (
	notSent   outcome = iota
	unreached         // sent; no answer came (the agent was killed)
	answered          // the agent answered (accepted or refused)
)

type mjob struct {
	id, uid uint32
	// arg is SLURM_JOB_GPUS as the prolog sends it; nil for a CPU-only job.
	arg *string
	// gpus is the trusted list arg stands for; nil when arg is unusable.
	gpus   []int
	broken bool
	born   int
	dir    string
	prolog outcome
	// ending: its epilog was sent; gone: its cgroups were removed.
	ending, gone bool
	epilog       outcome
	steps        []*mstep
	// verify is the step the test sends after each restart to ask the
	// agent what it knows of the job.
	verify   *mstep
	nextStep uint32
	// synthetic: a job only an older agent's state file holds (no
	// cgroups, no steps).
	synthetic bool
}

type mstep struct {
	job  *mjob
	id   uint32
	dir  string // the step's cgroup
	cgID uint64
	ask  *string // SLURM_STEP_GPUS as slurmstepd sends it
	// want is the step's GPUs by the rules; refuse: the agent must refuse it.
	want   []int
	refuse bool
	st     outcome
	// refused is the agent's refusal, "" when it accepted the step.
	refused string
}

func (s *mstep) name() string { return fmt.Sprintf("%d.%s", s.job.id, policy.StepName(s.id)) }

// outcome says how far the step's last request got.
func (s *mstep) outcome() string {
	switch {
	case s.st == notSent:
		return "not sent"
	case s.st == unreached:
		return "sent, cut off by the kill"
	case s.refused != "":
		return "refused: " + s.refused
	}
	return "accepted"
}

// acked is a step the agent accepted and answered.
func (s *mstep) acked() bool { return s.st == answered && s.refused == "" }

type model struct {
	scope    string
	jobs     map[uint32]*mjob // live: not yet removed
	ended    []*mjob
	byCgroup map[uint64]*mstep
	nextJob  uint32
}

func newModel(scope string) *model {
	return &model{scope: scope, jobs: map[uint32]*mjob{}, byCgroup: map[uint64]*mstep{}, nextJob: 1000}
}

// verifyStep is the step id of the test's own check step in each job.
const verifyStep = 4000

func list(gpus []int) string {
	s := make([]string, len(gpus))
	for i, g := range gpus {
		s[i] = strconv.Itoa(g)
	}
	return strings.Join(s, ",")
}

func ptr(s string) *string { return &s }

func allGPUs() []int {
	out := make([]int, nGPUs)
	for i := range out {
		out[i] = i
	}
	return out
}

// subsetOf returns a random ascending subset of 0..nGPUs-1, never empty.
func subsetOf(rng *rand.Rand) []int {
	for {
		var out []int
		for g := range nGPUs {
			if rng.IntN(3) == 0 {
				out = append(out, g)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
}

// newJob plans a job: its trusted list and one to three steps.
func (m *model) newJob(rng *rand.Rand, iter int) (*mjob, error) {
	j := &mjob{id: m.nextJob, uid: 2000 + uint32(rng.IntN(4)), born: iter}
	m.nextJob++
	j.dir = filepath.Join(m.scope, fmt.Sprintf("job_%d", j.id))
	switch k := rng.IntN(12); {
	case k == 0: // CPU-only: slurmd sets no SLURM_JOB_GPUS
		j.gpus = []int{}
	case k == 1: // a GPU the node's table does not have
		j.arg, j.broken = ptr(list(subsetOf(rng))+",9"), true
	case k == 2: // not Slurm's grammar
		j.arg, j.broken = ptr("0-3"), true
	default:
		j.gpus = subsetOf(rng)
		j.arg = ptr(list(j.gpus))
	}
	m.jobs[j.id] = j
	for range 1 + rng.IntN(3) {
		if _, err := m.addStep(rng, j); err != nil {
			return nil, err
		}
	}
	return j, nil
}

// addStep plans the job's next step, with the SLURM_STEP_GPUS its user's
// environment may hold (their own to set: a subset, every GPU, or unset),
// and makes its cgroups as slurmstepd does.
func (m *model) addStep(rng *rand.Rand, j *mjob) (*mstep, error) {
	id := j.nextStep
	if len(j.steps) == 0 && rng.IntN(3) == 0 {
		id = policy.BatchStep // a batch job's first step
	} else {
		j.nextStep++
	}
	var ask []int
	switch k := rng.IntN(6); k {
	case 0: // unset
	case 1: // forged: every GPU
		ask = allGPUs()
	default:
		ask = subsetOf(rng)
	}
	s := m.step(j, id, ask, ask == nil)
	return s, m.mkStep(s)
}

// step plans step id of j asking for ask (unset when none).
func (m *model) step(j *mjob, id uint32, ask []int, unset bool) *mstep {
	s := &mstep{job: j, id: id}
	if !unset {
		s.ask = ptr(list(ask))
	}
	s.want, s.refuse = j.decide(id, ask)
	dir := "step_" + strconv.FormatUint(uint64(id), 10)
	if id == policy.BatchStep {
		dir = "step_batch"
	}
	s.dir = filepath.Join(j.dir, dir)
	j.steps = append(j.steps, s)
	return s
}

// decide is the rule: what step id asking for ask may open.
func (j *mjob) decide(id uint32, ask []int) (want []int, refuse bool) {
	if j.broken {
		return nil, true
	}
	if id == policy.BatchStep {
		return slices.Clone(j.gpus), false
	}
	want = []int{}
	for _, g := range ask {
		if slices.Contains(j.gpus, g) {
			want = append(want, g)
		}
	}
	return want, false
}

// mkStep makes the step's cgroups: <step>/slurm for slurmstepd and
// <step>/user/task_0 for its task.
func (m *model) mkStep(s *mstep) error {
	for _, d := range []string{"slurm", "user/task_0"} {
		if err := os.MkdirAll(filepath.Join(s.dir, d), 0o755); err != nil {
			return err
		}
	}
	id, err := jobcgroup.ID(s.dir)
	if err != nil {
		return err
	}
	s.cgID = id
	m.byCgroup[id] = s
	return nil
}

// sent are the steps that were sent at least once, the check step included.
func (j *mjob) sent() []*mstep {
	var out []*mstep
	for _, s := range j.steps {
		if s.st != notSent {
			out = append(out, s)
		}
	}
	return out
}

// remove forgets a job whose cgroups are gone.
func (m *model) remove(j *mjob) {
	for _, s := range j.steps {
		delete(m.byCgroup, s.cgID)
	}
	delete(m.jobs, j.id)
	j.gone = true
	m.ended = append(m.ended, j)
}

// byID finds a job of the test, live or ended.
func (m *model) byID(id uint32) *mjob {
	if j := m.jobs[id]; j != nil {
		return j
	}
	for _, j := range m.ended {
		if j.id == id {
			return j
		}
	}
	return nil
}

// live returns the live jobs by id.
func (m *model) live() []*mjob {
	out := make([]*mjob, 0, len(m.jobs))
	for _, j := range m.jobs {
		out = append(out, j)
	}
	slices.SortFunc(out, func(a, b *mjob) int { return int(a.id) - int(b.id) })
	return out
}

// allowed reads a probe: the GPU indices that opened with ENXIO, and any
// answer that is neither ENXIO nor EPERM.
func allowed(open []string) (gpus []int, odd []string) {
	gpus = []int{}
	for i, o := range open[:nGPUs] {
		switch o {
		case "ENXIO":
			gpus = append(gpus, i)
		case "EPERM":
		default:
			odd = append(odd, fmt.Sprintf("nvidia%d %s", i, o))
		}
	}
	if ctl := open[nGPUs]; ctl != "ENXIO" {
		odd = append(odd, "nvidiactl "+ctl+" (CUDA needs it: always allowed)")
	}
	return gpus, odd
}

func subset(a, of []int) bool {
	for _, g := range a {
		if !slices.Contains(of, g) {
			return false
		}
	}
	return true
}

func u32s(v []uint32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	slices.Sort(out)
	return out
}
