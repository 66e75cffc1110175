// SPDX-License-Identifier: Apache-2.0

// Command gpufence is the gpufence node agent and its command-line tools.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/daemon"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/metrics"
	"github.com/gpufence/gpufence/agent/server"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/version"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func agentCommand() *cobra.Command {
	def := config.Default()
	var (
		cfgPath, socket, slurmConf, nodeName, scope, mode, logLevel, logFormat string
		auditFile, pinDir, stateFile, metricsListen                            string
		auditOnly                                                              bool
	)
	cmd := &cobra.Command{
		Use:   "agent [flags]",
		Short: "run the node agent in the foreground (needs root)",
		Long: "Runs the node agent in the foreground, logging to stderr. Flags override the configuration file.\n\n" +
			"Exit status: 0 stopped by SIGTERM or SIGINT, 1 the agent failed, 2 usage error or unusable configuration.",
	}
	fs := cmd.Flags()
	fs.StringVar(&cfgPath, "config", config.DefaultPath, "configuration file (YAML); missing is fine at the default path")
	fs.StringVar(&socket, "socket", def.Socket, "unix socket the SPANK plugin connects to")
	fs.StringVar(&slurmConf, "slurm-conf", def.SlurmConf, "Slurm's slurm.conf (gres.conf and cgroup.conf are read beside it)")
	fs.StringVar(&nodeName, "node-name", def.NodeName, "this node's name in gres.conf")
	fs.StringVar(&scope, "scope", def.Scope, "cgroup directory of Slurm's slurmstepd scope (default: found automatically)")
	fs.StringVar(&mode, "mode", def.Mode, "filter attach mode: auto, scope or per-cgroup")
	fs.StringVar(&logLevel, "log-level", def.LogLevel, "debug, info, warn or error")
	fs.StringVar(&logFormat, "log-format", def.LogFormat, "text or json")
	fs.BoolVar(&auditOnly, "audit-only", false, "allow every access and record what would have been denied (enforcement: audit-only)")
	fs.StringVar(&auditFile, "audit-file", def.Audit.File, "JSON Lines audit file (empty disables it)")
	fs.StringVar(&pinDir, "pin-dir", def.PinDir, "bpffs folder where the filter is pinned so it outlives the agent (empty: detach at stop)")
	fs.StringVar(&stateFile, "state-file", def.StateFile, "file keeping job and step attribution across restarts (empty: memory only)")
	fs.StringVar(&metricsListen, "metrics-listen", def.Metrics.Listen, "host:port of the Prometheus endpoint, /metrics and /healthz (empty disables it)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := loadConfig(fs, cfgPath)
		if err != nil {
			return configError(err)
		}
		// What the command line sets wins over the file.
		for name, apply := range map[string]func(){
			"socket":         func() { cfg.Socket = socket },
			"slurm-conf":     func() { cfg.SlurmConf = slurmConf },
			"node-name":      func() { cfg.NodeName = nodeName },
			"scope":          func() { cfg.Scope = scope },
			"mode":           func() { cfg.Mode = mode },
			"log-level":      func() { cfg.LogLevel = logLevel },
			"log-format":     func() { cfg.LogFormat = logFormat },
			"audit-only":     func() { cfg.Enforcement = enforcement(auditOnly) },
			"audit-file":     func() { cfg.Audit.File = auditFile },
			"pin-dir":        func() { cfg.PinDir = pinDir },
			"state-file":     func() { cfg.StateFile = stateFile },
			"metrics-listen": func() { cfg.Metrics.Listen = metricsListen },
		} {
			if fs.Changed(name) {
				apply()
			}
		}
		if err := cfg.Validate("command line"); err != nil {
			return configError(err)
		}
		if cfg.Metrics.WebConfig != "" {
			if err := metrics.CheckWebConfig(cfg.Metrics.WebConfig); err != nil {
				return configError(fmt.Errorf("%s: metrics.web_config: %w", cfgPath, err))
			}
		}
		log := newLogger(cfg, cmd.ErrOrStderr())
		reload := func() (config.Config, error) {
			c, err := loadConfig(fs, cfgPath)
			if err != nil {
				return c, err
			}
			// Flags still win over the file.
			if fs.Changed("audit-only") {
				c.Enforcement = cfg.Enforcement
			}
			return c, nil
		}
		if err := startAgent(cfg, log, reload); err != nil {
			log.Error("agent failed", "err", err)
			return exitStatus(exitFailure)
		}
		return nil
	}
	return cmd
}

// startAgent is agent; tests replace it to see the configuration the
// command line makes.
var startAgent = agent

func enforcement(auditOnly bool) string {
	if auditOnly {
		return config.EnforcementAuditOnly
	}
	return config.EnforcementEnforce
}

// loadConfig reads the configuration file named by --config over the
// defaults; a missing file is an error only when --config was given.
func loadConfig(fs *pflag.FlagSet, path string) (config.Config, error) {
	return config.Load(path, fs.Changed("config"))
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

func agent(cfg config.Config, log *slog.Logger, reload func() (config.Config, error)) error {
	if os.Geteuid() != 0 {
		return errors.New("the agent must run as root (it loads BPF programs and serves a root-only socket)")
	}
	log.Info("gpufence agent starting", "version", version.Version, "socket", cfg.Socket, "slurm_conf", cfg.SlurmConf, "node", cfg.NodeName, "enforcement", cfg.Enforcement)
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
	if cfg.NvidiaCapsMajor == 0 {
		// The daemon and the filter take the resolved value from cfg.
		m, found, err := devices.CapsMajor()
		if err != nil {
			return err
		}
		if found {
			cfg.NvidiaCapsMajor = m
		} else {
			log.Info("no nvidia-caps in /proc/devices: MIG capability devices are not narrowed, and MIG slices in gres.conf are refused")
		}
	}
	if cfg.NvidiaCapsMajor == major {
		return fmt.Errorf("nvidia-caps major %d is the NVIDIA GPU major too; set nvidia_major or nvidia_caps_major", major)
	}
	nvswitchMajor, nvlinkMajor, err := resolveFabric(&cfg, major, log)
	if err != nil {
		return err
	}
	if err := resolveIMEX(&cfg, major, log); err != nil {
		return err
	}
	if m := cfg.IMEXChannelsMajor; m != 0 && (m == cfg.NVSwitchMajor || m == cfg.NVLinkMajor) {
		return fmt.Errorf("IMEX channel major %d is the nvidia-nvswitch or nvidia-nvlink major too; set imex_channels_major, nvswitch_major or nvlink_major", m)
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
	cluster := cfg.ClusterName
	if cluster == "" {
		if st, err := slurm.ReadSettings(cfg.SlurmConf); err == nil {
			cluster = st.ClusterName
		}
	}
	// Bounded to one second in all (DNS and IMDS): what it cannot learn
	// is left out of the records, never a reason not to start.
	host, herr := audit.HostIdentity(audit.HostOptions{IMDS: cfg.Audit.EC2InstanceID, IMDSEndpoint: cfg.Audit.IMDSEndpoint})
	if herr != nil {
		log.Warn("host identity for the audit records is incomplete", "err", herr, "machine_id", host.MachineID, "fqdn", host.FQDN, "ec2_instance_id", host.EC2InstanceID)
	}
	rec, err := audit.New(audit.Options{
		File: cfg.Audit.File, OCSFFile: cfg.Audit.OCSFFile, FileMode: cfg.Audit.AuditFileMode(), FileGroup: cfg.Audit.FileGroup, Journald: cfg.Audit.Journald, Syslog: cfg.Audit.Syslog,
		SyslogTLS: audit.SyslogTLS{CAFile: cfg.Audit.SyslogTLSCA, CertFile: cfg.Audit.SyslogTLSCert, KeyFile: cfg.Audit.SyslogTLSKey, ServerName: cfg.Audit.SyslogTLSServerName}, QueueSize: cfg.Audit.QueueSize,
		Node: cfg.NodeName, Cluster: cluster, AgentVersion: version.Version, Host: host,
	}, log.With("component", "audit"))
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer func() {
		if err := rec.Close(); err != nil {
			log.Error("close audit trail", "err", err)
		}
	}()
	fopts := devfilter.Options{
		Mode: mode, NvidiaMajor: major, CapsMajor: cfg.NvidiaCapsMajor, Logger: log, PinDir: cfg.PinDir,
		NVSwitchMajor: nvswitchMajor, NVLinkMajor: nvlinkMajor, IMEXMajor: cfg.IMEXChannelsMajor,
		AuditOnly:    cfg.Enforcement == config.EnforcementAuditOnly,
		AuditAllowed: devfilter.AuditAllowed(cfg.Audit.Allowed),
		RateWindow:   cfg.Audit.RateWindow.Duration, RateBurst: cfg.Audit.RateBurst,
	}
	inv, nvmlGPUs, err := openInventory(cfg, log)
	if err != nil {
		return err
	}
	if inv != nil {
		defer inv.Close()
	}
	// The sampler is the NVML inventory where the agent has one.
	exp := newExporter(cfg, rec, inventorySampler(inv), log)
	d, err := daemon.New(cfg, log, daemon.NewKernelFilter(fopts), major, exp.Tap(rec))
	if err != nil {
		rec.Emit(audit.Record{Event: audit.EventFilterAttachFailed, Severity: audit.SeverityError, Message: "the agent could not start", Error: err.Error()})
		return err
	}
	if inv != nil {
		// Before the socket serves: a table NVML contradicts gives no GPU.
		d.SetInventory(nvmlGPUs)
	}
	ln, activated, err := listen(cfg, log)
	if err != nil {
		d.Close()
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			onHangup(d, rec, log, reload)
		}
	}()
	// Serve ends early only when its listener is gone: then the agent
	// stops (exit 1) rather than run on with a socket nobody serves.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	health := agentHealth(ln.Addr().String(), d.Healthy)
	waitMetrics := startMetrics(ctx, cfg, exp, d, health, log)
	srv := server.New(ln, exp.Instrument(d.Handler()), log, cfg.RequestTimeout.Duration)
	srv.Limit(server.MaxConns, exp.Shed)
	srv.OnAcceptError(exp.AcceptError(metrics.ListenerPlugin))
	errc := make(chan error, 1)
	go func() {
		err := srv.Serve(ctx)
		if err != nil {
			log.Error("the plugin socket stopped serving; stopping the agent", "err", err)
		}
		cancel()
		errc <- err
	}()
	log.Info("gpufence agent ready", "mode", mode, "socket_activated", activated)
	// Ready only now: the filter is attached (or waits for Slurm's scope),
	// pinned state is adopted and the socket answers.
	notify(log, "READY=1\nSTATUS=enforcing GPU isolation ("+cfg.Enforcement+")")
	go watchdog(ctx, health, log)
	rec.Emit(audit.Record{Event: audit.EventAgentStart, Severity: audit.SeverityNotice, PolicyMode: policyMode(cfg),
		Message: fmt.Sprintf("gpufence agent %s started (filter mode %s, %s)", version.Version, mode, cfg.Enforcement)})
	runErr := d.Run(ctx)
	notify(log, "STOPPING=1")
	serveErr := <-errc
	waitMetrics()
	if !activated {
		os.Remove(cfg.Socket)
	}
	log.Info("gpufence agent stopped")
	stopMsg := "gpufence agent stopped; the device filter is detached (no pin_dir)"
	if cfg.PinDir != "" {
		stopMsg = "gpufence agent stopped; the device filter stays in force from " + cfg.PinDir
	}
	rec.Emit(audit.Record{Event: audit.EventAgentStop, Severity: audit.SeverityNotice, Message: stopMsg})
	return errors.Join(runErr, serveErr)
}

func policyMode(cfg config.Config) string {
	if cfg.Enforcement == config.EnforcementAuditOnly {
		return audit.ModeAuditOnly
	}
	return audit.ModeEnforce
}

// onHangup reopens the audit file (logrotate), applies the
// configuration's enforcement mode and rechecks Slurm's GPU table (slurmd
// -G, gres.conf) against the one in use; other settings need a restart.
func onHangup(d *daemon.Daemon, rec *audit.Pipeline, log *slog.Logger, reload func() (config.Config, error)) {
	if err := rec.Reopen(); err != nil {
		log.Error("reopen audit file", "err", err)
	}
	table := "; GPU table rechecked, unchanged"
	if !d.ReloadGPUTable(context.Background()) {
		table = "; GPU table rechecked: it changed or its sources disagree, steps that ask for a GPU are refused until the agent restarts"
	}
	cfg, err := reload()
	msg := "audit file reopened"
	if err != nil {
		log.Error("reload configuration; keeping the running one", "err", err)
		rec.Emit(audit.Record{Event: audit.EventConfigReload, Severity: audit.SeverityError, Message: "configuration reload failed; the running configuration stays", Error: err.Error()})
		return
	}
	if err := d.SetAuditOnly(cfg.Enforcement == config.EnforcementAuditOnly); err != nil {
		log.Error("switch enforcement", "err", err)
	} else {
		msg += "; enforcement is " + cfg.Enforcement
	}
	rec.Emit(audit.Record{Event: audit.EventConfigReload, Severity: audit.SeverityNotice, PolicyMode: policyMode(cfg), Message: msg + table})
}

// resolveIMEX turns imex_channels auto into slurm or unrestricted (by
// slurm.conf's SwitchType) and finds the channel major (imex_channels_major,
// else Slurm's imex_dev_major=, else /proc/devices). Afterwards
// cfg.IMEXChannelsMajor is the major the filter narrows, 0 for none.
func resolveIMEX(cfg *config.Config, nvidiaMajor uint32, log *slog.Logger) error {
	st, err := slurm.ReadSettings(cfg.SlurmConf)
	if err != nil {
		return err
	}
	if cfg.IMEXChannels == config.IMEXAuto {
		cfg.IMEXChannels = config.IMEXUnrestricted
		if st.NvidiaIMEX() {
			cfg.IMEXChannels = config.IMEXSlurm
		}
	}
	if cfg.IMEXChannels == config.IMEXUnrestricted {
		cfg.IMEXChannelsMajor = 0
		log.Info("IMEX channels are not narrowed (imex_channels: unrestricted, or auto without SwitchType=switch/nvidia_imex)")
		return nil
	}
	if cfg.IMEXChannelsMajor == 0 {
		if cfg.IMEXChannelsMajor, err = st.IMEXDevMajor(); err != nil {
			return err
		}
	}
	if cfg.IMEXChannelsMajor == 0 {
		m, found, err := devices.IMEXMajor()
		if err != nil {
			return err
		}
		if !found {
			log.Info("no nvidia-caps-imex-channels in /proc/devices and no imex_dev_major: IMEX channels are not narrowed (there are none on this node)", "imex_channels", cfg.IMEXChannels)
			return nil
		}
		cfg.IMEXChannelsMajor = m
	}
	if cfg.IMEXChannelsMajor == nvidiaMajor || cfg.IMEXChannelsMajor == cfg.NvidiaCapsMajor {
		return fmt.Errorf("IMEX channel major %d is the NVIDIA or nvidia-caps major too; set imex_channels_major", cfg.IMEXChannelsMajor)
	}
	log.Info("IMEX channels narrowed", "imex_channels", cfg.IMEXChannels, "imex_major", cfg.IMEXChannelsMajor)
	return nil
}
