// SPDX-License-Identifier: Apache-2.0

// Package events turns the kernel's reports of GPU accesses into audit
// records, in one direction: the ring buffer reader → a bounded queue →
// attribution → the sinks (as Tetragon does). The reader only reads and
// decodes; when attribution falls behind, the queue fills, the reader
// waits, and the kernel counts what its ring buffer had no room for, so
// nothing is lost uncounted. Attribution reads an immutable view of who
// owns which cgroup (agent/registry) and caches of names: it shares no lock
// with the requests a step waits for.
package events

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/imexchan"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Recorder receives the records; *audit.Pipeline implements it. Emit must
// not block. ReportLoss (events the kernel's ring buffer had no room for)
// and ReportRateFull (accesses, by decision, the kernel counted without a
// rate key because its rate table was full) must never drop what they get.
type Recorder interface {
	Emit(r audit.Record)
	ReportLoss(ringbufLost uint64)
	ReportRateFull(byDecision map[string]uint64)
}

// Discard is a Recorder that keeps nothing (an agent run without an
// audit trail, in tests).
type Discard struct{}

// Emit drops r.
func (Discard) Emit(audit.Record) {}

// ReportLoss drops the count.
func (Discard) ReportLoss(uint64) {}

// ReportRateFull drops the counts.
func (Discard) ReportRateFull(map[string]uint64) {}

// Source is the kernel's event stream (the device filter).
type Source interface {
	ReadEvent() (devfilter.Event, error)
}

// Counters are the kernel's counts of what it did not report one by one.
type Counters interface {
	Suppressed() (map[devfilter.RateKey]uint64, error)
	ForgetRate(cgroupID uint64) error
	Lost() (uint64, error)
	RateFull() (map[devfilter.Decision]uint64, error)
}

// Owners is who owns which cgroup; *registry.Registry implements it.
type Owners interface {
	View() *registry.View
}

// Table names devices; *gputable.Table implements it.
type Table interface {
	Of(major, minor uint32, own []int) (devices.GPU, string, bool)
	UUID(index int) (string, bool)
}

// Options configure the stage.
type Options struct {
	Log      *slog.Logger
	Recorder Recorder
	Owners   Owners
	Table    Table
	// Fabric names the NVSwitch and NVLink management nodes.
	Fabric devices.Fabric
	// IMEXMajor is the IMEX channel major the filter narrows (0: none):
	// its accesses are named as channels.
	IMEXMajor uint32
	Users     *users.Cache
	// AuditOnly tells the policy mode records carry.
	AuditOnly func() bool
	// Shares, when set, names the shard and mps shares a job holds
	// (agent/shares); it must not block.
	Shares func(job uint32) []audit.Share
	// QueueSize bounds the events between reader and attribution.
	QueueSize int
	// Proc is where /proc is ("/proc"; tests use others).
	Proc string
	// Resume is what the previous agent had reported of the pinned
	// counters when it stopped (Reported, saved by the daemon). With
	// adopted counters it is the baseline instead of their totals now, so
	// that what the kernel counted while no agent ran is reported.
	Resume *Reported
}

// Reported is how much of the kernel's counters the stage has accounted
// for: per rate key the suppressed total that records carried, the ring
// buffer's losses and the rate table's overflows reported.
type Reported struct {
	Suppressed map[devfilter.RateKey]uint64
	Lost       uint64
	RateFull   map[devfilter.Decision]uint64
}

// Events is the stage. Its methods are safe for concurrent use.
type Events struct {
	o     Options
	queue chan devfilter.Event
	supp  suppression
	// node is the namespace where an exe path must name the program; PID
	// 1's never changes, so it is looked up once, not per event.
	node nodeNS
	// clock turns the kernel's CLOCK_MONOTONIC time of an access into
	// wall-clock time (access_time).
	clock *monoClock

	readers sync.WaitGroup
	done    chan struct{}
	closed  atomic.Bool
}

// New starts the attribution goroutine.
func New(o Options) *Events {
	if o.QueueSize <= 0 {
		o.QueueSize = 4096
	}
	if o.Proc == "" {
		o.Proc = "/proc"
	}
	if o.AuditOnly == nil {
		o.AuditOnly = func() bool { return false }
	}
	e := &Events{o: o, queue: make(chan devfilter.Event, o.QueueSize), done: make(chan struct{}), node: nodeNamespace(o.Proc, "1"), clock: newMonoClock()}
	go e.attribute()
	return e
}

// Read starts a reader of src, until src is closed. adopted says the
// kernel's counters were left by an earlier agent: their totals so far
// were reported then, and are taken as the baseline, never reported twice.
func (e *Events) Read(src Source, c Counters, adopted bool) {
	if adopted && c != nil {
		e.baseline(c)
	}
	e.readers.Add(1)
	go func() {
		defer e.readers.Done()
		for {
			ev, err := src.ReadEvent()
			if err != nil {
				if !errors.Is(err, devfilter.ErrClosed) {
					e.o.Log.Error("device filter event reader stopped", "err", err)
				}
				return
			}
			// A full queue makes the reader wait; the ring buffer then
			// fills and the kernel counts what it drops.
			e.queue <- ev
		}
	}()
}

// Close waits for the readers (their sources must be closed) and for
// attribution to finish what was queued.
func (e *Events) Close() {
	if e.closed.Swap(true) {
		return
	}
	e.readers.Wait()
	close(e.queue)
	<-e.done
}

func (e *Events) attribute() {
	defer close(e.done)
	for ev := range e.queue {
		o, known := e.o.Owners.View().Owner(ev.CgroupID)
		if !known {
			// A step released before its last events were read: at an
			// agent start, the events an earlier agent left in the ring
			// buffer of steps that have ended since.
			o, known = e.supp.released(ev.CgroupID)
		}
		key := devfilter.RateKey{CgroupID: ev.CgroupID, Major: ev.Major, Minor: ev.Minor, Decision: ev.Decision}
		r := e.accessRecord(ev, o, known, e.supp.take(key, ev.Suppressed))
		e.o.Recorder.Emit(r)
		e.logAccess(ev, r, known)
	}
}

func (e *Events) logAccess(ev devfilter.Event, r audit.Record, known bool) {
	attrs := []any{"decision", r.Decision, "pid", ev.TGID, "comm", r.Comm, "uid", ev.UID,
		"device", fmt.Sprintf("%d:%d", ev.Major, ev.Minor), "access", ev.Access.String(), "cgroup_id", ev.CgroupID}
	if r.GPU != nil {
		attrs = append(attrs, "gpu", r.GPU.Index)
	}
	if r.StepID != "" {
		attrs = append(attrs, "job_id", r.JobID, "step_id", r.StepID)
	} else if !known {
		attrs = append(attrs, "note", "cgroup has no policy entry (job without a registered step)")
	}
	if ev.Decision == devfilter.DecisionAllowed {
		e.o.Log.Info("GPU access allowed", attrs...)
	} else {
		e.o.Log.Warn("GPU access "+r.Decision, attrs...)
	}
}

func (e *Events) policyMode() string {
	if e.o.AuditOnly() {
		return audit.ModeAuditOnly
	}
	return audit.ModeEnforce
}

func decisionName(d devfilter.Decision) string {
	switch d {
	case devfilter.DecisionAllowed:
		return audit.DecisionAllowed
	case devfilter.DecisionWouldDeny:
		return audit.DecisionWouldDeny
	}
	return audit.DecisionDenied
}

// accessRecord attributes one kernel event: job and step from the cgroup,
// user, process, device and GPU. Text the process chose (comm, exe) is
// Escape'd; exe is checked against what the kernel saw at the access.
func (e *Events) accessRecord(ev devfilter.Event, o registry.Owner, known bool, suppressed uint64) audit.Record {
	comm := audit.Escape(ev.Comm)
	r := audit.Record{
		Event:      audit.EventGPUAccess,
		Decision:   decisionName(ev.Decision),
		PolicyMode: e.policyMode(),
		UID:        audit.UID(ev.UID),
		User:       e.o.Users.Name(ev.UID),
		PID:        ev.TGID,
		Comm:       comm,
		Device:     &audit.Device{Major: ev.Major, Minor: ev.Minor},
		Access:     accessList(ev.Access),
		Suppressed: suppressed,
		CgroupID:   ev.CgroupID,
		Severity:   audit.SeverityWarning,
	}
	if ev.Time > 0 {
		r.AccessTime = e.clock.wall(ev.Time)
	}
	if ev.Decision == devfilter.DecisionAllowed {
		r.Severity = audit.SeverityInfo
	}
	if ev.TGID != 0 {
		x := judgeExe(seeExe(e.o.Proc, e.node, ev))
		r.Exe, r.ExeNow, r.ExeStatus = audit.Escape(x.exe), audit.Escape(x.now), x.status
		r.ExeNamespacePath, r.ExeMntNS = audit.Escape(x.nsPath), x.mntNS
	}
	if ev.Exe.Known() {
		r.ExeDev, r.ExeIno = fmt.Sprintf("%d:%d", ev.Exe.Major, ev.Exe.Minor), ev.Exe.Ino
	}
	var own []int
	if known && o.Exempt == "" {
		own = o.GPUs
	}
	if g, path, ok := e.o.Table.Of(ev.Major, ev.Minor, own); ok {
		r.GPU = &audit.GPU{Index: g.Index}
		r.GPU.UUID, _ = e.o.Table.UUID(g.Index)
		if g.MIG {
			r.GPU.MIG = &audit.MIG{Profile: g.Type}
		}
		r.Device.Path = path
		r.Device.Kind = audit.DeviceGPU
		if ev.Major != g.Major {
			r.Device.Kind = audit.DeviceMIGCapability
		}
	}
	switch kind, path := e.o.Fabric.Of(ev.Major, ev.Minor); kind {
	case devices.NVSwitch:
		r.Device.Kind, r.Device.Path = audit.DeviceNVSwitch, path
	case devices.NVLink:
		r.Device.Kind, r.Device.Path = audit.DeviceNVLink, path
	}
	if e.o.IMEXMajor != 0 && ev.Major == e.o.IMEXMajor {
		r.Device.Kind = audit.DeviceIMEXChannel
		r.Device.Path = fmt.Sprintf("%s/channel%d", imexchan.Dir, ev.Minor)
	}
	who := "a cgroup without a policy entry (no registered step)"
	switch {
	case known && o.Exempt != "" && ev.Decision != devfilter.DecisionAllowed:
		// Slurm's own cgroups keep every device for root only: what the
		// program refuses there is a process that runs as a user (slurmd's
		// sbcast child opening its destination as the job's user).
		r.Reason = audit.ReasonNonRootInSlurmCgroup
		who = "a non-root process in Slurm's own " + o.Exempt + " cgroup (every device there is for root only)"
	case known && o.Exempt != "":
		who = "Slurm's " + o.Exempt + " cgroup"
	case known:
		r.JobID, r.StepID = o.JobID, policy.StepName(o.StepID)
		if e.o.Shares != nil {
			r.Shares = e.o.Shares(o.JobID)
		}
		who = fmt.Sprintf("job %d step %s", o.JobID, r.StepID)
	}
	what := fmt.Sprintf("device %d:%d", ev.Major, ev.Minor)
	switch {
	case r.Device.Kind == audit.DeviceNVSwitch || r.Device.Kind == audit.DeviceNVLink:
		name := "NVSwitch"
		if r.Device.Kind == audit.DeviceNVLink {
			name = "NVLink"
		}
		what = fmt.Sprintf("%s management device %d:%d", name, ev.Major, ev.Minor)
		if r.Device.Path != "" {
			what = fmt.Sprintf("%s management device %s (%d:%d)", name, r.Device.Path, ev.Major, ev.Minor)
		}
	case r.Device.Kind == audit.DeviceIMEXChannel:
		what = fmt.Sprintf("IMEX channel %d (%s, %d:%d)", ev.Minor, r.Device.Path, ev.Major, ev.Minor)
	case r.GPU != nil && r.GPU.MIG != nil:
		what = fmt.Sprintf("MIG slice GPU %d (%s)", r.GPU.Index, r.Device.Path)
	case r.GPU != nil:
		what = fmt.Sprintf("GPU %d (%s)", r.GPU.Index, r.Device.Path)
	}
	r.Message = fmt.Sprintf("%s %s to %s: pid %d %s, uid %d", what, r.Decision, who, ev.TGID, comm, ev.UID)
	switch r.ExeStatus {
	case audit.ExeChanged:
		r.Message += fmt.Sprintf(" (the process has run %s since; the program of the access is not known by name)", r.ExeNow)
	case audit.ExeOtherNamespace:
		r.Message += fmt.Sprintf(" (its mount namespace calls the program %s; on the node that path names another file or none; the program is file %s inode %d)", r.ExeNamespacePath, r.ExeDev, r.ExeIno)
	}
	if suppressed > 0 {
		r.Message += fmt.Sprintf(" (%d more not recorded)", suppressed)
	}
	return r
}

func accessList(a devfilter.Access) []string {
	var out []string
	for _, p := range strings.Split(a.String(), ",") {
		if p != "" && p != "none" {
			out = append(out, p)
		}
	}
	return out
}

// suppression turns the kernel's monotonic per-key suppressed totals into
// exact per-record counts: each total is accounted once, by whichever comes
// first, a later event of the key or the periodic flush.
type suppression struct {
	mu       sync.Mutex
	reported map[devfilter.RateKey]uint64
	lost     uint64
	// rateFull is the kernel's rate_full count by decision at the last
	// flush.
	rateFull map[devfilter.Decision]uint64
	// forget holds cgroups whose entries went, with who they were: flushed
	// once more, then their rate entries are deleted.
	forget map[uint64]registry.Owner
	// gone is forget of the last Flush: events of those cgroups still
	// queued are attributed until the next one.
	gone map[uint64]registry.Owner
}

// released is who a cgroup released lately was.
func (s *suppression) released(id uint64) (registry.Owner, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.forget[id]; ok {
		return o, true
	}
	o, ok := s.gone[id]
	return o, ok
}

// take returns how many suppressed accesses of key were not reported yet,
// given a total seen now.
func (s *suppression) take(key devfilter.RateKey, total uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reported == nil {
		s.reported = map[devfilter.RateKey]uint64{}
	}
	prev := s.reported[key]
	if total <= prev {
		return 0
	}
	s.reported[key] = total
	return total - prev
}

func (s *suppression) drop(cgroupID uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.reported {
		if k.CgroupID == cgroupID {
			delete(s.reported, k)
		}
	}
}

// baseline takes the adopted counters' totals as already reported, or,
// with Options.Resume, what the previous agent reported of them (never
// more than the totals now).
func (e *Events) baseline(c Counters) {
	totals, err := c.Suppressed()
	if err != nil {
		e.o.Log.Warn("read adopted suppressed counts; they may be reported twice", "err", err)
	}
	lost, _ := c.Lost()
	full, _ := c.RateFull()
	if r := e.o.Resume; r != nil {
		// Once: a later filter's counters are new.
		e.o.Resume = nil
		totals = maps.Clone(totals)
		for k, v := range totals {
			totals[k] = min(v, r.Suppressed[k])
		}
		lost = min(lost, r.Lost)
		full = maps.Clone(full)
		for d, v := range full {
			full[d] = min(v, r.RateFull[d])
		}
		e.o.Log.Info("resuming the previous agent's audit counts: what the kernel counted since it stopped is reported", "keys", len(r.Suppressed))
	}
	e.supp.mu.Lock()
	defer e.supp.mu.Unlock()
	if e.supp.reported == nil {
		e.supp.reported = map[devfilter.RateKey]uint64{}
	}
	for k, v := range totals {
		e.supp.reported[k] = v
	}
	e.supp.lost = lost
	e.supp.rateFull = maps.Clone(full)
}

// Reported is what the stage has accounted for so far; the daemon saves it
// when the agent stops (Options.Resume).
func (e *Events) Reported() Reported {
	e.supp.mu.Lock()
	defer e.supp.mu.Unlock()
	return Reported{Suppressed: maps.Clone(e.supp.reported), Lost: e.supp.lost, RateFull: maps.Clone(e.supp.rateFull)}
}

// Release notes that cgroup id's entry went; o is who it was. Its last
// suppressed counts are reported at the next Flush, then its rate entries
// are deleted.
func (e *Events) Release(id uint64, o registry.Owner) {
	e.supp.mu.Lock()
	defer e.supp.mu.Unlock()
	if e.supp.forget == nil {
		e.supp.forget = map[uint64]registry.Owner{}
	}
	e.supp.forget[id] = o
}

// Flush reports suppressed counts no event carried, new ring buffer losses
// and rate table overflows, and forgets the rate entries of released
// cgroups.
func (e *Events) Flush(c Counters) {
	totals, err := c.Suppressed()
	if err != nil {
		e.o.Log.Error("read suppressed counts", "err", err)
		return
	}
	e.supp.mu.Lock()
	forget := e.supp.forget
	e.supp.forget = nil
	e.supp.gone = forget
	e.supp.mu.Unlock()
	view := e.o.Owners.View()
	for key, total := range totals {
		n := e.supp.take(key, total)
		if n == 0 {
			continue
		}
		o, known := view.Owner(key.CgroupID)
		if !known {
			o, known = forget[key.CgroupID]
		}
		ev := devfilter.Event{CgroupID: key.CgroupID, Major: key.Major, Minor: key.Minor, Decision: key.Decision}
		r := e.accessRecord(ev, o, known, n)
		r.Event, r.PID, r.Comm, r.UID, r.User, r.Access = audit.EventAccessSuppressed, 0, "", nil, "", nil
		r.Exe, r.ExeNow, r.ExeStatus, r.ExeDev, r.ExeIno = "", "", "", "", 0
		if known && o.Exempt == "" && o.JobID != 0 {
			r.UID = audit.UID(o.UID)
			r.User = e.o.Users.Name(o.UID)
		}
		who := "a cgroup without a policy entry"
		switch {
		case r.StepID != "":
			who = fmt.Sprintf("job %d step %s", r.JobID, r.StepID)
		case r.Reason == audit.ReasonNonRootInSlurmCgroup:
			who = "non-root processes in Slurm's own " + o.Exempt + " cgroup"
		case known && o.Exempt != "":
			who = "Slurm's " + o.Exempt + " cgroup"
		}
		r.Message = fmt.Sprintf("%d more %s accesses to device %d:%d by %s were not recorded one by one", n, r.Decision, key.Major, key.Minor, who)
		e.o.Recorder.Emit(r)
	}
	for id := range forget {
		if err := c.ForgetRate(id); err != nil {
			e.o.Log.Error("forget rate entries", "cgroup_id", id, "err", err)
		}
		e.supp.drop(id)
	}
	if lost, err := c.Lost(); err == nil {
		e.supp.mu.Lock()
		delta := lost - e.supp.lost
		e.supp.lost = lost
		e.supp.mu.Unlock()
		if delta > 0 {
			e.o.Log.Warn("kernel audit events lost (ring buffer full); enforcement unaffected", "lost", delta)
			e.o.Recorder.ReportLoss(delta)
		}
	}
	full, err := c.RateFull()
	if err != nil {
		e.o.Log.Error("read rate table overflows", "err", err)
		return
	}
	e.supp.mu.Lock()
	var deltas map[string]uint64
	for dec, n := range full {
		if n > e.supp.rateFull[dec] {
			if deltas == nil {
				deltas = map[string]uint64{}
			}
			deltas[decisionName(dec)] = n - e.supp.rateFull[dec]
		}
	}
	e.supp.rateFull = maps.Clone(full)
	e.supp.mu.Unlock()
	if deltas != nil {
		e.o.Log.Warn("GPU accesses counted without job or device: the kernel's rate table is full (a flood over many steps and devices); decisions unaffected", "by_decision", fmt.Sprint(deltas))
		e.o.Recorder.ReportRateFull(deltas)
	}
}

// Tracked is the size of the stage's own bookkeeping: rate keys it holds
// reported totals of, and released cgroups not flushed yet. Leak checks
// watch it.
func (e *Events) Tracked() (reported, released int) {
	e.supp.mu.Lock()
	defer e.supp.mu.Unlock()
	return len(e.supp.reported), len(e.supp.forget)
}
