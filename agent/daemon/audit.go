package daemon

import (
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Recorder receives audit records; *audit.Pipeline implements it. Emit
// must not block: the kernel's events are read on the same goroutine.
type Recorder interface {
	Emit(r audit.Record)
	ReportLoss(ringbufLost uint64)
}

type nopRecorder struct{}

func (nopRecorder) Emit(audit.Record) {}
func (nopRecorder) ReportLoss(uint64) {}

// suppression turns the kernel's monotonic per-key suppressed totals into
// exact per-record counts: each total is accounted once, by whichever comes
// first, a later event of the key or the periodic flush.
type suppression struct {
	mu       sync.Mutex
	reported map[devfilter.RateKey]uint64
	lost     uint64
	// forget holds cgroups whose steps ended, with who they were: flushed
	// once more, then their kernel entries are deleted.
	forget map[uint64]owner
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

func decisionName(d devfilter.Decision) string {
	switch d {
	case devfilter.DecisionAllowed:
		return audit.DecisionAllowed
	case devfilter.DecisionWouldDeny:
		return audit.DecisionWouldDeny
	}
	return audit.DecisionDenied
}

func (d *Daemon) policyMode() string {
	if d.auditOnly.Load() {
		return audit.ModeAuditOnly
	}
	return audit.ModeEnforce
}

// userNames caches uid → name lookups: NSS can be slow (LDAP, SSSD), so a
// lookup is never made while the daemon's lock is held (get is called
// before, cached under it). A failed lookup is remembered only briefly, so
// a directory that was down is asked again.
type userNames struct {
	mu    sync.Mutex
	names map[uint32]userName
	// lookup is user.LookupId's name; tests replace it.
	lookup func(uid uint32) (string, error)
}

type userName struct {
	name    string
	expires time.Time
}

const (
	userNameTTL       = time.Hour
	userNameFailedTTL = 30 * time.Second
)

// get returns uid's name, asking NSS when it is not cached. Never call it
// with d.mu held.
func (u *userNames) get(uid uint32) string {
	if n, ok := u.lookupCache(uid); ok {
		return n
	}
	lookup := u.lookup
	if lookup == nil {
		lookup = func(uid uint32) (string, error) {
			usr, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
			if err != nil {
				return "", err
			}
			return usr.Username, nil
		}
	}
	name, err := lookup(uid)
	ttl := userNameTTL
	if err != nil {
		name, ttl = "", userNameFailedTTL
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.names == nil {
		u.names = map[uint32]userName{}
	}
	u.names[uid] = userName{name: name, expires: time.Now().Add(ttl)}
	return name
}

// cached returns uid's name only if it is cached; "" otherwise. It never
// asks NSS, so it is safe under d.mu.
func (u *userNames) cached(uid uint32) string {
	n, _ := u.lookupCache(uid)
	return n
}

func (u *userNames) lookupCache(uid uint32) (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	n, ok := u.names[uid]
	if !ok || time.Now().After(n.expires) {
		return n.name, false
	}
	return n.name, true
}

// accessRecord attributes one kernel event: job and step from the cgroup,
// user, process, device and GPU.
func (d *Daemon) accessRecord(ev devfilter.Event, o owner, known bool, suppressed uint64) audit.Record {
	r := audit.Record{
		Event:      audit.EventGPUAccess,
		Decision:   decisionName(ev.Decision),
		PolicyMode: d.policyMode(),
		UID:        audit.UID(ev.UID),
		User:       d.users.get(ev.UID),
		PID:        ev.TGID,
		Comm:       ev.Comm,
		Device:     &audit.Device{Major: ev.Major, Minor: ev.Minor},
		Access:     accessList(ev.Access),
		Suppressed: suppressed,
		CgroupID:   ev.CgroupID,
		Severity:   audit.SeverityWarning,
	}
	if ev.Decision == devfilter.DecisionAllowed {
		r.Severity = audit.SeverityInfo
	}
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", ev.TGID)); err == nil {
		r.Exe = exe
	}
	if g, path, ok := d.gpuOf(ev.Major, ev.Minor, o, known); ok {
		r.GPU = &audit.GPU{Index: g.Index}
		r.GPU.UUID, _ = d.GPUUUID(g.Index)
		if g.MIG {
			r.GPU.MIG = &audit.MIG{Profile: g.Type}
		}
		r.Device.Path = path
	}
	who := "a cgroup without a policy entry (no registered step)"
	switch {
	case known && o.exempt != "":
		who = "Slurm's " + o.exempt + " cgroup"
	case known:
		r.JobID, r.StepID = o.jobID, policy.StepName(o.stepID)
		who = fmt.Sprintf("job %d step %s", o.jobID, r.StepID)
	}
	what := fmt.Sprintf("device %d:%d", ev.Major, ev.Minor)
	switch {
	case r.GPU != nil && r.GPU.MIG != nil:
		what = fmt.Sprintf("MIG slice GPU %d (%s)", r.GPU.Index, r.Device.Path)
	case r.GPU != nil:
		what = fmt.Sprintf("GPU %d (%s)", r.GPU.Index, r.Device.Path)
	}
	r.Message = fmt.Sprintf("%s %s to %s: pid %d %s, uid %d", what, r.Decision, who, ev.TGID, ev.Comm, ev.UID)
	if suppressed > 0 {
		r.Message += fmt.Sprintf(" (%d more not recorded)", suppressed)
	}
	return r
}

// gpuOf attributes a device to the GPU index holding it, and names its
// file: a GPU minor or a MIG capability minor. Slices of one GPU share its
// minor, and compute instances of one GPU instance its access minor, so the
// step's own index wins among several, else the lowest. d.mu must not be
// held.
func (d *Daemon) gpuOf(major, minor uint32, o owner, known bool) (devices.GPU, string, bool) {
	var held []int
	switch {
	case major == d.nvidiaMajor:
		held = d.byMinor[minor]
	case d.capsMajor != 0 && major == d.capsMajor:
		held = d.byCaps[minor]
	}
	if len(held) == 0 {
		return devices.GPU{}, "", false
	}
	idx := held[0]
	if known && o.exempt == "" {
		d.mu.Lock()
		var own []int
		if j := d.jobs[o.jobID]; j != nil && j.steps[o.stepID] != nil {
			own = j.steps[o.stepID].gpus
		}
		d.mu.Unlock()
		for _, h := range held {
			if slices.Contains(own, h) {
				idx = h
				break
			}
		}
	}
	g := d.gpus[idx]
	if major == d.nvidiaMajor {
		return g, g.Path, true
	}
	for _, c := range g.Caps {
		if c.Minor == minor {
			return g, c.Path, true
		}
	}
	return g, "", true
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

// flushAudit reports suppressed counts no event carried, new ring buffer
// losses, and forgets the rate entries of ended steps.
func (d *Daemon) flushAudit(f Filter) {
	totals, err := f.Suppressed()
	if err != nil {
		d.log.Error("read suppressed counts", "err", err)
		return
	}
	d.supp.mu.Lock()
	forget := d.supp.forget
	d.supp.forget = nil
	d.supp.mu.Unlock()
	for key, total := range totals {
		n := d.supp.take(key, total)
		if n == 0 {
			continue
		}
		d.mu.Lock()
		o, known := d.owners[key.CgroupID]
		d.mu.Unlock()
		if !known {
			o, known = forget[key.CgroupID]
		}
		ev := devfilter.Event{CgroupID: key.CgroupID, Major: key.Major, Minor: key.Minor, Decision: key.Decision}
		r := d.accessRecord(ev, o, known, n)
		r.Event, r.PID, r.Comm, r.UID, r.User, r.Exe, r.Access = audit.EventAccessSuppressed, 0, "", nil, "", "", nil
		if known && o.exempt == "" {
			r.UID = audit.UID(o.uid)
			r.User = d.users.get(o.uid)
		}
		who := "a cgroup without a policy entry"
		if r.StepID != "" {
			who = fmt.Sprintf("job %d step %s", r.JobID, r.StepID)
		}
		r.Message = fmt.Sprintf("%d more %s accesses to device %d:%d by %s were not recorded one by one", n, r.Decision, key.Major, key.Minor, who)
		d.rec.Emit(r)
	}
	for id := range forget {
		if err := f.ForgetRate(id); err != nil {
			d.log.Error("forget rate entries", "cgroup_id", id, "err", err)
		}
		d.supp.drop(id)
	}
	if lost, err := f.Lost(); err == nil {
		d.supp.mu.Lock()
		delta := lost - d.supp.lost
		d.supp.lost = lost
		d.supp.mu.Unlock()
		if delta > 0 {
			d.log.Warn("kernel audit events lost (ring buffer full); enforcement unaffected", "lost", delta)
			d.rec.ReportLoss(delta)
		}
	}
}

// lifecycle emits a lifecycle record.
func (d *Daemon) lifecycle(ev audit.Event, sev audit.Severity, msg string, fill func(*audit.Record)) {
	r := audit.Record{Event: ev, Severity: sev, Message: msg}
	if fill != nil {
		fill(&r)
	}
	d.rec.Emit(r)
}
