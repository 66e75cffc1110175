// SPDX-License-Identifier: Apache-2.0

// Command gfbench measures what gpufence adds to launching a GPU job step
// on the real single-node Slurm of tests/cluster: the wall time of
// `srun -n1 --gres=gpu:1 true`, run as the job user, as a new job and as a
// step inside an existing allocation, each with an empty plugstack.conf and
// with the gpufence SPANK plugin and agent.
//
//	gfbench [-rounds N] [-runs N] [-warmup N] [-quick] [-out FILE] [-bin DIR] [-keep]
//
// slurmd reads the prolog/epilog plugins of plugstack.conf only when it
// starts, so the two configurations alternate in rounds with a slurmd
// restart between them; within a round the two shapes alternate run by run.
// Warm-up runs after each restart are recorded but not counted.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gpufence/gpufence/tests/cluster"
)

// shape is one way of launching the measured step.
type shape struct {
	name string
	args func(allocID string) []string
}

var shapes = []shape{
	{"new-job", func(string) []string { return []string{"-n1", "--gres=gpu:1", "true"} }},
	{"step-in-alloc", func(id string) []string { return []string{"--jobid=" + id, "-n1", "--gres=gpu:1", "true"} }},
}

// sample is one timed srun.
type sample struct {
	Variant string  `json:"variant"`
	Shape   string  `json:"shape"`
	With    bool    `json:"with_gpufence"`
	Round   int     `json:"round"`
	Seq     int     `json:"seq"` // order of the run in the whole benchmark
	Ms      float64 `json:"ms"`
	Queued  bool    `json:"queued"`
	// SettleMs is the time from srun's exit until squeue showed the job or
	// step gone (epilog and cleanup, which srun does not wait for), polled
	// about every 50 ms; it is not part of Ms.
	SettleMs float64   `json:"settle_ms"`
	Warmup   bool      `json:"warmup"`
	At       time.Time `json:"at"`
}

type options struct {
	rounds, runs, warmup int
	quick, keep          bool
	out, bin             string
	srunTimeout          time.Duration
}

// report is the JSON file: the configuration, every sample and the summary.
type report struct {
	Started   time.Time `json:"started"`
	Host      string    `json:"host"`
	CPUs      int       `json:"cpus"`
	Slurm     string    `json:"slurm"`
	Rounds    int       `json:"rounds_per_config"`
	Runs      int       `json:"runs_per_shape_per_round"`
	Warmup    int       `json:"warmup_per_shape_per_round"`
	Complete  bool      `json:"complete"`
	Error     string    `json:"error,omitempty"`
	Samples   []sample  `json:"samples"`
	Summaries []summary `json:"summaries,omitempty"`
	Ratios    []ratio   `json:"ratios,omitempty"`
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 6, "rounds per configuration (without, with alternate; a slurmd restart each)")
	flag.IntVar(&o.runs, "runs", 5, "timed runs per shape per round")
	flag.IntVar(&o.warmup, "warmup", 1, "untimed runs per shape after each slurmd restart")
	flag.BoolVar(&o.quick, "quick", false, "check that it works: 1 round per configuration, 2 runs per shape")
	flag.StringVar(&o.out, "out", "", "JSON file for the raw samples (default /var/tmp/gfbench-<time>.json)")
	flag.StringVar(&o.bin, "bin", "bin", "folder with gpufence, spank_gpufence.so and spank_gpufence_go.so (make build)")
	flag.BoolVar(&o.keep, "keep", false, "keep the cluster's folder (logs) after the run")
	flag.DurationVar(&o.srunTimeout, "srun-timeout", time.Minute, "limit for one srun")
	flag.Parse()
	if o.quick {
		o.rounds, o.runs = 1, 2
	}
	if o.rounds < 1 || o.runs < 1 || o.warmup < 0 {
		fmt.Fprintln(os.Stderr, "gfbench: -rounds and -runs must be at least 1, -warmup at least 0")
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
	for _, p := range []string{agentBin, plugin, filepath.Join(bin, "spank_gpufence_go.so")} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w: run make build first", err)
		}
	}
	if o.out == "" {
		o.out = fmt.Sprintf("/var/tmp/gfbench-%s.json", time.Now().Format("20060102-150405"))
	}
	rep := &report{Started: time.Now(), CPUs: runtime.NumCPU(), Rounds: o.rounds, Runs: o.runs, Warmup: o.warmup}
	defer func() {
		if len(rep.Samples) == 0 {
			return
		}
		rep.Complete = err == nil
		if err != nil {
			rep.Error = err.Error()
		}
		if werr := writeReport(o.out, rep); werr != nil {
			err = errors.Join(err, werr)
		} else {
			logf("samples written to %s", o.out)
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

	b := &bench{c: c, o: o, rep: rep, agentBin: agentBin,
		plugstack: []string{fmt.Sprintf("required %s socket=%s", plugin, filepath.Join(c.Root(), "run/agent.sock"))}}
	defer func() { err = errors.Join(err, b.stopAgent()) }()
	// Without first: the cluster starts with an empty plugstack.conf.
	for round := range 2 * o.rounds {
		with := round%2 == 1
		if err := b.round(ctx, round, with); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted in round %d (%s)", round, config(with))
			}
			return fmt.Errorf("round %d (%s): %w", round, config(with), err)
		}
	}
	sums := map[string]summary{}
	for _, with := range []bool{false, true} {
		for _, sh := range shapes {
			s := summarize(variantName(sh, with), rep.Samples)
			sums[s.Variant] = s
			rep.Summaries = append(rep.Summaries, s)
		}
	}
	rep.Ratios = ratios(sums)
	fmt.Printf("srun -n1 --gres=gpu:1 true as %s on %s (%d CPUs, %s): %d rounds per configuration, %d runs per shape per round, %d warm-up\n\n",
		cluster.TestUser, rep.Host, rep.CPUs, rep.Slurm, o.rounds, o.runs, o.warmup)
	printTable(os.Stdout, rep.Summaries, rep.Ratios)
	fmt.Println()
	return nil
}

func config(with bool) string {
	if with {
		return "with gpufence"
	}
	return "without gpufence"
}

type bench struct {
	c         *cluster.Cluster
	o         options
	rep       *report
	agentBin  string
	plugstack []string
	agent     *cluster.Process
	with      bool // what slurmd was last started with
	seq       int
}

func (b *bench) startAgent(ctx context.Context) error {
	sock := filepath.Join(b.c.Root(), "run/agent.sock")
	p, err := b.c.StartAgent(ctx, b.agentBin, "agent", "--socket", sock, "--slurm-conf", b.c.SlurmConf(),
		"--pin-dir=", "--state-file=", "--audit-file", filepath.Join(b.c.Root(), "logs", "audit.jsonl"))
	if err != nil {
		return err
	}
	b.agent = p
	for deadline := time.Now().Add(15 * time.Second); ; {
		if !p.Alive() {
			return fmt.Errorf("gpufence agent exited\n%s", lastLines(b.c.LogPath("gpufence.log"), 20))
		}
		err := cluster.WaitSocket(sock, 100*time.Millisecond)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gpufence agent: %w\n%s", err, lastLines(b.c.LogPath("gpufence.log"), 20))
		}
	}
}

func (b *bench) stopAgent() error {
	if b.agent == nil {
		return nil
	}
	err := b.agent.Stop()
	b.agent = nil
	return err
}

// configure switches slurmd (and the agent) to with or without gpufence.
func (b *bench) configure(ctx context.Context, with bool) error {
	if with == b.with {
		return nil
	}
	t0 := time.Now()
	if with {
		if err := b.startAgent(ctx); err != nil {
			return err
		}
		if err := b.c.WritePlugstack(b.plugstack); err != nil {
			return err
		}
	} else {
		if err := b.c.WritePlugstack(nil); err != nil {
			return err
		}
		// Without means stock Slurm: no filter attached to the scope either.
		if err := b.stopAgent(); err != nil {
			return err
		}
	}
	if err := b.c.RestartSlurmd(false); err != nil {
		return err
	}
	b.with = with
	logf("switched to %s (%s)", config(with), time.Since(t0).Round(time.Millisecond))
	return nil
}

var grantedRE = regexp.MustCompile(`Granted job allocation (\d+)`)

// round measures both shapes in one configuration, alternating shapes run
// by run, inside a fresh allocation whose prolog ran with that
// configuration.
func (b *bench) round(ctx context.Context, round int, with bool) (err error) {
	if err := b.configure(ctx, with); err != nil {
		return err
	}
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
	applied := b.countApplied()
	total := 0
	for i := range b.o.warmup + b.o.runs {
		order := slices.Clone(shapes)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, sh := range order {
			s, err := b.measure(ctx, sh, alloc, with)
			if err != nil {
				return err
			}
			s.Round, s.Warmup = round, i < b.o.warmup
			b.rep.Samples = append(b.rep.Samples, s)
			total++
		}
	}
	// A benchmark of gpufence that never reached gpufence would be a lie.
	if with {
		if got := b.countApplied() - applied; got < total {
			return fmt.Errorf("the agent applied %d step policies for %d sruns: is the plugin in the path? see %s", got, total, b.c.LogPath("gpufence.log"))
		}
	}
	logf("round %d %s: %d sruns", round, config(with), total)
	return nil
}

// measure times one srun, then waits until its job or step has left so
// that the next srun never waits for its resources.
func (b *bench) measure(ctx context.Context, sh shape, alloc string, with bool) (sample, error) {
	sctx, cancel := context.WithTimeout(ctx, b.o.srunTimeout)
	defer cancel()
	at := time.Now()
	r := b.c.Run(sctx, cluster.TestUser, "srun", sh.args(alloc)...)
	d := time.Since(at)
	if r.Code != 0 {
		return sample{}, fmt.Errorf("%s after %s: %s", sh.name, d.Round(time.Millisecond), r)
	}
	settleAt := time.Now()
	if err := b.waitQuiet(ctx, alloc); err != nil {
		return sample{}, err
	}
	b.seq++
	return sample{
		Variant: variantName(sh, with), Shape: sh.name, With: with, Seq: b.seq,
		Ms: ms(d), Queued: waitedForResources(r.Stderr), At: at, SettleMs: ms(time.Since(settleAt)),
	}, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

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
