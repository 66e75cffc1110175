// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/jobmap"
)

// heldKey is one job holding one GPU (by its Slurm index).
type heldKey struct {
	job uint32
	gpu int
}

// holding is the loop's state of one job+GPU. Its labels are fixed when the
// job is first seen, so a series never changes labels in mid-job.
type holding struct {
	labels    []string
	uid       uint32
	name      string // the user's name, "" when the uid has none
	gpu       devices.GPU
	uuid      string
	idleSince time.Time
	reported  bool // a gpu_idle record went out for this idle spell
}

// Allocations takes the complete set after every change of the agent's
// jobs: it keeps the newest and wakes the loop, never blocking the caller.
func (e *Exporter) Allocations(a []Allocation) {
	e.mu.Lock()
	e.allocs = a
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// refresh makes the per-job series and the job mapping files match the
// daemon's allocations: new job+GPU pairs get their series, those of ended
// jobs are deleted, so the number of series is bounded by the jobs running.
func (e *Exporter) refresh() {
	e.mu.Lock()
	allocs := e.allocs
	e.mu.Unlock()
	want := map[heldKey]bool{}
	files := map[jobmap.Key][]uint32{}
	for _, a := range allocs {
		for _, g := range a.GPUs {
			k := heldKey{a.JobID, g.Index}
			want[k] = true
			if _, ok := e.held[k]; !ok {
				h := &holding{uid: a.UID, gpu: g, uuid: e.nvmlByMinor[g.Minor].UUID}
				h.name = e.opts.UserName(a.UID)
				label := h.name
				if label == "" {
					label = strconv.FormatUint(uint64(a.UID), 10)
				}
				h.labels = e.labels(a.JobID, label, g)
				e.allocated.WithLabelValues(h.labels...).Set(1)
				e.held[k] = h
			}
			f := jobmap.Key{GPU: e.dcgmIndex(g)}
			files[f] = append(files[f], a.JobID)
			if len(g.Caps) > 0 && e.opts.MIGInstance != nil {
				if gi, ok := e.opts.MIGInstance(g); ok {
					f.MIG, f.GI = true, gi
					files[f] = append(files[f], a.JobID)
				}
			}
		}
	}
	for k, h := range e.held {
		if want[k] {
			continue
		}
		for _, v := range []*prometheus.GaugeVec{e.allocated, e.util, e.memUsed, e.memTotal, e.idle} {
			v.DeleteLabelValues(h.labels...)
		}
		delete(e.held, k)
	}
	e.gpusHeld.Set(float64(len(e.held)))
	if e.opts.JobMap == nil {
		return
	}
	msg := ""
	if err := e.opts.JobMap.Sync(files); err != nil {
		msg = err.Error()
	}
	if msg != e.lastMapErr {
		if msg != "" {
			e.log.Error("dcgm-exporter job mapping files not updated", "err", msg)
		} else {
			e.log.Info("dcgm-exporter job mapping files updated again")
		}
		e.lastMapErr = msg
	}
}

// labels are a job's GPU's label values, in jobLabels' order. The GPU is
// named as dcgm-exporter names it from what NVML said of its device minor;
// without that (no NVML, or no sample yet) gpu, UUID, pci_bus_id, device
// and modelName are empty rather than guessed, since a wrong gpu would join
// the job with another GPU's dcgm-exporter series.
func (e *Exporter) labels(job uint32, user string, g devices.GPU) []string {
	var index, device string
	u, ok := e.nvmlByMinor[g.Minor]
	if ok {
		index = strconv.Itoa(u.Index)
		device = "nvidia" + index
	}
	return []string{strconv.FormatUint(uint64(job), 10), user, strconv.Itoa(g.Index),
		index, u.UUID, u.PCIBusID, device, u.Name, e.opts.Hostname}
}

// dcgmIndex is the number dcgm-exporter gives a GPU (its gpu label, the
// NVML index), which is what its mapping files are named by. Without NVML
// the device minor stands in: the driver numbers /dev/nvidiaN like NVML
// on the usual node, but not on every one.
func (e *Exporter) dcgmIndex(g devices.GPU) int {
	if u, ok := e.nvmlByMinor[g.Minor]; ok {
		return u.Index
	}
	return int(g.Minor)
}

// sample reads the GPUs once. A failed sample leaves no values (apply
// deletes them) rather than stale ones.
func (e *Exporter) sample() {
	if e.opts.Sampler == nil {
		return
	}
	us, err := e.opts.Sampler.Sample()
	if err != nil {
		e.byMinor = nil
		if !errors.Is(err, inventory.ErrNoDriver) {
			// A node without a driver is a state, not a failure.
			e.sampleErrs.Inc()
		}
		if err.Error() != e.lastErr {
			e.log.Warn("GPU utilization not sampled; per-job utilization, memory and idle series are absent", "err", err)
			e.lastErr = err.Error()
		}
		return
	}
	if e.lastErr != "" {
		e.log.Info("GPU utilization sampled again")
		e.lastErr = ""
	}
	e.byMinor = make(map[uint32]inventory.Usage, len(us))
	for _, u := range us {
		e.byMinor[u.Minor] = u
		e.nvmlByMinor[u.Minor] = u
	}
}

// apply sets each held GPU's utilization, memory and idle time from the
// last sample, and writes a gpu_idle record for a GPU idle for longer than
// IdleAuditAfter, once per idle spell.
func (e *Exporter) apply() {
	now := e.opts.Now()
	for k, h := range e.held {
		u, ok := e.byMinor[h.gpu.Minor]
		if !ok {
			for _, v := range []*prometheus.GaugeVec{e.util, e.memUsed, e.memTotal, e.idle} {
				v.DeleteLabelValues(h.labels...)
			}
			continue
		}
		e.memUsed.WithLabelValues(h.labels...).Set(float64(u.MemoryUsed))
		e.memTotal.WithLabelValues(h.labels...).Set(float64(u.MemoryTotal))
		if !u.UtilizationKnown {
			// MIG-enabled GPUs report no utilization: no idle verdict either.
			e.util.DeleteLabelValues(h.labels...)
			e.idle.DeleteLabelValues(h.labels...)
			h.idleSince, h.reported = time.Time{}, false
			continue
		}
		e.util.WithLabelValues(h.labels...).Set(float64(u.UtilizationGPU) / 100)
		if u.UtilizationGPU >= e.opts.IdleThreshold {
			h.idleSince, h.reported = time.Time{}, false
			e.idle.WithLabelValues(h.labels...).Set(0)
			continue
		}
		// Idle from the first sample that showed it, so the figure errs
		// short by at most one interval.
		if h.idleSince.IsZero() {
			h.idleSince = now
		}
		idle := now.Sub(h.idleSince)
		e.idle.WithLabelValues(h.labels...).Set(idle.Seconds())
		if e.opts.IdleAuditAfter > 0 && idle >= e.opts.IdleAuditAfter && !h.reported {
			h.reported = true
			e.idleRecord(k, h, idle)
		}
	}
}

func (e *Exporter) idleRecord(k heldKey, h *holding, idle time.Duration) {
	e.idleEvents.Inc()
	idle = idle.Truncate(time.Second)
	e.log.Info("job holds an idle GPU", "job_id", k.job, "uid", h.uid, "gpu", k.gpu, "idle", idle, "threshold_percent", e.opts.IdleThreshold)
	if e.opts.Audit == nil {
		return
	}
	who := fmt.Sprintf("uid %d", h.uid)
	if h.name != "" {
		who = h.name
	}
	e.opts.Audit.Emit(audit.Record{
		Event:    audit.EventGPUIdle,
		Severity: audit.SeverityNotice,
		Message: fmt.Sprintf("job %d (%s) has held GPU %d below %d%% utilization for %s",
			k.job, who, k.gpu, e.opts.IdleThreshold, idle),
		JobID:         k.job,
		UID:           audit.UID(h.uid),
		User:          h.name,
		GPU:           &audit.GPU{Index: k.gpu, UUID: h.uuid},
		IdleSeconds:   uint64(idle.Seconds()),
		IdleThreshold: e.opts.IdleThreshold,
	})
}
