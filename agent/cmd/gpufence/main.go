// Command gpufence is the gpufence node agent and its command-line tools.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/daemon"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/server"
	"github.com/gpufence/gpufence/agent/version"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{
	"agent":   {"run the node agent in the foreground (needs root)", runAgent},
	"version": {"print the version", runVersion},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "gpufence: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "gpufence %s: per-job GPU isolation and audit for Slurm nodes\n\nUsage: gpufence COMMAND [flags]\n\nCommands:\n", version.Version)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun 'gpufence COMMAND --help' for a command's flags. Documentation: README.md and docs/.\n")
}

func runVersion(_ []string, stdout, _ io.Writer) int {
	fmt.Fprintf(stdout, "gpufence %s\n", version.Version)
	return 0
}

func runAgent(args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpufence agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := config.Default()
	cfgPath := fs.String("config", config.DefaultPath, "configuration file (YAML); missing is fine at the default path")
	socket := fs.String("socket", def.Socket, "unix socket the SPANK plugin connects to")
	slurmConf := fs.String("slurm-conf", def.SlurmConf, "Slurm's slurm.conf (gres.conf and cgroup.conf are read beside it)")
	nodeName := fs.String("node-name", def.NodeName, "this node's name in gres.conf")
	scope := fs.String("scope", def.Scope, "cgroup directory of Slurm's slurmstepd scope (default: found automatically)")
	mode := fs.String("mode", def.Mode, "filter attach mode: auto, scope or per-cgroup")
	logLevel := fs.String("log-level", def.LogLevel, "debug, info, warn or error")
	logFormat := fs.String("log-format", def.LogFormat, "text or json")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: gpufence agent [flags]\n\nRuns the node agent in the foreground, logging to stderr. Flags override the configuration file.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gpufence agent: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "config" {
			explicit = true
		}
	})
	cfg, err := config.Load(*cfgPath, explicit)
	if err != nil {
		fmt.Fprintf(stderr, "gpufence agent: %v\n", err)
		return 2
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "socket":
			cfg.Socket = *socket
		case "slurm-conf":
			cfg.SlurmConf = *slurmConf
		case "node-name":
			cfg.NodeName = *nodeName
		case "scope":
			cfg.Scope = *scope
		case "mode":
			cfg.Mode = *mode
		case "log-level":
			cfg.LogLevel = *logLevel
		case "log-format":
			cfg.LogFormat = *logFormat
		}
	})
	if err := cfg.Validate("command line"); err != nil {
		fmt.Fprintf(stderr, "gpufence agent: %v\n", err)
		return 2
	}
	log := newLogger(cfg, stderr)
	if err := agent(cfg, log); err != nil {
		log.Error("agent failed", "err", err)
		return 1
	}
	return 0
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(strings.ToUpper(cfg.LogLevel)))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func agent(cfg config.Config, log *slog.Logger) error {
	if os.Geteuid() != 0 {
		return errors.New("the agent must run as root (it loads BPF programs and serves a root-only socket)")
	}
	log.Info("gpufence agent starting", "version", version.Version, "socket", cfg.Socket, "slurm_conf", cfg.SlurmConf, "node", cfg.NodeName)
	major := cfg.NvidiaMajor
	if major == 0 {
		m, found, err := devices.NvidiaMajor()
		if err != nil {
			return err
		}
		if !found {
			log.Info("no NVIDIA driver in /proc/devices; using the standard major", "major", m)
		}
		major = m
	}
	mode := devfilter.Mode("")
	if cfg.Mode != config.ModeAuto {
		mode = devfilter.Mode(cfg.Mode)
	} else {
		probed, err := devfilter.Probe()
		if err != nil {
			return fmt.Errorf("this kernel cannot run the device filter: %w", err)
		}
		mode = probed
	}
	d, err := daemon.New(cfg, log, daemon.NewKernelFilter(mode, major, log), major)
	if err != nil {
		return err
	}
	ln, err := server.Listen(cfg.Socket)
	if err != nil {
		d.Close()
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv := server.New(ln, d, log, cfg.RequestTimeout.Duration)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ctx) }()
	log.Info("gpufence agent ready", "mode", mode)
	runErr := d.Run(ctx)
	serveErr := <-errc
	os.Remove(cfg.Socket)
	log.Info("gpufence agent stopped")
	return errors.Join(runErr, serveErr)
}
