package daemon

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/user"
	"path/filepath"
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
// ReportLoss (events the kernel's ring buffer had no room for) and
// ReportRateFull (accesses, by decision, the kernel counted without a rate
// key because its rate table was full) must never drop what they are given.
type Recorder interface {
	Emit(r audit.Record)
	ReportLoss(ringbufLost uint64)
	ReportRateFull(byDecision map[string]uint64)
}

type nopRecorder struct{}

func (nopRecorder) Emit(audit.Record)                {}
func (nopRecorder) ReportLoss(uint64)                {}
func (nopRecorder) ReportRateFull(map[string]uint64) {}

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
// user, process, device and GPU. Text the process chose (comm, exe) is
// Escape'd; exe is checked against what the kernel saw at the access.
func (d *Daemon) accessRecord(ev devfilter.Event, o owner, known bool, suppressed uint64) audit.Record {
	comm := audit.Escape(ev.Comm)
	r := audit.Record{
		Event:      audit.EventGPUAccess,
		Decision:   decisionName(ev.Decision),
		PolicyMode: d.policyMode(),
		UID:        audit.UID(ev.UID),
		User:       d.users.get(ev.UID),
		PID:        ev.TGID,
		Comm:       comm,
		Device:     &audit.Device{Major: ev.Major, Minor: ev.Minor},
		Access:     accessList(ev.Access),
		Suppressed: suppressed,
		CgroupID:   ev.CgroupID,
		Severity:   audit.SeverityWarning,
	}
	if ev.Decision == devfilter.DecisionAllowed {
		r.Severity = audit.SeverityInfo
	}
	if ev.TGID != 0 {
		x := checkExe("/proc", ev)
		r.Exe, r.ExeNow, r.ExeStatus = audit.Escape(x.exe), audit.Escape(x.now), x.status
	}
	if ev.Exe.Known() {
		r.ExeDev, r.ExeIno = fmt.Sprintf("%d:%d", ev.Exe.Major, ev.Exe.Minor), ev.Exe.Ino
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
	r.Message = fmt.Sprintf("%s %s to %s: pid %d %s, uid %d", what, r.Decision, who, ev.TGID, comm, ev.UID)
	if r.ExeStatus == audit.ExeChanged {
		r.Message += fmt.Sprintf(" (the process has run %s since; the program of the access is not known by name)", r.ExeNow)
	}
	if suppressed > 0 {
		r.Message += fmt.Sprintf(" (%d more not recorded)", suppressed)
	}
	return r
}

// exeCheck is what the agent can say of the program of an access.
type exeCheck struct {
	// exe is set when verified; now when /proc shows a path that is not
	// (or could not be shown to be) the program of the access.
	exe, now, status string
}

// userHZ is the unit of the start time in /proc/<pid>/stat (USER_HZ, 100
// on every Linux architecture gpufence runs on).
const userHZ = 100

// checkExe reads /proc/<tgid>/exe, which comes after the access, and says
// whether it is still the program the kernel saw at the access: the same
// process (start time) running the same file (inode, superblock device).
// The path is read before and after the file is compared, so an exec in
// between is not taken for the program of the access.
func checkExe(proc string, ev devfilter.Event) exeCheck {
	dir := filepath.Join(proc, strconv.FormatUint(uint64(ev.TGID), 10))
	start, ok := procStart(dir)
	if !ok || (ev.Start != 0 && start != uint64(ev.Start/(time.Second/userHZ))) {
		// Gone, or the pid is another process's now.
		return exeCheck{status: audit.ExeExited}
	}
	path, err := os.Readlink(filepath.Join(dir, "exe"))
	if err != nil {
		if _, serr := os.Stat(dir); serr != nil {
			return exeCheck{status: audit.ExeExited}
		}
		// A kernel thread, or a process whose exe cannot be read.
		return exeCheck{status: audit.ExeUnverified}
	}
	same, err := devfilter.SameExe(filepath.Join(dir, "exe"), filepath.Join(dir, "mountinfo"), ev.Exe)
	again, err2 := os.Readlink(filepath.Join(dir, "exe"))
	if now, ok := procStart(dir); !ok || now != start || err2 != nil {
		return exeCheck{status: audit.ExeExited}
	}
	switch {
	case err != nil || again != path:
		return exeCheck{now: again, status: audit.ExeUnverified}
	case !same:
		return exeCheck{now: path, status: audit.ExeChanged}
	}
	return exeCheck{exe: path, status: audit.ExeVerified}
}

// procStart is field 22 of <dir>/stat, the process's start in clock ticks
// since boot.
func procStart(dir string) (uint64, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return 0, false
	}
	// comm may hold spaces and parentheses: the fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return 0, false
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 20 {
		return 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	return v, err == nil
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
		r.Event, r.PID, r.Comm, r.UID, r.User, r.Access = audit.EventAccessSuppressed, 0, "", nil, "", nil
		r.Exe, r.ExeNow, r.ExeStatus, r.ExeDev, r.ExeIno = "", "", "", "", 0
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
	full, err := f.RateFull()
	if err != nil {
		d.log.Error("read rate table overflows", "err", err)
		return
	}
	d.supp.mu.Lock()
	var deltas map[string]uint64
	for dec, n := range full {
		if n > d.supp.rateFull[dec] {
			if deltas == nil {
				deltas = map[string]uint64{}
			}
			deltas[decisionName(dec)] = n - d.supp.rateFull[dec]
		}
	}
	d.supp.rateFull = maps.Clone(full)
	d.supp.mu.Unlock()
	if deltas != nil {
		d.log.Warn("GPU accesses counted without job or device: the kernel's rate table is full (a flood over many steps and devices); decisions unaffected", "by_decision", fmt.Sprint(deltas))
		d.rec.ReportRateFull(deltas)
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
