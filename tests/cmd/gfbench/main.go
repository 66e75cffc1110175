// SPDX-License-Identifier: Apache-2.0

// Command gfbench measures what gpufence adds to launching GPU job steps on
// the real single-node Slurm of tests/cluster, side by side with stock Slurm
// and with Slurm's own device constraint, in one run:
//
//   - none: an empty plugstack.conf, ConstrainDevices=no;
//   - constrain: an empty plugstack.conf, cgroup.conf ConstrainDevices=yes;
//   - gpufence: the gpufence SPANK plugin and agent (production settings:
//     pinned filter, state file, Prometheus endpoint), ConstrainDevices=no;
//   - spank-noop (only with -noop): a C SPANK plugin with gpufence's
//     callbacks, each returning at once, ConstrainDevices=no. It tells what
//     Slurm itself spends on having a plugin with prolog/epilog callbacks
//     (slurmd then runs `slurmstepd spank prolog|epilog` for each job) apart
//     from what gpufence's callbacks and agent add.
//
// Shapes, all as the job user:
//
//   - new-job: `srun -n1 --gres=gpu:1 true`, a new job (prolog, extern step,
//     step 0);
//   - step-in-alloc: `srun --jobid=<alloc> -n1 --gres=gpu:1 true`, a step
//     in an existing allocation;
//   - settle: for each of those, the time from srun's exit until squeue no
//     longer lists the job (epilog, extern step end) or the step;
//   - burst: -burst (50) concurrent `srun --overlap --jobid=<alloc> -n1
//     --gres=gpu:1 true` in one allocation, the time until all have exited.
//
// For gpufence it also reads the agent's own request latency per request
// type from its histogram gpufence_request_duration_seconds (/metrics):
// over the one-at-a-time runs, and StepStart while the bursts run; and from
// the kernel's schedstat, how long the agent's threads ran and how long they
// waited for a CPU while the bursts ran. At the end, with the cluster idle,
// it times the Go client's calls on their own (clientcost.go): fork, the Go
// runtime's start, one exchange with a stand-in agent.
//
//	gfbench [-rounds N] [-runs N] [-bursts N] [-burst N] [-warmup N] [-noop] [-quick] [-out FILE] [-bin DIR] [-keep]
//
// slurmd reads cgroup.conf and the prolog/epilog plugins of plugstack.conf
// only when it starts, so the variants take turns in rounds (none,
// constrain, [spank-noop,] gpufence, none, …) with a slurmd restart between them; within a
// round the two single shapes alternate run by run, then the bursts run.
// Warm-up runs after each restart are recorded but not counted. Ratios are
// against "none" measured in the same run.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpufence/gpufence/tests/cluster"
)

// variant is one configuration of the node.
type variant struct {
	Name      string `json:"name"`
	Constrain bool   `json:"constrain_devices"`
	Gpufence  bool   `json:"gpufence"`
	Noop      bool   `json:"noop_plugin,omitempty"`
}

var (
	vNone      = variant{Name: "none"}
	vConstrain = variant{Name: "constrain", Constrain: true}
	vGpufence  = variant{Name: "gpufence", Gpufence: true}
	vNoop      = variant{Name: "spank-noop", Noop: true}
	// variants is the table's order; a run has vNoop only with -noop.
	variants = []variant{vNone, vConstrain, vNoop, vGpufence}
)

// noopPlugin is the spank-noop variant's plugin: gpufence's callbacks, none
// doing anything.
const noopPlugin = `#include <slurm/spank.h>
SPANK_PLUGIN(gfbench_noop, 1)
#define NOOP(f) int f(spank_t sp, int ac, char **av) { (void)sp; (void)ac; (void)av; return 0; }
NOOP(slurm_spank_init)
NOOP(slurm_spank_job_prolog)
NOOP(slurm_spank_task_post_fork)
NOOP(slurm_spank_task_init)
NOOP(slurm_spank_job_epilog)
`

// Shape names. settle-* are derived from the new-job and step-in-alloc
// samples.
const (
	shNewJob      = "new-job"
	shStep        = "step-in-alloc"
	shSettleJob   = "settle-job"
	shSettleStep  = "settle-step"
	shBurst       = "burst"
	metricStepSrt = "step_start"
)

// single is a shape timed one srun at a time.
type single struct {
	name string
	args func(allocID string) []string
}

var singles = []single{
	{shNewJob, func(string) []string { return []string{"-n1", "--gres=gpu:1", "true"} }},
	{shStep, func(id string) []string { return []string{"--jobid=" + id, "-n1", "--gres=gpu:1", "true"} }},
}

// sample is one timed srun, or one burst.
type sample struct {
	Variant string  `json:"variant"`
	Shape   string  `json:"shape"`
	Round   int     `json:"round"`
	Seq     int     `json:"seq"` // order of the run in the whole benchmark
	Ms      float64 `json:"ms"`
	// Queued: srun said it waited for resources (for a burst: how many did).
	Queued int `json:"queued"`
	// SettleMs is the time from srun's exit until squeue no longer showed
	// the job or step (epilog and cleanup, which srun does not wait for),
	// polled every few ms; it is not part of Ms. 0 for bursts.
	SettleMs float64   `json:"settle_ms"`
	Warmup   bool      `json:"warmup"`
	At       time.Time `json:"at"`
}

type options struct {
	rounds, runs, warmup, bursts, burst int
	quick, keep, noop                   bool
	out, bin                            string
	srunTimeout                         time.Duration
}

// report is the JSON file: the configuration, every sample and the summary.
type report struct {
	Started    time.Time     `json:"started"`
	Duration   string        `json:"duration"`
	Host       string        `json:"host"`
	CPUs       int           `json:"cpus"`
	Load       string        `json:"loadavg_at_start"`
	LoadEnd    string        `json:"loadavg_at_end"`
	RoundInfo  []roundInfo   `json:"rounds"`
	Slurm      string        `json:"slurm"`
	Variants   []variant     `json:"variants"`
	Rounds     int           `json:"rounds_per_variant"`
	Runs       int           `json:"runs_per_shape_per_round"`
	Warmup     int           `json:"warmup_per_shape_per_round"`
	Bursts     int           `json:"bursts_per_round"`
	BurstSize  int           `json:"burst_size"`
	Complete   bool          `json:"complete"`
	Error      string        `json:"error,omitempty"`
	Samples    []sample      `json:"samples"`
	Summaries  []summary     `json:"summaries,omitempty"`
	Ratios     []ratio       `json:"ratios,omitempty"`
	Agent      []agentRow    `json:"agent_latency,omitempty"`
	Targets    []target      `json:"targets,omitempty"`
	ClientCost []clientCost  `json:"client_cost,omitempty"`
	AgentHists []roundHistos `json:"agent_histograms,omitempty"`
}

// roundInfo is one round of one variant: when, how long, and how busy the
// machine was (1-minute load average; the benchmark itself adds about 1).
type roundInfo struct {
	Round     int       `json:"round"`
	Variant   string    `json:"variant"`
	At        time.Time `json:"at"`
	Seconds   float64   `json:"seconds"`
	LoadStart float64   `json:"load1_start"`
	LoadEnd   float64   `json:"load1_end"`
}

func load1() float64 {
	data, _ := os.ReadFile("/proc/loadavg")
	var l float64
	fmt.Sscan(string(data), &l)
	return l
}

// roundHistos is what one gpufence round's agent counted: its one-at-a-time
// requests and those during the bursts, per request type.
type roundHistos struct {
	Round      int                  `json:"round"`
	Sequential map[string]histogram `json:"sequential"`
	Burst      map[string]histogram `json:"burst"`
	// BurstSched is the agent's threads' schedstat summed over the bursts.
	BurstSched schedStat `json:"burst_schedstat"`
	// RoundSched is the same over the whole round: every request and
	// everything the agent does meanwhile (audit, persistence, reconcile).
	RoundSched schedStat `json:"round_schedstat"`
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 10, "rounds per variant (none, constrain, gpufence take turns; a slurmd restart each)")
	flag.IntVar(&o.runs, "runs", 4, "timed runs per single shape (new-job, step-in-alloc) per round")
	flag.IntVar(&o.warmup, "warmup", 1, "untimed runs per single shape after each slurmd restart")
	flag.IntVar(&o.bursts, "bursts", 1, "bursts per round")
	flag.IntVar(&o.burst, "burst", 50, "concurrent srun --overlap steps per burst")
	flag.BoolVar(&o.noop, "noop", false, "add the spank-noop variant: a SPANK plugin whose callbacks do nothing (what Slurm spends on a prolog/epilog plugin at all)")
	flag.BoolVar(&o.quick, "quick", false, "check that it works: 1 round per variant, 3 runs per shape, 1 burst")
	flag.StringVar(&o.out, "out", "build/bench.json", "JSON file for the configuration, every sample and the summary")
	flag.StringVar(&o.bin, "bin", "bin", "folder with gpufence and spank_gpufence.so (make build)")
	flag.BoolVar(&o.keep, "keep", false, "keep the cluster's folder (logs) after the run")
	flag.DurationVar(&o.srunTimeout, "srun-timeout", time.Minute, "limit for one srun (and for one burst)")
	flag.Parse()
	if o.quick {
		o.rounds, o.runs, o.bursts = 1, 3, 1
	}
	if o.rounds < 1 || o.runs < 1 || o.warmup < 0 || o.bursts < 0 || o.burst < 1 {
		fmt.Fprintln(os.Stderr, "gfbench: -rounds, -runs and -burst must be at least 1, -warmup and -bursts at least 0")
		os.Exit(2)
	}
	// Every signal only cancels ctx: cleanup must run to the end, or a
	// cluster and its cgroups would be left behind.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "gfbench: %v\n", err)
		stop()
		os.Exit(1)
	}
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "gfbench: "+format+"\n", a...)
}

func run(ctx context.Context, o options) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("needs root: it starts a Slurm cluster (tests/cluster)")
	}
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	agentBin := filepath.Join(bin, "gpufence")
	plugin := filepath.Join(bin, "spank_gpufence.so")
	for _, p := range []string{agentBin, plugin} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w: run make build first", err)
		}
	}
	var vs []variant
	for _, v := range variants {
		if v != vNoop || o.noop {
			vs = append(vs, v)
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	rep := &report{Started: time.Now(), CPUs: runtime.NumCPU(), Load: strings.TrimSpace(string(load)),
		Variants: vs, Rounds: o.rounds, Runs: o.runs, Warmup: o.warmup, Bursts: o.bursts, BurstSize: o.burst}
	defer func() {
		if len(rep.Samples) == 0 {
			return
		}
		rep.Complete = err == nil
		rep.Duration = time.Since(rep.Started).Round(time.Second).String()
		if err != nil {
			rep.Error = err.Error()
		}
		if werr := writeReport(o.out, rep); werr != nil {
			err = errors.Join(err, werr)
		} else {
			logf("report written to %s", o.out)
		}
	}()

	setup, err := cluster.Ensure(ctx, logf)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, setup.Teardown(logf)) }()
	logf("starting the test cluster (waits while another test cluster holds the lock)")
	t0 := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{Keep: o.keep, Logf: logf})
	if err != nil {
		return fmt.Errorf("start cluster: %w", err)
	}
	defer func() {
		logf("stopping the cluster")
		if serr := c.Stop(); serr != nil {
			err = errors.Join(err, fmt.Errorf("stop cluster: %w", serr))
		}
		if o.keep {
			logf("cluster folder kept: %s", c.Root())
		}
	}()
	logf("cluster up in %s (%s)", c.Root(), time.Since(t0).Round(time.Millisecond))
	rep.Host = c.Hostname()
	if r := c.Run(ctx, "", "srun", "--version"); r.Code == 0 {
		rep.Slurm = strings.TrimSpace(r.Stdout)
	}

	b := &bench{c: c, o: o, rep: rep, agentBin: agentBin, cur: vNone,
		sock:      filepath.Join(c.Root(), "run/agent.sock"),
		bpffs:     filepath.Join(c.Root(), "bpffs"),
		plugstack: []string{fmt.Sprintf("required %s socket=%s", plugin, filepath.Join(c.Root(), "run/agent.sock"))}}
	defer func() { err = errors.Join(err, b.stopAgent()) }()
	if o.noop {
		if b.noopPlugin, err = buildNoop(c.Root()); err != nil {
			return err
		}
	}
	// The cluster starts as "none": an empty plugstack.conf, no constraint.
	for round := range o.rounds {
		for _, v := range vs {
			ri := roundInfo{Round: round, Variant: v.Name, At: time.Now(), LoadStart: load1()}
			err := b.round(ctx, round, v)
			ri.Seconds, ri.LoadEnd = time.Since(ri.At).Seconds(), load1()
			rep.RoundInfo = append(rep.RoundInfo, ri)
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("interrupted in round %d (%s)", round, v.Name)
				}
				return fmt.Errorf("round %d (%s): %w", round, v.Name, err)
			}
		}
	}
	// The client's own cost, with the cluster idle: what each exchange
	// costs slurmstepd or the prolog process before the agent's share.
	dir := filepath.Join(c.Root(), "clientcost")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	n := 200
	if o.quick {
		n = 50
	}
	if rep.ClientCost, err = measureClientCost(dir, n); err != nil {
		return err
	}
	rep.Summaries = summarizeAll(rep.Samples)
	rep.Ratios = addPaired(ratios(rep.Summaries), rep.Samples)
	endLoad, _ := os.ReadFile("/proc/loadavg")
	rep.LoadEnd = strings.TrimSpace(string(endLoad))
	rep.Agent = agentRows(rep.AgentHists)
	rep.Targets = checkTargets(rep.Ratios, rep.Agent)
	fmt.Printf("gfbench on %s (%d CPUs, load %s at start, %s at end, %s): %d rounds per variant, %d runs per shape per round, %d warm-up, %d bursts of %d per round; %s\n",
		rep.Host, rep.CPUs, rep.Load, rep.LoadEnd, rep.Slurm, o.rounds, o.runs, o.warmup, o.bursts, o.burst, time.Since(rep.Started).Round(time.Second))
	if busy := maxLoad(rep.RoundInfo); busy > float64(rep.CPUs) {
		fmt.Printf("WARNING: the machine was busy with other work (1-minute load up to %.1f on %d CPUs): these figures are not those of a quiet node; the paired column is the more robust\n", busy, rep.CPUs)
	}
	fmt.Println()
	printTable(os.Stdout, rep.Summaries, rep.Ratios)
	fmt.Println()
	printAgent(os.Stdout, rep.Agent, sumAgentCPU(rep.AgentHists))
	fmt.Println()
	printClientCost(os.Stdout, rep.ClientCost)
	fmt.Println()
	printTargets(os.Stdout, rep.Targets)
	fmt.Printf("\nJSON: %s\n", o.out)
	return nil
}

type bench struct {
	c           *cluster.Cluster
	o           options
	rep         *report
	agentBin    string
	sock, bpffs string
	plugstack   []string
	noopPlugin  string
	agent       *cluster.Process
	metricsURL  string
	mounted     bool
	cur         variant // what slurmd was last started with
	seq         int
}

// startAgent starts the agent as a node runs it: filter pinned (in a bpffs
// of the benchmark's own), state file, audit file and Prometheus endpoint,
// all under the cluster's folder.
func (b *bench) startAgent(ctx context.Context) error {
	if err := os.MkdirAll(b.bpffs, 0o700); err != nil {
		return err
	}
	if out, err := exec.Command("mount", "-t", "bpf", "gpufence-bench", b.bpffs).CombinedOutput(); err != nil {
		return fmt.Errorf("mount bpffs: %v %s", err, out)
	}
	b.mounted = true
	state := filepath.Join(b.c.Root(), "run", "agent-state.json")
	// Each gpufence round starts from nothing, as the pins do.
	if err := os.Remove(state); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	addr, err := freeAddr()
	if err != nil {
		return fmt.Errorf("metrics port: %w", err)
	}
	b.metricsURL = "http://" + addr + "/metrics"
	cfg := filepath.Join(b.c.Root(), "etc", "agent.yaml")
	yaml := fmt.Sprintf("audit:\n  file: %s\n  journald: \"off\"\npin_dir: %s\nstate_file: %s\nfailopen_spool: %s\nnvidia_caps_major: %d\nmetrics:\n  listen: %s\n",
		filepath.Join(b.c.Root(), "logs", "audit.jsonl"), filepath.Join(b.bpffs, "gpufence"), state,
		filepath.Join(b.c.Root(), "run", "failopen", "failopen.jsonl"), b.c.CapsMajor(), addr)
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		return err
	}
	p, err := b.c.StartAgent(ctx, b.agentBin, "agent", "--config", cfg, "--socket", b.sock, "--slurm-conf", b.c.SlurmConf())
	if err != nil {
		return err
	}
	b.agent = p
	for deadline := time.Now().Add(20 * time.Second); ; {
		if !p.Alive() {
			return fmt.Errorf("gpufence agent exited\n%s", lastLines(b.c.LogPath("gpufence.log"), 20))
		}
		err := cluster.WaitSocket(b.sock, 100*time.Millisecond)
		if err == nil {
			_, err = b.scrape(ctx)
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gpufence agent: %w\n%s", err, lastLines(b.c.LogPath("gpufence.log"), 20))
		}
	}
}

// stopAgent stops the agent and drops its pins: "none" and "constrain" are
// stock Slurm, with no gpufence filter left on the scope.
func (b *bench) stopAgent() error {
	var errs []error
	if b.agent != nil {
		errs = append(errs, b.agent.Stop())
		b.agent = nil
	}
	if b.mounted {
		if out, err := exec.Command("umount", b.bpffs).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("umount %s: %v %s", b.bpffs, err, out))
		} else {
			b.mounted = false
		}
	}
	return errors.Join(errs...)
}

func (b *bench) scrape(ctx context.Context) (map[string]histogram, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", b.metricsURL, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return parseHistograms(string(body), requestDurationMetric)
}

// configure switches slurmd (and the agent) to v.
func (b *bench) configure(ctx context.Context, v variant) error {
	t0 := time.Now()
	if err := b.stopAgent(); err != nil {
		return err
	}
	var lines []string
	if v.Gpufence {
		if err := b.startAgent(ctx); err != nil {
			return err
		}
		lines = b.plugstack
	}
	if v.Noop {
		lines = []string{"required " + b.noopPlugin}
	}
	if err := b.c.WritePlugstack(lines); err != nil {
		return err
	}
	if err := b.c.RestartSlurmd(v.Constrain); err != nil {
		return err
	}
	b.cur = v
	logf("switched to %s (%s)", v.Name, time.Since(t0).Round(time.Millisecond))
	return nil
}

var grantedRE = regexp.MustCompile(`Granted job allocation (\d+)`)

// round measures every shape in variant v, alternating the single shapes
// run by run, inside a fresh allocation whose prolog ran with v.
func (b *bench) round(ctx context.Context, round int, v variant) (err error) {
	if err := b.configure(ctx, v); err != nil {
		return err
	}
	var h0 map[string]histogram
	var s0 schedStat
	if v.Gpufence {
		if h0, err = b.scrape(ctx); err != nil {
			return err
		}
		s0 = readSchedStat(b.agent.PID)
	}
	applied := b.countApplied()
	r := b.c.Run(ctx, cluster.TestUser, "salloc", "--no-shell", "-n1", "--gres=gpu:1", "-J", "gfbench-alloc")
	m := grantedRE.FindStringSubmatch(r.Stderr)
	if r.Code != 0 || m == nil {
		return fmt.Errorf("allocation: %s", r)
	}
	alloc := m[1]
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if r := b.c.Run(cctx, "", "scancel", alloc); r.Code != 0 {
			err = errors.Join(err, fmt.Errorf("scancel %s: %s", alloc, r))
		} else if _, werr := b.c.WaitJob(cctx, alloc); werr != nil {
			err = errors.Join(err, werr)
		}
	}()
	if err := b.waitQuiet(ctx, alloc); err != nil {
		return err
	}
	steps := 0
	for i := range b.o.warmup + b.o.runs {
		order := slices.Clone(singles)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, sh := range order {
			s, err := b.measure(ctx, sh, alloc, v)
			if err != nil {
				return err
			}
			s.Round, s.Warmup = round, i < b.o.warmup
			b.rep.Samples = append(b.rep.Samples, s)
			steps++
		}
	}
	hs := roundHistos{Round: round, Burst: map[string]histogram{}}
	var hb map[string]histogram
	var sb schedStat
	if v.Gpufence {
		if hb, err = b.scrape(ctx); err != nil {
			return err
		}
		sb = readSchedStat(b.agent.PID)
	}
	for range b.o.bursts {
		s, err := b.burst(ctx, alloc, v)
		if err != nil {
			return err
		}
		s.Round = round
		b.rep.Samples = append(b.rep.Samples, s)
		steps += b.o.burst
		if v.Gpufence {
			ha, err := b.scrape(ctx)
			if err != nil {
				return err
			}
			addHistos(hs.Burst, subHistos(ha, hb))
			hb = ha
			sa := readSchedStat(b.agent.PID)
			hs.BurstSched = hs.BurstSched.add(sa.sub(sb))
			sb = sa
		}
	}
	// A benchmark of gpufence that never reached gpufence would be a lie:
	// every step, the allocation's extern step and each new job's extern
	// step got a policy.
	if v.Gpufence {
		if got := b.countApplied() - applied; got < steps {
			return fmt.Errorf("the agent applied %d step policies for %d sruns: is the plugin in the path? see %s", got, steps, b.c.LogPath("gpufence.log"))
		}
		h1, err := b.scrape(ctx)
		if err != nil {
			return err
		}
		hs.RoundSched = readSchedStat(b.agent.PID).sub(s0)
		hs.Sequential = subHistos(subHistos(h1, h0), hs.Burst)
		b.rep.AgentHists = append(b.rep.AgentHists, hs)
	}
	logf("round %d %s: %d sruns", round, v.Name, steps)
	return nil
}

// measure times one srun, then how long until its job or step has left,
// which is also what keeps the next srun from waiting for its resources.
func (b *bench) measure(ctx context.Context, sh single, alloc string, v variant) (sample, error) {
	sctx, cancel := context.WithTimeout(ctx, b.o.srunTimeout)
	defer cancel()
	at := time.Now()
	r := b.c.Run(sctx, cluster.TestUser, "srun", sh.args(alloc)...)
	d := time.Since(at)
	if r.Code != 0 {
		return sample{}, fmt.Errorf("%s after %s: %s", sh.name, d.Round(time.Millisecond), r)
	}
	settleAt := time.Now()
	if err := b.waitSettled(ctx, sh.name, alloc); err != nil {
		return sample{}, err
	}
	settle := time.Since(settleAt)
	// The settle poll looks at one list only; the next run needs both quiet.
	if err := b.waitQuiet(ctx, alloc); err != nil {
		return sample{}, err
	}
	b.seq++
	q := 0
	if waitedForResources(r.Stderr) {
		q = 1
	}
	return sample{Variant: v.Name, Shape: sh.name, Seq: b.seq, Ms: ms(d), Queued: q, At: at, SettleMs: ms(settle)}, nil
}

// burst starts b.o.burst overlapping steps in alloc at once and times
// until the last srun has exited.
func (b *bench) burst(ctx context.Context, alloc string, v variant) (sample, error) {
	sctx, cancel := context.WithTimeout(ctx, b.o.srunTimeout)
	defer cancel()
	args := []string{"--overlap", "--jobid=" + alloc, "-n1", "--gres=gpu:1", "true"}
	results := make([]cluster.Result, b.o.burst)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = b.c.Run(sctx, cluster.TestUser, "srun", args...)
		}()
	}
	at := time.Now()
	close(start)
	wg.Wait()
	d := time.Since(at)
	q := 0
	for _, r := range results {
		if r.Code != 0 {
			return sample{}, fmt.Errorf("burst of %d after %s: %s", b.o.burst, d.Round(time.Millisecond), r)
		}
		if waitedForResources(r.Stderr) {
			q++
		}
	}
	if err := b.waitQuiet(ctx, alloc); err != nil {
		return sample{}, err
	}
	b.seq++
	return sample{Variant: v.Name, Shape: shBurst, Seq: b.seq, Ms: ms(d), Queued: q, At: at}, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// waitSettled polls one squeue list as fast as it answers: for a new job
// until the allocation is the only job left, for a step until the
// allocation's extern step is its only step.
func (b *bench) waitSettled(ctx context.Context, shape, alloc string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	args, want := []string{"-h", "-o", "%i %T"}, []string{alloc, "RUNNING"}
	if shape == shStep {
		args, want = []string{"-h", "-s", "-o", "%i"}, []string{alloc + ".extern"}
	}
	for {
		r := b.c.Run(ctx, "", "squeue", args...)
		if r.Code == 0 && slices.Equal(strings.Fields(r.Stdout), want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s to leave squeue: %w\n%s", shape, ctx.Err(), r)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// waitQuiet waits until the allocation is the only job and its extern step
// its only step, so that no srun waits for a predecessor's resources.
func (b *bench) waitQuiet(ctx context.Context, alloc string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		jobs := b.c.Run(ctx, "", "squeue", "-h", "-o", "%i %T")
		steps := b.c.Run(ctx, "", "squeue", "-h", "-s", "-o", "%i")
		if jobs.Code == 0 && steps.Code == 0 &&
			strings.TrimSpace(jobs.Stdout) == alloc+" RUNNING" &&
			slices.Equal(strings.Fields(steps.Stdout), []string{alloc + ".extern"}) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for earlier jobs and steps to leave: %w\njobs: %s\nsteps: %s", ctx.Err(), jobs, steps)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// countApplied counts the agent's "step policy applied" log lines.
func (b *bench) countApplied() int {
	data, err := os.ReadFile(b.c.LogPath("gpufence.log"))
	if err != nil {
		return 0
	}
	return strings.Count(string(data), "step policy applied")
}

// buildNoop compiles noopPlugin into the cluster's folder.
func buildNoop(root string) (string, error) {
	dir := filepath.Join(root, "noop")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	src, so := filepath.Join(dir, "spank_noop.c"), filepath.Join(dir, "spank_noop.so")
	if err := os.WriteFile(src, []byte(noopPlugin), 0o644); err != nil {
		return "", err
	}
	if out, err := exec.Command("cc", "-O2", "-fPIC", "-shared", "-Wall", "-Werror", "-o", so, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the spank-noop plugin: %v\n%s", err, out)
	}
	return so, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func lastLines(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func writeReport(path string, rep *report) error {
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}
