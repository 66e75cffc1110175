// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpufence/gpufence/agent/audit"
)

// Trail is where records go after the exporter counted them;
// *audit.Pipeline implements it.
type Trail interface {
	Emit(r audit.Record)
	ReportLoss(ringbufLost uint64)
	ReportRateFull(byDecision map[string]uint64)
}

// Tap counts the accesses in the records the agent emits, and the kernel
// ring buffer's losses, before handing both on to next. Counting here, ahead
// of the audit queue, keeps the access counts right when the queue drops.
func (e *Exporter) Tap(next Trail) Trail {
	return tap{next: next, e: e}
}

type tap struct {
	next Trail
	e    *Exporter
}

// Emit runs on the kernel event reader: two counter adds, no lock.
func (t tap) Emit(r audit.Record) {
	n := r.Suppressed
	switch r.Event {
	case audit.EventGPUAccess:
		n++
		fallthrough
	case audit.EventAccessSuppressed:
		c, ok := t.e.access[r.Decision]
		if !ok {
			c = t.e.accessVec.WithLabelValues(r.Decision)
		}
		c.Add(float64(n))
		t.e.suppressed.Add(float64(r.Suppressed))
	}
	t.next.Emit(r)
}

func (t tap) ReportLoss(n uint64) {
	t.e.kernelLost.Add(n)
	t.next.ReportLoss(n)
}

// ReportRateFull counts accesses the kernel counted without a rate key: they
// are accesses (gpufence_gpu_access_total) with no record of their own
// (gpufence_audit_suppressed_total); the pipeline's Stats count them as
// lost{where="rate_table"} too, since no record names their job or device.
func (t tap) ReportRateFull(byDecision map[string]uint64) {
	for d, n := range byDecision {
		c, ok := t.e.access[d]
		if !ok {
			c = t.e.accessVec.WithLabelValues(d)
		}
		c.Add(float64(n))
		t.e.suppressed.Add(float64(n))
	}
	t.next.ReportRateFull(byDecision)
}

// stateCollector reads the daemon's and the audit pipeline's own counters at
// scrape time, so nothing is counted twice.
type stateCollector struct {
	e      *Exporter
	counts func() Counts // guarded by e.mu
}

var (
	descJobs     = prometheus.NewDesc(nameJobs, "Jobs the agent holds a record of (from their prolog, slurmctld or the saved state).", nil, nil)
	descPolicies = prometheus.NewDesc(namePolicies, "Policy entries the agent keeps in the kernel filter: one per registered step (kind=step), one allow-all per exempt Slurm cgroup (kind=exempt).", []string{"kind"}, nil)
	descAttached = prometheus.NewDesc(nameFilterAttached, "1 when the GPU device filter is attached; 0 until Slurm's slurmstepd scope exists or when attaching failed (GPU steps are then refused).", nil, nil)
	descRecords  = prometheus.NewDesc(nameAuditRecords, "Audit records numbered and handed to the sinks (the last seq).", nil, nil)
	descLost     = prometheus.NewDesc(nameAuditLost, "Audit records lost, by where: kernel (ring buffer full), rate_table (accesses the kernel counted without job or device because its rate table was full; they are in gpufence_gpu_access_total), queue (the agent's queue full), sink (a sink failed or its queue was full; summed over sinks).", []string{"where"}, nil)
	descSink     = prometheus.NewDesc(nameAuditSink, "Audit records per sink, by result: written, failed (write error), dropped (the sink's queue was full).", []string{"sink", "result"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descJobs, descPolicies, descAttached, descRecords, descLost, descSink} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.e.mu.Lock()
	counts := c.counts
	c.e.mu.Unlock()
	if counts != nil {
		n := counts()
		attached := 0.0
		if n.FilterAttached {
			attached = 1
		}
		ch <- prometheus.MustNewConstMetric(descJobs, prometheus.GaugeValue, float64(n.Jobs))
		ch <- prometheus.MustNewConstMetric(descPolicies, prometheus.GaugeValue, float64(n.Steps), "step")
		ch <- prometheus.MustNewConstMetric(descPolicies, prometheus.GaugeValue, float64(n.Exempt), "exempt")
		ch <- prometheus.MustNewConstMetric(descAttached, prometheus.GaugeValue, attached)
	}
	lost := func(where string, v uint64) {
		ch <- prometheus.MustNewConstMetric(descLost, prometheus.CounterValue, float64(v), where)
	}
	lost("kernel", c.e.kernelLost.Load())
	if c.e.opts.AuditStats == nil {
		return
	}
	st := c.e.opts.AuditStats()
	ch <- prometheus.MustNewConstMetric(descRecords, prometheus.CounterValue, float64(st.Emitted))
	lost("queue", st.QueueDropped)
	lost("rate_table", st.RateFull)
	var sinkLost uint64
	for name, s := range st.Sinks {
		sinkLost += s.Failed + s.Dropped
		ch <- prometheus.MustNewConstMetric(descSink, prometheus.CounterValue, float64(s.Written), name, "written")
		ch <- prometheus.MustNewConstMetric(descSink, prometheus.CounterValue, float64(s.Failed), name, "failed")
		ch <- prometheus.MustNewConstMetric(descSink, prometheus.CounterValue, float64(s.Dropped), name, "dropped")
	}
	lost("sink", sinkLost)
}
