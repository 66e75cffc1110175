// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net"

	"github.com/gpufence/gpufence/agent/accept"
	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/daemon"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/gputable"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/jobmap"
	"github.com/gpufence/gpufence/agent/metrics"
	"github.com/gpufence/gpufence/agent/registry"
)

// newExporter builds the metrics exporter and, when configured, the
// dcgm-exporter job mapping directory. sampler is the NVML inventory, nil
// where there is none. A mapping directory that cannot be made is logged,
// not fatal: enforcement must not depend on observability.
func newExporter(cfg config.Config, rec *audit.Pipeline, sampler metrics.Sampler, log *slog.Logger) *metrics.Exporter {
	var jm *jobmap.Dir
	if cfg.DCGMJobMappingDir != "" {
		var err error
		if jm, err = jobmap.New(cfg.DCGMJobMappingDir); err != nil {
			log.Error("dcgm-exporter job mapping files will not be written", "err", err)
		}
	}
	return metrics.New(metrics.Options{
		Sampler:        sampler,
		SampleInterval: cfg.Metrics.SampleInterval.Duration,
		IdleThreshold:  cfg.Metrics.IdleThreshold,
		IdleAuditAfter: cfg.Metrics.IdleAuditAfter.Duration,
		Audit:          rec,
		AuditStats:     rec.Stats,
		JobMap:         jm,
		MIGInstance:    migInstance(jm, log),
		Log:            log,
	})
}

// migInstance reads the driver's MIG capability table once, for the job
// mapping files of MIG slices ("N.G", by GPU instance): nil without a
// mapping directory or where the node has no MIG table.
func migInstance(jm *jobmap.Dir, log *slog.Logger) func(devices.GPU) (uint32, bool) {
	if jm == nil {
		return nil
	}
	m, err := inventory.ReadMIGMinors(inventory.DefaultMIGMinorsPath)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("MIG slices get no dcgm-exporter mapping file of their own, only their GPU's", "err", err)
		}
		return nil
	}
	return func(g devices.GPU) (uint32, bool) { return m.InstanceOf(g.Minor, g.CapsMinors()) }
}

// startMetrics runs the exporter's sampling loop and, unless metrics.listen
// is empty, its HTTP endpoint, both until ctx ends; the returned func waits
// for them. A port that cannot be bound is logged, not fatal. health is
// /healthz's check (agentHealth).
//
// Every local user can connect to the endpoint, so it holds at most
// metrics.max_connections, and never more than a quarter of the agent's
// open-files limit (raised to the hard limit first): holding connections
// to it cannot spend the descriptors the plugin's socket needs.
func startMetrics(ctx context.Context, cfg config.Config, exp *metrics.Exporter, d *daemon.Daemon, health func(context.Context) error, log *slog.Logger) (wait func()) {
	exp.Follow(func() metrics.Counts {
		c := d.Counts()
		return metrics.Counts{Jobs: c.Jobs, Steps: c.Steps, Exempt: c.Exempt, FilterAttached: c.FilterAttached}
	})
	table := d.Table()
	d.Registry().SetObserver(func(jobs []registry.Job) { exp.Allocations(allocations(jobs, table)) })
	done := make(chan struct{}, 2)
	n := 1
	go func() { exp.Run(ctx); done <- struct{}{} }()
	if cfg.Metrics.Listen != "" {
		raw, err := net.Listen("tcp", cfg.Metrics.Listen)
		if err != nil {
			log.Error("metrics endpoint not started", "listen", cfg.Metrics.Listen, "err", err)
		} else {
			n++
			nofile, err := accept.RaiseNoFile()
			if err != nil {
				log.Warn("open-files limit not raised", "err", err)
			}
			max := accept.Budget(cfg.Metrics.MaxConnections, nofile)
			ln := accept.Limit(raw, max, &accept.Retry{Name: metrics.ListenerMetrics, Log: log.With("component", "metrics"),
				OnError: exp.AcceptError(metrics.ListenerMetrics)}, exp.MetricsShed)
			detail := cfg.Metrics.WebConfig != ""
			log.Info("metrics endpoint listening", "listen", raw.Addr().String(), "max_connections", max, "open_files_limit", nofile,
				"per_job_series", detail)
			go func() {
				if err := metrics.Serve(ctx, ln, exp.Handler(health, detail), cfg.Metrics.WebConfig, log); err != nil {
					log.Error("metrics endpoint stopped", "err", err)
				}
				done <- struct{}{}
			}()
		}
	}
	return func() {
		for range n {
			<-done
		}
	}
}

// allocations are the jobs that hold GPUs by a usable trusted list, with
// their devices: what metrics and dcgm-exporter's job mapping follow.
func allocations(jobs []registry.Job, table *gputable.Table) []metrics.Allocation {
	out := make([]metrics.Allocation, 0, len(jobs))
	for _, j := range jobs {
		if j.Broken != "" || j.NoProlog || len(j.GPUs) == 0 {
			continue
		}
		a := metrics.Allocation{JobID: j.ID, UID: j.UID}
		for _, g := range j.GPUs {
			if gpu, ok := table.GPU(g); ok {
				a.GPUs = append(a.GPUs, gpu)
			}
		}
		out = append(out, a)
	}
	return out
}
