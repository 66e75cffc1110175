// SPDX-License-Identifier: Apache-2.0

// Package crash kills the real gpufence agent with kill -9 at random
// instants while many clients register jobs and steps over its real
// socket, restarts it, and compares what the kernel enforces and what the
// agent knows with what the clients were answered (docs/architecture.md,
// "Restart survival"):
//
//   - every prolog whose answer a client received is still recorded, with
//     exactly its trusted GPU list (and a job whose list was unusable still
//     gets no GPU step);
//   - no cgroup's kernel entry allows a GPU outside its job's prolog list,
//     and none is left for a cgroup that is gone;
//   - an answered step is enforced with its GPUs or denied, never more;
//     steps in flight at the kill get at most what they would have got;
//   - the agent starts every time, whatever instant it died at (during its
//     own start too), and also with its state file damaged.
package crash

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/bpf/devfilter"
	"github.com/gpufence/gpufence/proto/agentclient"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

var (
	seedFlag  = flag.Uint64("crash.seed", 0, "seed of the crash tests' plans (0: from the clock); each test logs the seed it used")
	itersFlag = flag.Int("crash.iterations", 0, "kill -9 iterations per crash test (0: the test's default)")
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// workers is how many slurmstepd stand-ins send steps at once.
const workers = 8

// TestPrivilegedCrashScope: the filter on Slurm's scope (Linux ≥ 6.1).
func TestPrivilegedCrashScope(t *testing.T) { crashLoop(t, "scope", 40, 15) }

// TestPrivilegedCrashPerCgroup: the fallback, a filter on each step's
// cgroup (Linux 5.x).
func TestPrivilegedCrashPerCgroup(t *testing.T) { crashLoop(t, "per-cgroup", 20, 6) }

func crashLoop(t *testing.T, mode string, iters, short int) {
	n := iters
	if testing.Short() {
		n = short
	}
	if *itersFlag > 0 {
		n = *itersFlag
	}
	r := newRun(t, mode)
	r.checkStateFile = true
	for i := range n {
		r.iteration(i, nil)
		if t.Failed() {
			t.Logf("stopped after crash %d of %d (seed %d)", i+1, n, r.seed)
			break
		}
	}
	r.finish()
}

// damage is something done to the state file while the agent is down.
type damage struct {
	name string
	do   func(path string) error
	// unfixable: the agent cannot write the state file again.
	unfixable bool
}

// TestPrivilegedCrashStateFileDamaged: the agent is killed during a burst
// and its state file is damaged before it starts again (cut short, empty,
// garbage, forged to give every job every GPU, a directory in its place,
// gone). The records come from the pinned store: nothing is lost and
// nothing widened. Last, the pinned store is lost too (and the state file
// is garbage): the agent still starts, and fails closed: no step of a job
// it has no trusted list for gets a GPU, and what the kernel enforces for
// running steps stays as it was.
func TestPrivilegedCrashStateFileDamaged(t *testing.T) {
	r := newRun(t, "scope")
	var forge func(string) error
	damages := []damage{
		{name: "cut in half", do: func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(p, b[:len(b)/2], 0o600)
		}},
		{name: "empty", do: func(p string) error { return os.WriteFile(p, nil, 0o600) }},
		{name: "garbage", do: func(p string) error { return os.WriteFile(p, garbage(r.rng, 4096), 0o600) }},
		{name: "forged: every job and step with every GPU", do: func(p string) error { return forge(p) }},
		{name: "a directory in its place", unfixable: true, do: func(p string) error {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
			return os.Mkdir(p, 0o700)
		}},
		{name: "removed", do: os.RemoveAll},
	}
	forge = func(p string) error {
		f := statefile.File{Scope: r.n.scope}
		for _, j := range r.m.live() {
			sj := statefile.Job{ID: j.id, UID: j.uid, GPUs: allGPUs(), Dir: j.dir, Created: time.Now()}
			for _, s := range j.sent() {
				sj.Steps = append(sj.Steps, statefile.Step{ID: s.id, UID: j.uid, CgroupID: s.cgID, Cgroup: s.dir, GPUs: allGPUs()})
			}
			f.Jobs = append(f.Jobs, sj)
		}
		return statefile.Write(p, f)
	}
	for i, d := range damages {
		r.iteration(i, &d)
	}
	r.storeLost(len(damages))
	r.finish()
}

// TestPrivilegedCrashUpgradeFromStateFile: the first start of an agent
// with the pinned store where an older agent kept only its state file
// (an upgrade): it takes the records from the file into the store. A kill
// at any instant of that start (tried three times per round, at random
// instants) must lose none of them: the next start still has every job
// the file held.
func TestPrivilegedCrashUpgradeFromStateFile(t *testing.T) {
	r := newRun(t, "scope")
	for i := range 2 {
		r.iteration(i, nil)
	}
	// A busy node's file: the more records, the longer the copy.
	const synthetic = 3000
	for k := range synthetic {
		j := &mjob{id: 500000 + uint32(k), uid: 3000, prolog: answered, synthetic: true}
		j.gpus = subsetOf(r.rng)
		j.arg = ptr(list(j.gpus))
		r.m.jobs[j.id] = j
	}
	est := 3 * r.n.startTook
	rounds := 8
	if testing.Short() {
		rounds = 3
	}
	for round := range rounds {
		r.n.stop()
		f, _, err := statefile.Read(r.n.stateFile)
		if err != nil {
			t.Fatalf("the state file written at stop: %v", err)
		}
		have := map[uint32]bool{}
		for _, j := range f.Jobs {
			have[j.ID] = true
		}
		for _, j := range r.m.live() {
			if j.synthetic && !have[j.id] {
				f.Jobs = append(f.Jobs, statefile.Job{ID: j.id, UID: j.uid, GPUs: j.gpus, Created: time.Now()})
			}
		}
		if err := statefile.Write(r.n.stateFile, *f); err != nil {
			t.Fatal(err)
		}
		// The older agent pinned its filter, not the store.
		for _, pin := range []string{"store_jobs", "store_steps"} {
			if err := unix.Unlink(filepath.Join(r.n.pinDir, pin)); err != nil {
				t.Fatalf("remove the pinned store: %v", err)
			}
		}
		r.fileRestoreOK = true
		for range 3 {
			r.killDuringStart(time.Duration(r.rng.Int64N(int64(est) + 1)))
		}
		start := time.Now()
		r.n.start()
		r.n.ready(start)
		est = r.n.startTook
		r.count(func(s *stats) { s.restarts++; s.startTotal += r.n.startTook })
		what := fmt.Sprintf("upgrade round %d", round+1)
		r.compare(what)
		if t.Failed() {
			break
		}
	}
	r.finish()
}

func garbage(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

// run is one crash test: a node, its workers, the model, the figures.
type run struct {
	t    *testing.T
	n    *node
	pool *pool
	m    *model
	rng  *rand.Rand
	seed uint64
	// intruder is a task cgroup of a job no request ever named; the agent
	// adopts its step (intruderStep, a cgroup id) with no GPU.
	intruder     string
	intruderStep uint64
	// checkStateFile: the state file must parse after every crash (off
	// where the test damages it).
	checkStateFile bool
	// statusUnfixable: the damage done to the state file is one the
	// agent cannot repair (a directory in its place), so gpufence status
	// rightly reports it.
	statusUnfixable bool
	// fileRestoreOK: a restart may restore from the state file (the
	// upgrade test, whose pinned store is removed before each round).
	fileRestoreOK bool
	// burstEst is how long a burst takes when no kill cuts it short.
	burstEst time.Duration
	begin    time.Time

	mu sync.Mutex
	st stats
}

type stats struct {
	kills, killsInBurst, killsAfterBurst, killsLate int
	// inFlight sums the requests not yet answered at each kill in a burst.
	inFlight                                 int
	startupKills, startupKillsBeforeReady    int
	restarts                                 int
	prologsAcked, prologsUnreached           int
	stepsAcked, stepsRefused, stepsUnreached int
	epilogsAcked, epilogsUnreached           int
	retried                                  int
	verified, probes, entries                int
	ackedEnforced, ackedDenied               int
	stateTemps                               int
	statusRuns                               int
	startTotal                               time.Duration
}

func newRun(t *testing.T, mode string) *run {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (again: go test ./tests/crash -run '^%s$' -args -crash.seed=%d)", seed, t.Name(), seed)
	n := newNode(t, mode)
	r := &run{t: t, n: n, m: newModel(n.scope), rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed: seed, begin: time.Now()}
	r.pool = startPool(t, n, workers)
	r.intruder = filepath.Join(n.scope, "job_999999", "step_0", "user", "task_0")
	mustMkdir(t, r.intruder)
	id, err := jobcgroup.ID(filepath.Dir(filepath.Dir(r.intruder)))
	if err != nil {
		t.Fatal(err)
	}
	r.intruderStep = id
	start := time.Now()
	n.start()
	n.ready(start)
	return r
}

func (r *run) count(f func(*stats)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(&r.st)
}

// iteration is one crash: a burst of registrations, kill -9 at a random
// instant, the ended jobs' cgroups removed as Slurm removes them, the
// state file damaged (d, when set), a restart (itself killed at a random
// instant now and then), the comparison, and the requests the kill cut
// off sent again, as the plugin's retry sends them.
func (r *run) iteration(iter int, d *damage) {
	r.t.Helper()
	ends := r.burst(iter)
	r.pool.park(r.t, r.n.idle)
	for _, j := range ends {
		if err := r.n.removeTree(j.dir); err != nil {
			r.t.Fatalf("remove job %d's cgroups: %v", j.id, err)
		}
		r.m.remove(j)
	}
	r.afterCrash(iter)
	if d != nil {
		if err := d.do(r.n.stateFile); err != nil {
			r.t.Fatalf("damage the state file (%s): %v", d.name, err)
		}
	}
	r.restart()
	what := fmt.Sprintf("crash %d", iter+1)
	if d != nil {
		what += " (state file " + d.name + ")"
	}
	r.statusUnfixable = d != nil && d.unfixable
	r.compare(what)
	r.retry(what)
	r.pool.park(r.t, r.n.idle)
}

// burst sends, all at once: the prologs of new jobs, each followed by its
// steps (each from its own cgroup), further steps of running jobs, and the
// epilogs of some older jobs; and kills the agent at a random instant.
// It returns the jobs whose epilog was sent.
func (r *run) burst(iter int) []*mjob {
	r.t.Helper()
	var fresh, ends []*mjob
	for range 3 + r.rng.IntN(5) {
		j, err := r.m.newJob(r.rng, iter)
		if err != nil {
			r.t.Fatal(err)
		}
		fresh = append(fresh, j)
	}
	var steps []*mstep
	busy := map[*mjob]bool{}
	for _, j := range r.m.live() {
		if j.born == iter {
			continue
		}
		for _, s := range j.steps {
			if s.st == notSent {
				steps = append(steps, s) // planned while its prolog had no answer
				busy[j] = true
			}
		}
		if !j.broken && len(j.steps) < 8 && r.rng.IntN(4) == 0 {
			s, err := r.m.addStep(r.rng, j)
			if err != nil {
				r.t.Fatal(err)
			}
			steps = append(steps, s)
			busy[j] = true
		}
	}
	for _, j := range r.m.live() {
		if j.born <= iter-2 && !busy[j] && r.rng.IntN(3) == 0 {
			ends = append(ends, j)
		}
	}

	ops := len(fresh) + len(steps) + len(ends)
	for _, j := range fresh {
		ops += len(j.steps)
	}
	var left atomic.Int64
	left.Store(int64(ops))
	var wg sync.WaitGroup
	step := func(s *mstep) {
		defer wg.Done()
		defer left.Add(-1)
		r.sendStep(s)
	}
	begin := time.Now()
	for _, j := range fresh {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.sendProlog(j)
			left.Add(-1)
			if j.prolog != answered {
				left.Add(-int64(len(j.steps)))
				return
			}
			for _, s := range j.steps {
				wg.Add(1)
				go step(s)
			}
		}()
	}
	for _, s := range steps {
		wg.Add(1)
		go step(s)
	}
	for _, j := range ends {
		j.ending = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer left.Add(-1)
			r.sendEpilog(j)
		}()
	}

	// The instant: anywhere in the burst as long as bursts take, a little
	// after it (the state file is written then), and now and then well
	// after it (a write of the state file under way).
	var delay time.Duration
	late := false
	switch {
	case r.burstEst == 0:
		late = true // the first burst measures how long one takes
	case r.rng.IntN(10) == 0:
		delay, late = r.burstEst+time.Duration(r.rng.Int64N(int64(300*time.Millisecond))), true
	default:
		delay = time.Duration(r.rng.Float64() * 1.25 * float64(r.burstEst))
	}
	killed := make(chan int64, 1)
	if !late {
		go func() {
			time.Sleep(delay)
			n := left.Load()
			r.n.kill()
			killed <- n
		}()
	}
	wg.Wait()
	took := time.Since(begin)
	if late {
		time.Sleep(delay)
		r.n.kill()
		killed <- 0
	}
	inFlight := <-killed
	r.count(func(s *stats) {
		s.kills++
		switch {
		case inFlight > 0:
			s.killsInBurst++
			s.inFlight += int(inFlight)
		case late && r.burstEst != 0:
			s.killsLate++
		default:
			s.killsAfterBurst++
		}
	})
	if inFlight == 0 {
		if r.burstEst == 0 {
			r.burstEst = took
		} else {
			r.burstEst = (3*r.burstEst + took) / 4
		}
	}
	return ends
}

func (r *run) sendProlog(j *mjob) {
	// What the plugin sends from job_prolog (spank/plugin/client.c gf_client_job_prolog).
	req := &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: j.id, Uid: j.uid, JobGpus: j.arg}}}
	_, err := agentclient.Call(r.n.sock, req, callTimeout)
	switch {
	case errors.Is(err, agentclient.ErrAgent):
		r.t.Errorf("job %d's prolog refused: %v", j.id, err)
		j.prolog = answered
	case err != nil:
		j.prolog = unreached
		r.count(func(s *stats) { s.prologsUnreached++ })
	default:
		j.prolog = answered
		r.count(func(s *stats) { s.prologsAcked++ })
	}
}

func (r *run) sendEpilog(j *mjob) {
	req := &pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: j.id}}}
	_, err := agentclient.Call(r.n.sock, req, callTimeout)
	switch {
	case errors.Is(err, agentclient.ErrAgent):
		r.t.Errorf("job %d's epilog refused: %v", j.id, err)
		j.epilog = answered
	case err != nil:
		j.epilog = unreached
		r.count(func(s *stats) { s.epilogsUnreached++ })
	default:
		j.epilog = answered
		r.count(func(s *stats) { s.epilogsAcked++ })
	}
}

func (r *run) stepTask(s *mstep) task {
	return task{Op: "step", Dir: filepath.Join(s.dir, "slurm"), Socket: r.n.sock, Job: s.job.id, Step: s.id, UID: s.job.uid, GPUs: s.ask}
}

// sendStep sends s from its slurmstepd cgroup and checks the answer
// against the rules.
func (r *run) sendStep(s *mstep) {
	a := r.pool.do(r.stepTask(s))
	r.stepAnswer(s, a, "")
}

func (r *run) stepAnswer(s *mstep, a answer, what string) {
	ctx := ""
	if what != "" {
		ctx = what + ": "
	}
	switch {
	case a.Local != "":
		r.t.Errorf("%sstep %s: %s", ctx, s.name(), a.Local)
	case a.Unreached != "":
		s.st = unreached
		r.count(func(st *stats) { st.stepsUnreached++ })
	case a.Refused != "":
		s.st, s.refused = answered, a.Refused
		r.count(func(st *stats) { st.stepsRefused++ })
		if !s.refuse {
			r.t.Errorf("%sstep %s (SLURM_STEP_GPUS %s) was refused: %s; job %d's prolog list %s allows it GPUs [%s]",
				ctx, s.name(), show(s.ask), a.Refused, s.job.id, show(s.job.arg), list(s.want))
		}
	default:
		s.st, s.refused = answered, ""
		r.count(func(st *stats) { st.stepsAcked++ })
		got := u32s(a.GPUs)
		switch {
		case s.refuse:
			r.t.Errorf("%sstep %s was accepted with GPUs [%s], but job %d's prolog list %s is unusable: its steps must be refused",
				ctx, s.name(), list(got), s.job.id, show(s.job.arg))
		case !slices.Equal(got, s.want):
			r.t.Errorf("%sstep %s (SLURM_STEP_GPUS %s) was answered GPUs [%s]; job %d's prolog list %s gives it [%s]",
				ctx, s.name(), show(s.ask), list(got), s.job.id, show(s.job.arg), list(s.want))
		}
	}
}

func show(s *string) string {
	if s == nil {
		return "unset"
	}
	return fmt.Sprintf("%q", *s)
}

// afterCrash looks at what the dead agent left: its state file parses
// (it is replaced atomically), and how many temporary files its writer
// left behind.
func (r *run) afterCrash(iter int) {
	temps, _ := filepath.Glob(filepath.Join(r.n.stateDir, ".state-*"))
	r.count(func(s *stats) { s.stateTemps += len(temps) })
	if !r.checkStateFile {
		return
	}
	if _, _, err := statefile.Read(r.n.stateFile); err != nil {
		r.t.Errorf("crash %d: the state file is corrupt: %v", iter+1, err)
	}
}

// restart starts the agent again; one start in five is itself killed at
// a random instant of the time a start takes.
func (r *run) restart() {
	r.t.Helper()
	if r.n.startTook > 0 && r.rng.IntN(5) == 0 {
		r.killDuringStart(time.Duration(r.rng.Int64N(int64(r.n.startTook) + 1)))
	}
	start := time.Now()
	r.n.start()
	r.n.ready(start)
	r.count(func(s *stats) { s.restarts++; s.startTotal += r.n.startTook })
}

// killDuringStart starts the agent and kills it d later, counting whether
// it was still starting.
func (r *run) killDuringStart(d time.Duration) {
	r.t.Helper()
	r.n.start()
	time.Sleep(d)
	before := !r.n.isReady()
	r.n.kill()
	r.count(func(s *stats) {
		s.startupKills++
		if before {
			s.startupKillsBeforeReady++
		}
	})
}

// compare checks the restarted agent against the model.
func (r *run) compare(what string) {
	r.t.Helper()
	recorded := false
	for _, j := range r.m.live() {
		recorded = recorded || j.prolog == answered
	}
	if recorded {
		b, _ := os.ReadFile(r.n.agent.log)
		fromStore := strings.Contains(string(b), `from="the pinned store`)
		// Upgrade rounds: where every start before this one was killed
		// before its store was complete, this start reads the file again.
		fromFile := r.fileRestoreOK && strings.Contains(string(b), `from="the state file`)
		if !strings.Contains(string(b), `msg="restored jobs"`) || !(fromStore || fromFile) {
			r.t.Errorf("%s: the agent did not restore its jobs from the pinned store:\n%s", what, r.n.logTail(30))
		}
	}
	r.checkKernel(what)
	r.checkStore(what)
	r.verifyJobs(what)
	r.probeAll(what)
	r.checkStatus(what)
}

// statusReport is the part of `gpufence status --json` the test reads.
type statusReport struct {
	OK       bool     `json:"ok"`
	Problems []string `json:"problems"`
	Jobs     []struct {
		ID     uint32 `json:"id"`
		GPUs   []int  `json:"gpus"`
		Broken string `json:"broken"`
		Steps  []struct {
			Name string `json:"name"`
			GPUs []int  `json:"gpus"`
		} `json:"steps"`
	} `json:"jobs"`
}

// checkStatus runs `gpufence status` (state file, pins and cgroups read
// and cross-checked from outside the agent). The state file is written
// off the request path (at most every 200ms), so status is asked until it
// finds nothing off, for at most 3s; then every job it shows whose prolog
// was answered has exactly its prolog list (or is marked unusable), and
// no job or step shows a GPU outside its job's list.
func (r *run) checkStatus(what string) {
	r.t.Helper()
	var rep statusReport
	var out []byte
	deadline := time.Now().Add(3 * time.Second)
	for {
		cmd := exec.Command(r.n.bin, "status", "--json", "--config", r.n.cfg)
		var err error
		out, err = cmd.Output()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			r.t.Fatalf("%s: gpufence status: %v", what, err)
		}
		rep = statusReport{}
		if err := json.Unmarshal(out, &rep); err != nil {
			r.t.Fatalf("%s: gpufence status --json: %v\n%s", what, err, out)
		}
		r.count(func(s *stats) { s.statusRuns++ })
		if rep.OK || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !rep.OK && !r.statusUnfixable {
		r.t.Errorf("%s: gpufence status still finds problems after 3s: %s", what, strings.Join(rep.Problems, "; "))
		for id, s := range r.m.byCgroup {
			if strings.Contains(strings.Join(rep.Problems, " "), fmt.Sprint(id)) {
				r.t.Logf("%s: cgroup %d named there is step %s (%s)", what, id, s.name(), s.outcome())
			}
		}
	}
	for _, sj := range rep.Jobs {
		j := r.m.byID(sj.ID)
		var ceiling []int // a job whose prolog was never sent: no GPU
		if j != nil && j.prolog != notSent {
			// A prolog cut off by the kill may have been recorded.
			ceiling = j.gpus
		}
		if j != nil && j.prolog == answered && !j.gone {
			switch {
			case j.broken && sj.Broken == "":
				r.t.Errorf("%s: gpufence status shows job %d with GPUs %v and not unusable; its prolog list %s was unusable", what, sj.ID, sj.GPUs, show(j.arg))
			case !j.broken && !slices.Equal(sj.GPUs, j.gpus):
				r.t.Errorf("%s: gpufence status shows job %d with GPUs %v; its prolog list %s is [%s]", what, sj.ID, sj.GPUs, show(j.arg), list(j.gpus))
			}
		}
		if !subset(sj.GPUs, ceiling) {
			r.t.Errorf("%s: gpufence status shows job %d with GPUs %v, more than its prolog gave ([%s])", what, sj.ID, sj.GPUs, list(ceiling))
		}
		for _, ss := range sj.Steps {
			if !subset(ss.GPUs, ceiling) {
				r.t.Errorf("%s: gpufence status shows step %d.%s with GPUs %v, more than its job's prolog gave ([%s])", what, sj.ID, ss.Name, ss.GPUs, list(ceiling))
			}
		}
	}
}

// checkKernel reads every kernel entry the filter has pinned: each belongs
// to a live step of the test's (or is one of Slurm's exempt cgroups), and
// allows that step's GPUs or none, never one outside its job's list.
func (r *run) checkKernel(what string) {
	r.t.Helper()
	v, err := devfilter.InspectPins(r.n.pinDir)
	if err != nil {
		r.t.Fatalf("%s: read the pinned filter: %v", what, err)
	}
	for _, e := range v.Errors {
		r.t.Errorf("%s: pinned filter: %s", what, e)
	}
	got := map[*mstep][]int{}
	for id, e := range v.Entries {
		r.count(func(s *stats) { s.entries++ })
		if name, ok := r.n.exempt[id]; ok {
			if !e.Policy.AllowAll {
				r.t.Errorf("%s: Slurm's %s cgroup lost its allow-all entry: %+v", what, name, e.Policy)
			}
			continue
		}
		if id == r.intruderStep {
			// Adopted at start with adopt_unconfirmed: deny.
			if e.Policy.AllowAll || e.Policy.AuditOnly || len(e.Policy.GPUMinors) > 0 || len(e.Policy.CapsMinors) > 0 {
				r.t.Errorf("%s: the step of a job no request named has a kernel entry that allows GPUs: %+v", what, e.Policy)
			}
			continue
		}
		s := r.m.byCgroup[id]
		if s == nil {
			r.t.Errorf("%s: kernel entry for cgroup %d, which is no live step (an ended job's entry left behind?): %+v", what, id, e.Policy)
			continue
		}
		gpus := u32s(e.Policy.GPUMinors) // GPU i is minor i here
		got[s] = gpus
		switch {
		case e.Policy.AllowAll || e.Policy.AuditOnly || len(e.Policy.CapsMinors) > 0 || !subset(gpus, s.job.gpus):
			r.t.Errorf("%s: step %s's kernel entry allows GPUs [%s] (allow all: %v, audit only: %v, caps %v), outside job %d's prolog list %s",
				what, s.name(), list(gpus), e.Policy.AllowAll, e.Policy.AuditOnly, e.Policy.CapsMinors, s.job.id, show(s.job.arg))
		case len(gpus) > 0 && !slices.Equal(gpus, s.want):
			r.t.Errorf("%s: step %s's kernel entry allows GPUs [%s]; the step gets [%s] or nothing", what, s.name(), list(gpus), list(s.want))
		}
	}
	for _, j := range r.m.live() {
		for _, s := range j.steps {
			if !s.acked() {
				continue
			}
			g, ok := got[s]
			switch {
			case !ok && r.n.mode == "per-cgroup":
				r.t.Errorf("%s: answered step %s has no filter on its cgroup: it is not narrowed at all", what, s.name())
			case len(g) == len(s.want):
				r.count(func(st *stats) { st.ackedEnforced++ })
			default:
				r.count(func(st *stats) { st.ackedDenied++ })
			}
		}
	}
}

// checkStore reads the job ids in the pinned store: every job whose prolog
// was answered is there, no job whose epilog was answered is.
func (r *run) checkStore(what string) {
	r.t.Helper()
	ids, err := storedJobs(r.n.pinDir)
	if err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
	var missing, kept []string
	answeredJobs := 0
	for _, j := range r.m.live() {
		if j.prolog != answered {
			continue
		}
		answeredJobs++
		if !ids[j.id] {
			missing = append(missing, fmt.Sprintf("%d (SLURM_JOB_GPUS %s)", j.id, show(j.arg)))
		}
	}
	for _, j := range r.m.ended {
		if j.epilog == answered && ids[j.id] {
			kept = append(kept, fmt.Sprint(j.id))
		}
	}
	if len(missing) > 0 {
		r.t.Errorf("%s: %d of the %d jobs whose prolog was answered have no record in the pinned store: %s", what, len(missing), answeredJobs, few(missing))
	}
	if len(kept) > 0 {
		r.t.Errorf("%s: %d jobs whose epilog was answered are still in the pinned store: %s", what, len(kept), few(kept))
	}
}

// few lists at most ten of s.
func few(s []string) string {
	if len(s) > 10 {
		return strings.Join(s[:10], ", ") + fmt.Sprintf(" and %d more", len(s)-10)
	}
	return strings.Join(s, ", ")
}

// storedJobs returns the keys of the store's jobs map (read-only; the
// value layout is the agent's business).
func storedJobs(pinDir string) (map[uint32]bool, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "store_jobs"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open the pinned store: %w", err)
	}
	defer m.Close()
	ids := map[uint32]bool{}
	var k uint32
	v := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, v) {
		ids[k] = true
	}
	return ids, it.Err()
}

// verifyJobs asks the agent, for every job whose prolog was answered, what
// it knows of it: a step asking for every GPU must get exactly the job's
// list (a lost record refuses it: no trusted list); a job whose list was
// unusable must still refuse even a CPU-only step (a lost record would
// let it run).
func (r *run) verifyJobs(what string) {
	r.t.Helper()
	var wg sync.WaitGroup
	for _, j := range r.m.live() {
		if j.prolog != answered || j.synthetic {
			continue
		}
		if j.verify == nil {
			ask, unset := allGPUs(), false
			if j.broken {
				ask, unset = nil, true
			}
			j.verify = r.m.step(j, verifyStep, ask, unset)
			if err := r.m.mkStep(j.verify); err != nil {
				r.t.Fatal(err)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := j.verify
			a := r.pool.do(r.stepTask(s))
			r.count(func(st *stats) { st.verified++ })
			switch {
			case a.Local != "" || a.Unreached != "":
				r.t.Errorf("%s: job %d's check step: %s%s", what, j.id, a.Local, a.Unreached)
			case j.broken && a.Refused == "":
				r.t.Errorf("%s: job %d's prolog list %s was unusable and answered so, but the restarted agent accepted a step of it (GPUs [%s]): the record is lost",
					what, j.id, show(j.arg), list(u32s(a.GPUs)))
			case !j.broken && a.Refused != "":
				r.t.Errorf("%s: job %d's prolog (SLURM_JOB_GPUS %s) was answered, but the restarted agent refuses its step: %s",
					what, j.id, show(j.arg), a.Refused)
			case !j.broken && !slices.Equal(u32s(a.GPUs), j.gpus):
				r.t.Errorf("%s: job %d's prolog (SLURM_JOB_GPUS %s) was answered, but the restarted agent gives a step asking for every GPU [%s]",
					what, j.id, show(j.arg), list(u32s(a.GPUs)))
			}
			if a.Unreached == "" && a.Local == "" {
				s.st, s.refused = answered, a.Refused
			}
		}()
	}
	wg.Wait()
}

// probeAll opens every fake GPU from a task cgroup of every step that was
// sent: what opens is the step's GPUs or none, never one outside its job's
// list. In per-cgroup mode a step the agent never accepted has no filter
// of its own (no task runs there: the plugin holds them until the answer),
// so only accepted steps are probed. In scope mode a job no request named
// gets no GPU.
func (r *run) probeAll(what string) {
	r.t.Helper()
	paths := append(slices.Clone(r.n.devs), r.n.ctl)
	var wg sync.WaitGroup
	probe := func(dir string, check func(gpus []int, odd []string)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := r.pool.do(task{Op: "probe", Dir: dir, Paths: paths})
			r.count(func(s *stats) { s.probes++ })
			if a.Local != "" {
				r.t.Errorf("%s: probe %s: %s", what, dir, a.Local)
				return
			}
			check(allowed(a.Open))
		}()
	}
	for _, j := range r.m.live() {
		for _, s := range j.sent() {
			if r.n.mode == "per-cgroup" && !s.acked() {
				continue
			}
			probe(filepath.Join(s.dir, "user", "task_0"), func(gpus []int, odd []string) {
				if len(odd) > 0 {
					r.t.Errorf("%s: step %s: %v", what, s.name(), odd)
				}
				switch {
				case !subset(gpus, s.job.gpus):
					r.t.Errorf("%s: a task of step %s opens GPUs [%s], outside job %d's prolog list %s", what, s.name(), list(gpus), j.id, show(j.arg))
				case len(gpus) > 0 && !slices.Equal(gpus, s.want):
					r.t.Errorf("%s: a task of step %s opens GPUs [%s]; the step gets [%s] or nothing", what, s.name(), list(gpus), list(s.want))
				}
			})
		}
	}
	if r.n.mode == "scope" {
		probe(r.intruder, func(gpus []int, odd []string) {
			if len(gpus) > 0 || len(odd) > 0 {
				r.t.Errorf("%s: a task of a job no request named opens GPUs [%s] %v: the filter is not in force", what, list(gpus), odd)
			}
		})
	}
	wg.Wait()
}

// retry sends again what the kill cut off, as the plugin's second try
// does: the agent is back, so each must be answered now, by the rules.
func (r *run) retry(what string) {
	r.t.Helper()
	what += ", retried"
	var wg sync.WaitGroup
	for _, j := range r.m.live() {
		if j.prolog == unreached {
			r.sendProlog(j)
			r.count(func(s *stats) { s.retried++ })
			if j.prolog != answered {
				r.t.Errorf("%s: job %d's prolog: the agent does not answer", what, j.id)
			}
		}
		for _, s := range j.steps {
			if s.st != unreached {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.count(func(st *stats) { st.retried++ })
				r.stepAnswer(s, r.pool.do(r.stepTask(s)), what)
				if s.st != answered {
					r.t.Errorf("%s: step %s: the agent does not answer", what, s.name())
				}
			}()
		}
	}
	wg.Wait()
	for _, j := range r.m.ended {
		if j.epilog == unreached {
			r.sendEpilog(j)
			r.count(func(s *stats) { s.retried++ })
			if j.epilog != answered {
				r.t.Errorf("%s: job %d's epilog: the agent does not answer", what, j.id)
			}
		}
	}
}

// storeLost: a crash, then the pinned store is gone too (removed by hand,
// or an agent without it ran) and the state file is garbage. The agent
// starts, says it has no saved state, and fails closed: a new step of a
// job it has no record of gets no GPU, and what the kernel enforces for
// running steps stays as it was (its pins are the filter's, not the
// store's).
func (r *run) storeLost(iter int) {
	r.t.Helper()
	ends := r.burst(iter)
	r.pool.park(r.t, r.n.idle)
	for _, j := range ends {
		if err := r.n.removeTree(j.dir); err != nil {
			r.t.Fatal(err)
		}
		r.m.remove(j)
	}
	for _, pin := range []string{"store_jobs", "store_steps"} {
		if err := unix.Unlink(filepath.Join(r.n.pinDir, pin)); err != nil {
			r.t.Fatalf("remove the pinned store: %v", err)
		}
	}
	if err := os.RemoveAll(r.n.stateFile); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(r.n.stateFile, garbage(r.rng, 512), 0o600); err != nil {
		r.t.Fatal(err)
	}
	first := r.n.starts + 1
	r.restart()
	what := "store and state file lost"
	// A start after the loss reads the file and says so: the last one, or
	// one killed before it (after its store was complete, the next start
	// has a store to read).
	said := false
	for i := first; i <= r.n.starts && !said; i++ {
		b, _ := os.ReadFile(r.n.logPath(i))
		said = strings.Contains(string(b), "saved agent state unreadable")
	}
	if !said {
		r.t.Errorf("%s: the agent does not say its state file is unreadable:\n%s", what, r.n.logTail(30))
	}
	r.checkKernel(what)
	var wg sync.WaitGroup
	for _, j := range r.m.live() {
		ask, unset := allGPUs(), false
		if j.broken {
			ask, unset = nil, true
		}
		s := r.m.step(j, verifyStep+1, ask, unset)
		if err := r.m.mkStep(s); err != nil {
			r.t.Fatal(err)
		}
		// Without a record the job has no trusted list: no GPU.
		s.want, s.refuse = []int{}, false
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := r.pool.do(r.stepTask(s))
			r.count(func(st *stats) { st.verified++ })
			switch {
			case a.Local != "" || a.Unreached != "":
				r.t.Errorf("%s: job %d: %s%s", what, j.id, a.Local, a.Unreached)
				return
			case len(a.GPUs) > 0:
				r.t.Errorf("%s: a new step of job %d, whose record is lost, got GPUs [%s]", what, j.id, list(u32s(a.GPUs)))
			case !unset && a.Refused == "":
				r.t.Errorf("%s: a new step of job %d asking for GPUs was accepted without a trusted list", what, j.id)
			}
			s.st, s.refused = answered, a.Refused
		}()
	}
	wg.Wait()
	r.probeAll(what)
	r.pool.park(r.t, r.n.idle)
}

// finish stops the agent as its unit does and logs the figures.
func (r *run) finish() {
	r.t.Helper()
	r.n.stop()
	if r.checkStateFile && !r.t.Failed() {
		// The last write at stop holds every job whose prolog was answered.
		f, _, err := statefile.Read(r.n.stateFile)
		if err != nil {
			r.t.Errorf("the state file after the agent stopped: %v", err)
		} else {
			inFile := map[uint32][]int{}
			for _, j := range f.Jobs {
				inFile[j.ID] = j.GPUs
			}
			for _, j := range r.m.live() {
				if g, ok := inFile[j.id]; !ok || (!j.broken && !slices.Equal(g, j.gpus)) {
					r.t.Errorf("the state file written at stop has job %d with GPUs %v (present %v); its prolog list is %s", j.id, g, ok, show(j.arg))
				}
			}
		}
	}
	temps, _ := filepath.Glob(filepath.Join(r.n.stateDir, ".state-*"))
	st := r.st
	r.t.Logf("mode %s, seed %d: %d kills (%d inside a burst with %d requests unanswered in all, %d right after one, %d up to 300ms after one) and %d more during a restart (%d before it was ready); %d restarts, each ready in %v on average",
		r.n.mode, r.seed, st.kills, st.killsInBurst, st.inFlight, st.killsAfterBurst, st.killsLate, st.startupKills, st.startupKillsBeforeReady,
		st.restarts, (st.startTotal / time.Duration(max(st.restarts, 1))).Round(time.Millisecond))
	r.t.Logf("answered: %d prologs, %d steps accepted, %d refused by the rules, %d epilogs; cut off by a kill: %d prologs, %d steps, %d epilogs (%d requests sent again after the restart)",
		st.prologsAcked, st.stepsAcked, st.stepsRefused, st.epilogsAcked, st.prologsUnreached, st.stepsUnreached, st.epilogsUnreached, st.retried)
	r.t.Logf("compared: %d job records asked back, %d kernel entries read, %d probes (each opens %d GPUs), %d gpufence status runs; answered steps after a restart: %d enforced with their GPUs, %d denied; state file temporaries left by kills: %d (now %d); took %v",
		st.verified, st.entries, st.probes, nGPUs, st.statusRuns, st.ackedEnforced, st.ackedDenied, st.stateTemps, len(temps), time.Since(r.begin).Round(time.Millisecond))
}
