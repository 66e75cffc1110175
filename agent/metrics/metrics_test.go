// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/jobmap"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/slurm"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// fakeSampler returns what the test set, or an error.
type fakeSampler struct {
	mu    sync.Mutex
	usage []inventory.Usage
	err   error
	calls int
}

func (f *fakeSampler) Sample() ([]inventory.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.usage, f.err
}

func (f *fakeSampler) set(err error, us ...inventory.Usage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.usage, f.err = us, err
}

type records struct {
	mu       sync.Mutex
	recs     []audit.Record
	lost     uint64
	rateFull uint64
}

func (r *records) Emit(rec audit.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
}

func (r *records) ReportLoss(n uint64) { r.lost += n }

func (r *records) ReportRateFull(m map[string]uint64) {
	for _, n := range m {
		r.rateFull += n
	}
}

func (r *records) all() []audit.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Record{}, r.recs...)
}

// clock is a settable time.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func gpu(index int, minor uint32) devices.GPU {
	return devices.GPU{GPU: slurm.GPU{Index: index, Path: fmt.Sprintf("/dev/nvidia%d", minor)}, Major: 195, Minor: minor}
}

func alloc(job, uid uint32, gpus ...devices.GPU) Allocation {
	return Allocation{JobID: job, UID: uid, GPUs: gpus}
}

func userNames(uid uint32) string {
	if uid == 1001 {
		return "alice"
	}
	return ""
}

// series returns the values of a family's series whose labels include want.
func series(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) []float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue metric
				}
			}
			out = append(out, value(m))
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return m.GetUntyped().GetValue()
}

// one returns the single series matching, failing when there is not exactly one.
func one(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	v := series(t, reg, name, want)
	if len(v) != 1 {
		t.Fatalf("%s%v: %d series, want 1", name, want, len(v))
	}
	return v[0]
}

func TestAllocationSeriesFollowJobs(t *testing.T) {
	e := New(Options{UserName: userNames})
	e.Allocations([]Allocation{alloc(12, 1001, gpu(1, 1), gpu(3, 3)), alloc(13, 4242, gpu(0, 0))})
	e.refresh()
	reg := e.Registry()
	// Without NVML the labels that name the GPU as dcgm-exporter does are
	// empty, not guessed; Slurm's index and the host are known.
	host, _ := os.Hostname()
	if v := one(t, reg, nameAllocated, map[string]string{"job_id": "12", "user": "alice", "slurm_gpu": "3", "Hostname": host,
		"gpu": "", "UUID": "", "pci_bus_id": "", "device": "", "modelName": ""}); v != 1 {
		t.Errorf("job 12 GPU 3 allocated = %v", v)
	}
	// A uid without a name is labelled with the number.
	one(t, reg, nameAllocated, map[string]string{"job_id": "13", "user": "4242", "slurm_gpu": "0", "gpu": ""})
	if n := len(series(t, reg, nameAllocated, nil)); n != 3 {
		t.Errorf("%d allocated series, want 3", n)
	}
	// Without a sampler there is nothing but the allocation.
	for _, name := range []string{nameUtilization, nameMemUsed, nameIdle} {
		if n := len(series(t, reg, name, nil)); n != 0 {
			t.Errorf("%s: %d series without NVML", name, n)
		}
	}
	e.Allocations([]Allocation{alloc(13, 4242, gpu(0, 0))})
	e.refresh()
	if n := len(series(t, reg, nameAllocated, map[string]string{"job_id": "12"})); n != 0 {
		t.Errorf("job 12 ended but %d of its series remain", n)
	}
	e.Allocations(nil)
	e.refresh()
	if n := len(series(t, reg, nameAllocated, nil)); n != 0 {
		t.Errorf("%d series after every job ended", n)
	}
}

func TestIdleSecondsAndAuditRecord(t *testing.T) {
	clk := &clock{t: time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)}
	smp := &fakeSampler{}
	rec := &records{}
	e := New(Options{Sampler: smp, IdleThreshold: 5, IdleAuditAfter: time.Minute, Audit: rec, UserName: userNames, Now: clk.now, Hostname: "gpu-node-07"})
	reg := e.Registry()
	const uuid = "GPU-11111111-2222-3333-4444-555555555555"
	usage := func(util uint32) inventory.Usage {
		// NVML numbers this GPU 3; Slurm calls it 1 (/dev/nvidia1).
		return inventory.Usage{Index: 3, Minor: 1, UUID: uuid, PCIBusID: "00000000:3B:00.0", Name: "NVIDIA H100 80GB HBM3",
			UtilizationGPU: util, UtilizationKnown: true, MemoryUsed: 1 << 30, MemoryTotal: 80 << 30}
	}
	tick := func(d time.Duration) {
		clk.advance(d)
		e.sample()
		e.refresh()
		e.apply()
	}
	// dcgm-exporter's labels with its meanings: gpu and device by NVML's
	// index, Slurm's under slurm_gpu.
	lbl := map[string]string{"job_id": "12", "user": "alice", "slurm_gpu": "1", "gpu": "3", "UUID": uuid, "device": "nvidia3",
		"pci_bus_id": "00000000:3B:00.0", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-node-07"}
	smp.set(nil, usage(0))
	e.Allocations([]Allocation{alloc(12, 1001, gpu(1, 1))})
	tick(0)
	for _, name := range []string{nameAllocated, nameUtilization, nameMemUsed, nameMemTotal, nameIdle} {
		if n := len(series(t, reg, name, lbl)); n != 1 {
			t.Errorf("%s%v: %d series, want 1", name, lbl, n)
		}
		// Slurm's index where NVML's belongs would join the job with
		// dcgm-exporter's GPU 1, another GPU.
		if n := len(series(t, reg, name, map[string]string{"gpu": "1"})); n != 0 {
			t.Errorf("%s: %d series label Slurm's index as gpu", name, n)
		}
	}
	if v := one(t, reg, nameIdle, lbl); v != 0 {
		t.Errorf("idle at the first idle sample = %v, want 0", v)
	}
	if v := one(t, reg, nameMemTotal, lbl); v != 80<<30 {
		t.Errorf("memory total %v", v)
	}
	tick(30 * time.Second)
	if v := one(t, reg, nameIdle, lbl); v != 30 {
		t.Errorf("idle after 30s = %v", v)
	}
	if n := len(rec.all()); n != 0 {
		t.Fatalf("%d records before idle_audit_after", n)
	}
	tick(30 * time.Second)
	tick(30 * time.Second)
	recs := rec.all()
	if len(recs) != 1 {
		t.Fatalf("%d gpu_idle records after 90s idle, want 1 (once per idle spell): %+v", len(recs), recs)
	}
	r := recs[0]
	if r.Event != audit.EventGPUIdle || r.JobID != 12 || r.UID == nil || *r.UID != 1001 || r.User != "alice" ||
		r.GPU == nil || r.GPU.Index != 1 || r.GPU.UUID != uuid || r.IdleSeconds != 60 || r.IdleThreshold != 5 ||
		!strings.Contains(r.Message, "job 12") {
		t.Errorf("gpu_idle record: %+v", r)
	}
	if v := one(t, reg, nameIdleAuditEvents, nil); v != 1 {
		t.Errorf("%s = %v", nameIdleAuditEvents, v)
	}
	// Busy resets the idle time and re-arms the record.
	smp.set(nil, usage(50))
	tick(10 * time.Second)
	if v := one(t, reg, nameIdle, lbl); v != 0 {
		t.Errorf("idle while busy = %v", v)
	}
	if v := one(t, reg, nameUtilization, lbl); v != 0.5 {
		t.Errorf("utilization %v, want 0.5", v)
	}
	smp.set(nil, usage(4))
	tick(10 * time.Second)
	tick(time.Minute)
	if n := len(rec.all()); n != 2 {
		t.Errorf("%d records after a second idle spell, want 2", n)
	}
	// The job ends: every series of it goes.
	e.Allocations(nil)
	tick(time.Second)
	for _, name := range []string{nameAllocated, nameUtilization, nameMemUsed, nameMemTotal, nameIdle} {
		if n := len(series(t, reg, name, nil)); n != 0 {
			t.Errorf("%s: %d series after the job ended", name, n)
		}
	}
}

func TestIdleAuditOff(t *testing.T) {
	clk := &clock{t: time.Unix(1e9, 0)}
	smp := &fakeSampler{}
	rec := &records{}
	e := New(Options{Sampler: smp, IdleAuditAfter: 0, Audit: rec, Now: clk.now})
	smp.set(nil, inventory.Usage{Minor: 0, UtilizationKnown: true})
	e.Allocations([]Allocation{alloc(5, 0, gpu(0, 0))})
	for range 5 {
		clk.advance(time.Hour)
		e.sample()
		e.refresh()
		e.apply()
	}
	if n := len(rec.all()); n != 0 {
		t.Errorf("%d gpu_idle records with idle_audit_after 0", n)
	}
	if v := one(t, e.Registry(), nameIdle, map[string]string{"job_id": "5"}); v != 4*3600 {
		t.Errorf("idle seconds %v", v)
	}
}

func TestSampleFailures(t *testing.T) {
	smp := &fakeSampler{}
	e := New(Options{Sampler: smp})
	reg := e.Registry()
	e.Allocations([]Allocation{alloc(7, 0, gpu(0, 0), gpu(1, 1))})
	smp.set(nil,
		inventory.Usage{Minor: 0, UtilizationGPU: 80, UtilizationKnown: true, MemoryTotal: 1},
		// MIG mode: NVML reports no utilization, so no idle verdict.
		inventory.Usage{Index: 1, Minor: 1, MemoryUsed: 5, MemoryTotal: 10})
	e.sample()
	e.refresh()
	e.apply()
	if n := len(series(t, reg, nameUtilization, nil)); n != 1 {
		t.Errorf("%d utilization series, want 1 (the MIG GPU has none)", n)
	}
	if n := len(series(t, reg, nameIdle, map[string]string{"slurm_gpu": "1"})); n != 0 {
		t.Error("idle series for a GPU without utilization")
	}
	if v := one(t, reg, nameMemUsed, map[string]string{"slurm_gpu": "1"}); v != 5 {
		t.Errorf("memory used of the MIG GPU %v", v)
	}
	// A failed sample leaves no stale values and is counted.
	smp.set(errors.New("NVML GPU 0: utilization: Unknown Error"))
	e.sample()
	e.apply()
	for _, name := range []string{nameUtilization, nameMemUsed, nameIdle} {
		if n := len(series(t, reg, name, nil)); n != 0 {
			t.Errorf("%s: %d stale series after a failed sample", name, n)
		}
	}
	if n := len(series(t, reg, nameAllocated, nil)); n != 2 {
		t.Errorf("allocations lost with a failed sample: %d", n)
	}
	// No driver at all is a state of the node, not an error.
	smp.set(fmt.Errorf("open: %w", inventory.ErrNoDriver))
	e.sample()
	if v := one(t, reg, nameSampleErrors, nil); v != 1 {
		t.Errorf("sample errors %v, want 1", v)
	}
}

func TestTapCountsAccessesNotRecords(t *testing.T) {
	e := New(Options{})
	next := &records{}
	tp := e.Tap(next)
	tp.Emit(audit.Record{Event: audit.EventGPUAccess, Decision: audit.DecisionDenied, Suppressed: 4})
	tp.Emit(audit.Record{Event: audit.EventGPUAccess, Decision: audit.DecisionDenied})
	tp.Emit(audit.Record{Event: audit.EventAccessSuppressed, Decision: audit.DecisionAllowed, Suppressed: 3})
	tp.Emit(audit.Record{Event: audit.EventGPUAccess, Decision: audit.DecisionWouldDeny})
	tp.Emit(audit.Record{Event: audit.EventPolicyApplied, JobID: 3})
	tp.ReportLoss(2)
	tp.ReportRateFull(map[string]uint64{audit.DecisionDenied: 10, audit.DecisionAllowed: 1})
	reg := e.Registry()
	for decision, want := range map[string]float64{"denied": 16, "allowed": 4, "would-deny": 1} {
		if v := one(t, reg, nameAccess, map[string]string{"decision": decision}); v != want {
			t.Errorf("%s{decision=%q} = %v, want %v", nameAccess, decision, v, want)
		}
	}
	if v := one(t, reg, nameSuppressed, nil); v != 18 {
		t.Errorf("suppressed %v, want 18", v)
	}
	if v := one(t, reg, nameAuditLost, map[string]string{"where": "kernel"}); v != 2 {
		t.Errorf("kernel loss %v, want 2", v)
	}
	if len(next.all()) != 5 || next.lost != 2 || next.rateFull != 11 {
		t.Errorf("the tap passed on %d records, %d lost and %d rate_full, want 5, 2 and 11", len(next.all()), next.lost, next.rateFull)
	}
}

type handlerFunc func(*pb.Request) *pb.Response

func (f handlerFunc) Handle(_ context.Context, _ peer.Peer, r *pb.Request) *pb.Response {
	return f(r)
}

func TestInstrument(t *testing.T) {
	e := New(Options{})
	h := e.Instrument(handlerFunc(func(r *pb.Request) *pb.Response {
		if r.GetStepStart() != nil {
			return &pb.Response{Error: "step 3.0: refused"}
		}
		return &pb.Response{}
	}))
	h.Handle(context.Background(), peer.Peer{}, &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 3}}})
	h.Handle(context.Background(), peer.Peer{}, &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 3}}})
	h.Handle(context.Background(), peer.Peer{}, &pb.Request{})
	reg := e.Registry()
	for _, c := range []struct {
		typ, result string
		want        float64
	}{{"job_prolog", "ok", 1}, {"step_start", "refused", 1}, {"step_start", "ok", 0}, {"unknown", "ok", 1}, {"job_epilog", "ok", 0}} {
		if v := one(t, reg, nameRequests, map[string]string{"type": c.typ, "result": c.result}); v != c.want {
			t.Errorf("requests{%s,%s} = %v, want %v", c.typ, c.result, v, c.want)
		}
	}
	if v := one(t, reg, nameReqDuration, map[string]string{"type": "step_start"}); v != 1 {
		t.Errorf("step_start observations %v", v)
	}
}

// follow is what the agent's wiring does: counts at scrape time, and the
// allocations as they are.
func follow(e *Exporter, c Counts) {
	e.Follow(func() Counts { return c })
	e.Allocations([]Allocation{alloc(9, 0, gpu(2, 2))})
}

func TestStateAtScrape(t *testing.T) {
	e := New(Options{AuditStats: func() audit.Stats {
		return audit.Stats{Emitted: 40, QueueDropped: 2, RateFull: 5, Sinks: map[string]audit.SinkStats{
			"file": {Written: 38, Failed: 1, Dropped: 1}, "syslog": {Written: 39, Dropped: 1}}}
	}})
	follow(e, Counts{Jobs: 2, Steps: 3, Exempt: 2, FilterAttached: true})
	e.refresh()
	reg := e.Registry()
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{nameJobs, nil, 2}, {namePolicies, map[string]string{"kind": "step"}, 3}, {namePolicies, map[string]string{"kind": "exempt"}, 2},
		{nameFilterAttached, nil, 1}, {nameAuditRecords, nil, 40},
		{nameAuditLost, map[string]string{"where": "queue"}, 2}, {nameAuditLost, map[string]string{"where": "sink"}, 3},
		{nameAuditLost, map[string]string{"where": "rate_table"}, 5},
		{nameAuditSink, map[string]string{"sink": "file", "result": "failed"}, 1},
		{nameAuditSink, map[string]string{"sink": "syslog", "result": "written"}, 39},
		{nameAllocated, map[string]string{"job_id": "9"}, 1},
	}
	for _, c := range checks {
		if v := one(t, reg, c.name, c.labels); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
}

func TestLint(t *testing.T) {
	e := populated(t)
	problems, err := testutil.GatherAndLint(e.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		// modelName is dcgm-exporter's label name, camelCase on purpose
		// (TestOnlyModelNameIsCamelCase keeps it the only one).
		if strings.HasPrefix(p.Metric, "gpufence_") && p.Text != "label names should be written in 'snake_case' not 'camelCase'" {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
}

// The lint exception above covers modelName alone.
func TestOnlyModelNameIsCamelCase(t *testing.T) {
	camel := regexp.MustCompile(`[a-z][A-Z]`)
	for _, l := range jobLabels {
		if camel.MatchString(l) && l != labelModel {
			t.Errorf("label %s is camelCase and not dcgm-exporter's modelName", l)
		}
	}
}

// populatedUsage is what NVML says of the GPU populated's job holds: its
// index 0, where Slurm's is 2.
var populatedUsage = inventory.Usage{Index: 0, Minor: 2, UUID: "GPU-x", PCIBusID: "00000000:18:00.0", Name: "NVIDIA H100 80GB HBM3", UtilizationKnown: true}

// populatedJobSeries is populated's job's allocation as the text format
// writes it.
const populatedJobSeries = `gpufence_job_gpu_allocated{Hostname="gpu-node-07",UUID="GPU-x",device="nvidia0",gpu="0",job_id="9",modelName="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:18:00.0",slurm_gpu="2",user="root"} 1`

// populated is an exporter with a series in every family.
func populated(t *testing.T) *Exporter {
	t.Helper()
	smp := &fakeSampler{}
	clk := &clock{t: time.Unix(1e9, 0)}
	e := New(Options{Sampler: smp, IdleAuditAfter: time.Second, Audit: &records{}, Now: clk.now, Hostname: "gpu-node-07",
		AuditStats: func() audit.Stats { return audit.Stats{Sinks: map[string]audit.SinkStats{"file": {}}} }})
	follow(e, Counts{})
	smp.set(nil, populatedUsage)
	e.sample()
	e.refresh()
	e.apply()
	clk.advance(time.Minute)
	e.apply()
	smp.set(errors.New("boom"))
	e.sample()
	smp.set(nil, populatedUsage)
	e.sample()
	e.apply()
	e.Tap(&records{}).Emit(audit.Record{Event: audit.EventGPUAccess, Decision: audit.DecisionDenied, Suppressed: 1})
	e.Instrument(handlerFunc(func(*pb.Request) *pb.Response { return &pb.Response{} })).Handle(context.Background(), peer.Peer{}, &pb.Request{})
	return e
}

// /metrics serves the per-job series and the process figures only to a
// handler built with detail; /healthz reports health's error as a 503, and
// a check that does not return in time as one too.
func TestHandler(t *testing.T) {
	e := populated(t)
	var blocked sync.Mutex
	blocked.Lock()
	old := healthTimeout
	healthTimeout = 100 * time.Millisecond
	defer func() { healthTimeout = old }()
	var failing atomic.Bool
	health := func(ctx context.Context) error {
		if failing.Load() {
			return errors.New("the plugin socket does not serve: no answer")
		}
		blocked.Lock()
		blocked.Unlock()
		return nil
	}
	detail := httptest.NewServer(e.Handler(health, true))
	defer detail.Close()
	public := httptest.NewServer(e.Handler(health, false))
	defer public.Close()
	get := func(srv *httptest.Server, path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get(detail, "/metrics")
	for _, want := range []string{`gpufence_build_info{goversion="go`, populatedJobSeries, "go_goroutines", "process_open_fds"} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics with detail: %d, no %q", code, want)
		}
	}
	code, body = get(public, "/metrics")
	if code != 200 || !strings.Contains(body, "gpufence_gpus_allocated 1") || !strings.Contains(body, `gpufence_accept_errors_total{listener="plugin",reason="EMFILE"} 0`) {
		t.Errorf("public /metrics: %d, no node aggregates:\n%s", code, body)
	}
	for _, leak := range []string{"job_id=", "user=", "UUID=", "slurm_gpu=", "gpu=", "pci_bus_id=", "\ngpufence_job_", "\ngpufence_gpu_idle_seconds", "\nprocess_", "\ngo_"} {
		if strings.Contains(body, leak) {
			t.Errorf("public /metrics serves %q", leak)
		}
	}
	if code, _ := get(public, "/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("/healthz with the state locked: %d, want 503", code)
	}
	blocked.Unlock()
	if code, body := get(public, "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	failing.Store(true)
	if code, body := get(public, "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "plugin socket does not serve") {
		t.Errorf("/healthz with the socket not serving: %d %q, want 503 naming it", code, body)
	}
}

// The mapping files are named by NVML's index (dcgm-exporter's gpu label)
// once a sample told it, else by the device minor, and follow the jobs.
func TestJobMapFollowsJobs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "map")
	jm, err := jobmap.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	smp := &fakeSampler{err: inventory.ErrNoDriver}
	e := New(Options{Sampler: smp, JobMap: jm})
	read := func() map[string]string {
		out := map[string]string{}
		entries, _ := os.ReadDir(dir)
		for _, en := range entries {
			b, _ := os.ReadFile(filepath.Join(dir, en.Name()))
			out[en.Name()] = string(b)
		}
		return out
	}
	e.Allocations([]Allocation{alloc(21, 0, gpu(0, 0), gpu(1, 1)), alloc(22, 0, gpu(2, 2))})
	e.sample()
	e.refresh()
	if got := fmt.Sprint(read()); got != "map[0:21\n 1:21\n 2:22\n]" {
		t.Errorf("without NVML: %q", got)
	}
	// NVML numbers /dev/nvidia1 as GPU 2 and /dev/nvidia2 as GPU 1.
	smp.set(nil, inventory.Usage{Index: 0, Minor: 0}, inventory.Usage{Index: 2, Minor: 1}, inventory.Usage{Index: 1, Minor: 2})
	e.sample()
	e.refresh()
	if got := fmt.Sprint(read()); got != "map[0:21\n 1:22\n 2:21\n]" {
		t.Errorf("with NVML: %q", got)
	}
	e.Allocations([]Allocation{alloc(22, 0, gpu(2, 2))})
	e.refresh()
	if got := fmt.Sprint(read()); got != "map[1:22\n]" {
		t.Errorf("after job 21 ended: %q", got)
	}
}

// Jobs on MIG slices are listed under "N.G" for the slice's series
// (dcgm-exporter 4.5.3+) and under "N" for the GPU's.
func TestJobMapMIGSlices(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "map")
	jm, err := jobmap.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	slice := func(index int, minor uint32, caps ...uint32) devices.GPU {
		g := gpu(index, minor)
		for _, c := range caps {
			g.Caps = append(g.Caps, devices.Cap{Minor: c})
		}
		return g
	}
	// GPU minor 0's instances 1 and 2 have access caps 12 and 21.
	gis := map[uint32]uint32{12: 1, 21: 2}
	mig := func(g devices.GPU) (uint32, bool) {
		for _, c := range g.CapsMinors() {
			if gi, ok := gis[c]; ok && g.Minor == 0 {
				return gi, true
			}
		}
		return 0, false
	}
	e := New(Options{Sampler: &fakeSampler{err: inventory.ErrNoDriver}, JobMap: jm, MIGInstance: mig})
	e.Allocations([]Allocation{
		alloc(41, 0, slice(0, 0, 12, 13)),
		alloc(42, 0, slice(1, 0, 21, 22)),
		alloc(43, 0, gpu(2, 1)),
		alloc(44, 0, slice(3, 0, 30)), // a slice whose instance is unknown
	})
	e.refresh()
	got := map[string]string{}
	entries, _ := os.ReadDir(dir)
	for _, en := range entries {
		b, _ := os.ReadFile(filepath.Join(dir, en.Name()))
		got[en.Name()] = string(b)
	}
	want := map[string]string{"0": "41\n42\n44\n", "0.1": "41\n", "0.2": "42\n", "1": "43\n"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("mapping files %q, want %q", got, want)
	}
}

// Run wakes on an allocation change without waiting for a sample.
func TestRunFollowsAllocations(t *testing.T) {
	e := New(Options{SampleInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	e.Allocations([]Allocation{alloc(31, 0, gpu(0, 0))})
	deadline := time.Now().Add(5 * time.Second)
	for len(series(t, e.Registry(), nameAllocated, map[string]string{"job_id": "31"})) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("job 31's series never appeared")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}
