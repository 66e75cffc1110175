// SPDX-License-Identifier: Apache-2.0

// Package metrics exports the agent's state to Prometheus: access decisions,
// audit loss, plugin request latency, and which job holds which GPU with its
// utilization and idle time. It also keeps dcgm-exporter's job mapping files
// and writes gpu_idle audit records. docs/metrics.md lists every series.
package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpufence/gpufence/agent/accept"
	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/jobmap"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/agent/version"
)

// Sampler reads every GPU's utilization and memory; the NVML inventory
// implements it.
type Sampler interface {
	Sample() ([]inventory.Usage, error)
}

// Recorder takes the gpu_idle audit records; *audit.Pipeline implements it.
type Recorder interface {
	Emit(r audit.Record)
}

// Options configures an Exporter. Zero values take the documented defaults.
type Options struct {
	// Sampler is nil where there is no NVML: then per-job utilization,
	// memory and idle series are absent, gpufence_job_gpu_allocated is not.
	Sampler Sampler
	// SampleInterval is how often Sampler is read (default 15s).
	SampleInterval time.Duration
	// IdleThreshold is the utilization in percent below which an allocated
	// GPU is idle (default 5).
	IdleThreshold uint32
	// IdleAuditAfter is how long a GPU may stay idle before a gpu_idle record
	// goes to Audit; 0 writes none.
	IdleAuditAfter time.Duration
	// Audit receives gpu_idle records; nil drops them.
	Audit Recorder
	// AuditStats reads the audit pipeline's counters at scrape time.
	AuditStats func() audit.Stats
	// JobMap, when set, is kept in step with the jobs' GPUs.
	JobMap *jobmap.Dir
	// MIGInstance gives a MIG slice's GPU instance id, for its "N.G"
	// mapping file; nil, or false for a slice, writes the GPU's "N" only.
	MIGInstance func(devices.GPU) (uint32, bool)
	// UserName resolves a uid for the user label (default: the system's
	// user database through an agent/users cache, which asks again for a
	// uid whose lookup failed after users.FailedTTL; the uid in decimal
	// when it has no name).
	UserName func(uid uint32) string
	// Hostname is the Hostname label, dcgm-exporter's (default: the
	// kernel's host name, os.Hostname, which dcgm-exporter reads too unless
	// NODE_NAME is set in its environment; empty when it cannot be read).
	Hostname string
	// Now is the clock (tests).
	Now func() time.Time
	Log *slog.Logger
}

// Exporter holds the agent's metrics in its own registries (never the
// global one, so nothing a library registers leaks into the endpoint): the
// node's aggregates, served to every scraper, and the detail that names
// jobs and users or lets one watch the agent (per-job series, Go runtime,
// process and descriptor counts), served only to an authenticated one.
type Exporter struct {
	opts   Options
	log    *slog.Logger
	public *prometheus.Registry
	detail *prometheus.Registry

	access     map[string]prometheus.Counter
	accessVec  *prometheus.CounterVec
	suppressed prometheus.Counter
	kernelLost atomic.Uint64
	reqDur     *prometheus.HistogramVec
	reqs       *prometheus.CounterVec
	shed       prometheus.Counter
	acceptErrs *prometheus.CounterVec
	httpShed   prometheus.Counter
	gpusHeld   prometheus.Gauge
	sampleErrs prometheus.Counter
	idleEvents prometheus.Counter

	allocated, util, memUsed, memTotal, idle *prometheus.GaugeVec

	state stateCollector

	mu     sync.Mutex
	allocs []Allocation
	wake   chan struct{}

	// Owned by the loop (Run, or a test calling refresh/sample directly).
	held    map[heldKey]*holding
	byMinor map[uint32]inventory.Usage // the last sample; nil after a failed one
	// What NVML said of each device minor (index, UUID, PCI address,
	// name), from the last sample that had it: kept when a sample fails, so
	// file names and labels stay put.
	nvmlByMinor map[uint32]inventory.Usage
	lastErr     string
	lastMapErr  string
}

// Metric names; docs/metrics.md describes each.
const (
	nameBuildInfo       = "gpufence_build_info"
	nameNodeInfo        = "gpufence_node_info"
	nameJobs            = "gpufence_jobs"
	namePolicies        = "gpufence_policies"
	nameFilterAttached  = "gpufence_filter_attached"
	nameAccess          = "gpufence_gpu_access_total"
	nameSuppressed      = "gpufence_audit_suppressed_total"
	nameAuditRecords    = "gpufence_audit_records_total"
	nameAuditLost       = "gpufence_audit_records_lost_total"
	nameAuditSink       = "gpufence_audit_sink_records_total"
	nameReqDuration     = "gpufence_request_duration_seconds"
	nameRequests        = "gpufence_requests_total"
	nameShed            = "gpufence_requests_shed_total"
	nameAcceptErrors    = "gpufence_accept_errors_total"
	nameMetricsShed     = "gpufence_metrics_connections_shed_total"
	nameGPUsAllocated   = "gpufence_gpus_allocated"
	nameAllocated       = "gpufence_job_gpu_allocated"
	nameUtilization     = "gpufence_job_gpu_utilization_ratio"
	nameMemUsed         = "gpufence_job_gpu_memory_used_bytes"
	nameMemTotal        = "gpufence_job_gpu_memory_total_bytes"
	nameIdle            = "gpufence_gpu_idle_seconds"
	nameSampleErrors    = "gpufence_gpu_sample_errors_total"
	nameIdleAuditEvents = "gpufence_gpu_idle_events_total"
)

// Label names of the per-job+GPU series. Those that name the GPU are
// dcgm-exporter's, with its meanings (the labels its gpuMetricsFormat
// template writes, internal/pkg/rendermetrics/render_metrics.go in
// NVIDIA/dcgm-exporter), so a site running both joins them on UUID, or on
// gpu and Hostname; Slurm's index, which need not be NVML's, has its own.
const (
	labelJob      = "job_id"
	labelUser     = "user"
	labelSlurmGPU = "slurm_gpu"  // Slurm's (gres) index, as in SLURM_JOB_GPUS
	labelGPU      = "gpu"        // NVML's index, dcgm-exporter's gpu
	labelUUID     = "UUID"       // NVML's UUID, GPU-...
	labelPCIBusID = "pci_bus_id" // 00000000:18:00.0
	labelDevice   = "device"     // dcgm-exporter's nvidia<NVML index>
	labelModel    = "modelName"  // NVML's device name
	labelHostname = "Hostname"
)

// jobLabels label every per-job+GPU series. The NVML ones are empty (which
// Prometheus treats as absent) when no sample has named the GPU.
var jobLabels = []string{labelJob, labelUser, labelSlurmGPU, labelGPU, labelUUID, labelPCIBusID, labelDevice, labelModel, labelHostname}

// New builds an Exporter and registers its metrics; Run starts sampling.
func New(o Options) *Exporter {
	if o.SampleInterval <= 0 {
		o.SampleInterval = 15 * time.Second
	}
	if o.IdleThreshold == 0 {
		o.IdleThreshold = 5
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.UserName == nil {
		o.UserName = (&users.Cache{}).Name
	}
	if o.Hostname == "" {
		o.Hostname, _ = os.Hostname()
	}
	e := &Exporter{
		opts: o, log: o.Log.With("component", "metrics"), public: prometheus.NewRegistry(), detail: prometheus.NewRegistry(),
		wake: make(chan struct{}, 1), held: map[heldKey]*holding{},
		nvmlByMinor: map[uint32]inventory.Usage{},
	}
	e.state.e = e
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        nameBuildInfo,
		Help:        "Always 1; labels name the agent's version and the Go release it was built with.",
		ConstLabels: prometheus.Labels{"version": version.Version, "goversion": runtime.Version()},
	})
	buildInfo.Set(1)
	nodeInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        nameNodeInfo,
		Help:        "Always 1; Hostname is the host name as dcgm-exporter labels it, to join node series with its.",
		ConstLabels: prometheus.Labels{labelHostname: o.Hostname},
	})
	nodeInfo.Set(1)
	e.accessVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: nameAccess,
		Help: "GPU device opens the kernel filter reported, by decision (allowed, denied, would-deny): accesses, not records, since rate-limited ones are counted through the records' suppressed counts. Allowed opens are counted as far as audit.allowed reports them.",
	}, []string{"decision"})
	e.access = map[string]prometheus.Counter{}
	for _, d := range []string{audit.DecisionAllowed, audit.DecisionDenied, audit.DecisionWouldDeny} {
		e.access[d] = e.accessVec.WithLabelValues(d)
	}
	e.suppressed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: nameSuppressed,
		Help: "GPU accesses the kernel counted without a record of their own (rate limit, audit.allowed: first); they are in gpufence_gpu_access_total too.",
	})
	e.reqDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: nameReqDuration,
		Help: "Time the agent took to answer one SPANK plugin request, by request type.",
		// Fine below a millisecond, where a step start's answer should be.
		Buckets: []float64{.00005, .0001, .00025, .0005, .00075, .001, .0015, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"type"})
	e.reqs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: nameRequests,
		Help: "SPANK plugin requests answered, by type and result (ok, or refused with an error).",
	}, []string{"type", "result"})
	e.shed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: nameShed,
		Help: "Connections the agent closed unanswered because every one of its connection slots stayed busy (the plugin then tries once more).",
	})
	e.acceptErrs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: nameAcceptErrors,
		Help: "Failed accepts on the agent's listeners (plugin: the SPANK plugin's socket; metrics: this endpoint), by errno (EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED, other): each is retried with backoff, none stops the listener.",
	}, []string{"listener", "reason"})
	e.httpShed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: nameMetricsShed,
		Help: "Connections to this endpoint closed at once because it held metrics.max_connections (or its share of the open-files limit) already.",
	})
	e.gpusHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: nameGPUsAllocated,
		Help: "GPUs that running jobs hold by their trusted lists, summed over the node's jobs (who holds which is in gpufence_job_gpu_allocated, served to authenticated scrapers only).",
	})
	for _, t := range requestTypes() {
		e.reqDur.WithLabelValues(t)
		e.reqs.WithLabelValues(t, resultOK)
		e.reqs.WithLabelValues(t, resultRefused)
	}
	e.sampleErrs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: nameSampleErrors,
		Help: "GPU utilization samples (NVML) that failed; utilization, memory and idle series are absent until one succeeds.",
	})
	e.idleEvents = prometheus.NewCounter(prometheus.CounterOpts{
		Name: nameIdleAuditEvents,
		Help: "gpu_idle audit records written: a job held a GPU below metrics.idle_threshold for metrics.idle_audit_after.",
	})
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, jobLabels)
	}
	e.allocated = gauge(nameAllocated, "1 for each GPU a running job holds by its trusted list (from its prolog); the series goes when the job ends.")
	e.util = gauge(nameUtilization, "Share of the last NVML sample period in which a kernel ran on the job's GPU (0 to 1).")
	e.memUsed = gauge(nameMemUsed, "Memory in use on the job's GPU, in bytes (the whole GPU: it is the job's alone).")
	e.memTotal = gauge(nameMemTotal, "Memory of the job's GPU, in bytes.")
	e.idle = gauge(nameIdle, "Seconds the job's GPU has stayed below metrics.idle_threshold utilization; 0 while busy.")
	for _, r := range accept.Reasons {
		e.acceptErrs.WithLabelValues(ListenerPlugin, r)
		e.acceptErrs.WithLabelValues(ListenerMetrics, r)
	}
	e.public.MustRegister(buildInfo, nodeInfo, e.accessVec, e.suppressed, e.reqDur, e.reqs, e.shed, e.acceptErrs, e.httpShed,
		e.gpusHeld, e.sampleErrs, e.idleEvents, &e.state)
	e.detail.MustRegister(e.allocated, e.util, e.memUsed, e.memTotal, e.idle,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return e
}

// Listener names in gpufence_accept_errors_total.
const (
	ListenerPlugin  = "plugin"
	ListenerMetrics = "metrics"
)

// Registry gathers every series: the node's aggregates and the detail.
func (e *Exporter) Registry() prometheus.Gatherer { return prometheus.Gatherers{e.public, e.detail} }

// Public gathers what every scraper may read: nothing that names a job or
// a user, nothing that shows the agent's descriptors or goroutines.
func (e *Exporter) Public() prometheus.Gatherer { return e.public }

// AcceptError counts a failed accept on listener (ListenerPlugin,
// ListenerMetrics) by accept.Reason.
func (e *Exporter) AcceptError(listener string) func(reason string) {
	return func(reason string) { e.acceptErrs.WithLabelValues(listener, reason).Inc() }
}

// MetricsShed counts a connection to the endpoint closed over its cap.
func (e *Exporter) MetricsShed() { e.httpShed.Inc() }

// Counts is what the agent holds, read at scrape time.
type Counts struct {
	Jobs, Steps, Exempt int
	FilterAttached      bool
}

// Allocation is one job's trusted GPUs on this node: what the per-job
// series and dcgm-exporter's job mapping attribute a GPU to.
type Allocation struct {
	JobID, UID uint32
	GPUs       []devices.GPU
}

// Follow reads the agent's counts at scrape time; its allocations come
// through Allocations as they change.
func (e *Exporter) Follow(counts func() Counts) {
	e.mu.Lock()
	e.state.counts = counts
	e.mu.Unlock()
}

// healthTimeout bounds one /healthz check.
var healthTimeout = 2 * time.Second

// Handler serves /metrics and /healthz. /metrics serves the detail (per-job
// and per-user series, the agent's process figures) only when detail is
// set, which the caller does only behind authentication (metrics.web_config).
// health is the agent's real state (the plugin socket answers, the daemon's
// state can be taken); /healthz answers 503 with its error, or when it has
// not returned within two seconds.
func (e *Exporter) Handler(health func(ctx context.Context) error, detail bool) http.Handler {
	mux := http.NewServeMux()
	g := e.Public()
	if detail {
		g = e.Registry()
	}
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(e.log.Handler(), slog.LevelError),
		Registry:          e.public,
		Timeout:           10 * time.Second,
		EnableOpenMetrics: true,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			if health == nil {
				errc <- nil
				return
			}
			errc <- health(ctx)
		}()
		select {
		case err := <-errc:
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			w.Write([]byte("ok\n"))
		case <-ctx.Done():
			http.Error(w, fmt.Sprintf("the agent did not answer its health check within %s", healthTimeout), http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("gpufence agent: /metrics, /healthz\n"))
	})
	return mux
}

// Run samples the GPUs every SampleInterval and follows allocation changes
// until ctx ends.
func (e *Exporter) Run(ctx context.Context) {
	e.sample()
	e.refresh()
	e.apply()
	var tick <-chan time.Time
	if e.opts.Sampler != nil {
		t := time.NewTicker(e.opts.SampleInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
			e.refresh()
		case <-tick:
			e.sample()
			e.refresh()
			e.apply()
		}
	}
}
