// SPDX-License-Identifier: Apache-2.0

// Command gfcluster starts and stops the end-to-end test cluster of
// tests/cluster by hand: a real single-node Slurm on this machine.
//
//	gfcluster up [--root DIR] [--gpus N] [--constrain-devices] [--plugstack LINE]... [--slurm-conf LINE]...
//	gfcluster status [--root DIR]
//	gfcluster down [--root DIR] [--keep-user]
//	gfcluster demo [--bin DIR] [--keep]
//
// `up` prints the line to source for Slurm clients; the running state is in
// <root>/state.json and the last root in /run/lock/gfcluster.current.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/gpufence/gpufence/tests/cluster"
)

// currentFile remembers the root of the cluster `up` started last, so that
// `down` and `status` need no --root.
const currentFile = "/run/lock/gfcluster.current"

// command is one subcommand; adding one (the lead's `demo`) is one entry in
// commands.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]command{
	"up":     {"start a cluster and print the environment to source", up},
	"down":   {"stop the cluster and remove what the harness created", down},
	"status": {"show the cluster's daemons and sinfo", status},
	"demo":   {"start a cluster with gpufence and show isolation and audit (needs `make build`)", demo},
}

func main() {
	if len(os.Args) < 2 || commands[os.Args[1]].run == nil {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := commands[os.Args[1]].run(ctx, os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "gfcluster %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: gfcluster <command> [flags]")
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", n, commands[n].summary)
	}
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, "; ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }

func up(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	root := fs.String("root", "", "work folder (default: a new folder under /var/tmp)")
	gpus := fs.Int("gpus", 4, "number of fake GPUs (per node)")
	nodes := fs.Int("nodes", 1, "number of slurmd, each a node of its own (n1, n2, …; see tests/cluster/multinode.go)")
	constrain := fs.Bool("constrain-devices", false, "cgroup.conf ConstrainDevices=yes (Slurm's own device filter)")
	slurm := fs.String("slurm", "", "the Slurm release, e.g. 25.11 or 26.05+jobidpaths (default: $GPUFENCE_SLURM, else 22.05; see tests/slurmrel)")
	var plugstack, extra multi
	fs.Var(&plugstack, "plugstack", "a plugstack.conf line (repeatable)")
	fs.Var(&extra, "slurm-conf", "a line appended to slurm.conf (repeatable)")
	fs.Parse(args)
	if b, err := os.ReadFile(currentFile); err == nil {
		if _, err := os.Stat(strings.TrimSpace(string(b)) + "/state.json"); err == nil {
			return fmt.Errorf("a cluster already runs in %s: gfcluster down first", strings.TrimSpace(string(b)))
		}
	}
	setup, err := cluster.Ensure(ctx, logf)
	if err != nil {
		return err
	}
	t0 := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{
		Root: *root, GPUs: *gpus, Nodes: *nodes, ConstrainDevices: *constrain, Slurm: *slurm,
		Plugstack: plugstack, ExtraSlurmConf: extra, Logf: logf,
	})
	if err != nil {
		return errors.Join(err, setup.Teardown(logf))
	}
	if err := setup.HoldFor(c.Root()); err != nil {
		return errors.Join(err, c.Stop(), setup.Teardown(logf))
	}
	if err := c.SetSetup(setup); err != nil {
		return errors.Join(err, c.Stop(), setup.Teardown(logf))
	}
	if _, err := c.BuildTool(ctx, "gf-open"); err != nil {
		logf("warning: %v", err)
	}
	if err := os.WriteFile(currentFile, []byte(c.Root()+"\n"), 0o644); err != nil {
		return err
	}
	logf("cluster up in %s (%s); Slurm %s (%s); job user %s; fake GPUs %s; gf-open in %s/bin",
		c.Root(), time.Since(t0).Round(time.Millisecond), c.SlurmVersion(), c.Kind(), cluster.TestUser,
		strings.Join(c.AllDevPaths(), " "), c.Root())
	fmt.Printf("export %s PATH=%s\n", strings.Join(c.Env(), " "), c.ToolPATH())
	return nil
}

func load(args []string, name string) (*cluster.Cluster, *flag.FlagSet, []bool, error) {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	root := fs.String("root", "", "the cluster's work folder (default: the last one `up` started)")
	keepUser := fs.Bool("keep-user", false, "keep the test user and munge key that `up` created")
	fs.Parse(args)
	if *root == "" {
		b, err := os.ReadFile(currentFile)
		if err != nil {
			return nil, fs, nil, fmt.Errorf("no --root and no %s: is a cluster up?", currentFile)
		}
		*root = strings.TrimSpace(string(b))
	}
	c, err := cluster.Load(*root, logf)
	return c, fs, []bool{*keepUser}, err
}

func down(ctx context.Context, args []string) error {
	c, _, flags, err := load(args, "down")
	if err != nil {
		return err
	}
	// Not while a test starts or runs a cluster of its own: they share
	// the node's scope.
	lctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	logf("waiting for the test cluster lock (a test that runs a cluster holds it)")
	if err := c.Lock(lctx); err != nil {
		return err
	}
	setup := c.Setup()
	err = c.Stop()
	if !flags[0] {
		err = errors.Join(err, setup.Teardown(logf))
	}
	if b, rerr := os.ReadFile(currentFile); rerr == nil && strings.TrimSpace(string(b)) == c.Root() {
		err = errors.Join(err, os.Remove(currentFile))
	}
	return err
}

func status(ctx context.Context, args []string) error {
	c, _, _, err := load(args, "status")
	if err != nil {
		return err
	}
	fmt.Printf("root %s\nexport %s\nscope %s\n", c.Root(), strings.Join(c.Env(), " "), c.ScopeDir())
	for _, p := range c.Daemons() {
		state := "running"
		if !p.Alive() {
			state = "gone"
		}
		fmt.Printf("%-12s pid %-7d %s  log %s\n", p.Name, p.PID, state, p.Log)
	}
	r := c.Run(ctx, "", "sinfo", "-N", "-o", "%N %t %G")
	fmt.Print(r.Stdout, r.Stderr)
	return nil
}
