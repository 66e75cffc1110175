// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultFile is where the agent writes audit records unless configured otherwise.
const DefaultFile = "/var/log/gpufence/audit.jsonl"

// DefaultJournalSocket is journald's native protocol socket.
const DefaultJournalSocket = "/run/systemd/journal/socket"

// Options configures a Pipeline. Zero values take the documented defaults.
type Options struct {
	// File is the JSON Lines path; "" disables the file sink.
	File string
	// FileMode is the file's mode (DefaultFileMode when 0); FileGroup, a
	// group name or number, is its group (root's when empty), and its
	// folder's unless others may pass that already.
	FileMode  os.FileMode
	FileGroup string
	// OCSFFile, when set, is a second file of the same mode and group
	// holding each record as one OCSF event per line (OCSF); "" (the
	// default) writes none.
	OCSFFile string
	// Journald is "auto" (on when JournalSocket exists), "on" or "off"; "" means "auto".
	Journald string
	// Syslog is "" (off), "unix:///dev/log", "unixgram:///path",
	// "tcp://host:port" or "tls://host:port" (RFC 5425, SyslogTLS).
	Syslog    string
	SyslogTLS SyslogTLS
	// QueueSize bounds the queue between Emit and the sinks (default 4096).
	QueueSize int
	// SinkQueueSize bounds each sink's own queue (default 1024).
	SinkQueueSize               int
	Node, Cluster, AgentVersion string

	// RetryInterval is how long a failing sink waits before it tries again
	// (default 1s); records meanwhile are counted as lost.
	RetryInterval time.Duration
	// CloseTimeout bounds how long Close waits for sinks to drain (default 5s).
	CloseTimeout time.Duration
	// JournalSocket overrides DefaultJournalSocket (tests, journald namespaces).
	JournalSocket string
	// BootID overrides /proc/sys/kernel/random/boot_id (tests).
	BootID string
	// Host identifies the machine in every record (HostIdentity).
	Host Host
	// RunID overrides the random run id made by New (tests); 32 lower-case
	// hex digits.
	RunID string

	testWriters []writer
	// testStall, when set, runs before each record is dispatched (tests
	// hold the dispatcher with it to fill the queue).
	testStall func()
}

// Stats counts records since New.
type Stats struct {
	// Emitted is the number of records handed to the sinks (the last seq).
	Emitted uint64
	// QueueDropped counts records dropped because the queue was full.
	QueueDropped uint64
	// RateFull counts accesses the kernel counted without a rate key
	// (its rate table was full), reported through ReportRateFull.
	RateFull uint64
	Sinks    map[string]SinkStats
}

// SinkStats counts one sink's records.
type SinkStats struct {
	Written, Failed, Dropped uint64
}

type lateRecord struct {
	r    Record
	from *sink
}

// Pipeline numbers records and delivers them to its sinks.
type Pipeline struct {
	opts   Options
	log    *slog.Logger
	bootID string
	runID  string

	mu     sync.RWMutex // guards closed against Emit's send
	closed bool
	queue  chan Record

	seq          atomic.Uint64
	queueDropped atomic.Uint64 // since the last audit_loss record
	ringbufLost  atomic.Uint64 // since the last audit_loss record
	totalDropped atomic.Uint64
	// rateFull counts by decision since the last audit_loss record;
	// rateFullTotal since New.
	rateFull      [len(rateFullDecisions)]atomic.Uint64
	rateFullTotal atomic.Uint64

	sinks      []*sink
	sinkMu     sync.RWMutex // guards sinkClosed against broadcast
	sinkClosed bool
	late       []lateRecord // broadcast after the sink queues closed

	dispatched chan struct{}
	sinksDone  sync.WaitGroup
	closeOnce  sync.Once
	closeErr   error
}

// New validates opts, opens the sinks and starts delivering.
func New(opts Options, log *slog.Logger) (*Pipeline, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "audit")
	if opts.QueueSize == 0 {
		opts.QueueSize = 4096
	}
	if opts.SinkQueueSize == 0 {
		opts.SinkQueueSize = 1024
	}
	if opts.QueueSize < 0 || opts.SinkQueueSize < 0 {
		return nil, errors.New("audit: queue sizes must be positive")
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = time.Second
	}
	if opts.CloseTimeout <= 0 {
		opts.CloseTimeout = 5 * time.Second
	}
	if opts.JournalSocket == "" {
		opts.JournalSocket = DefaultJournalSocket
	}
	if opts.Journald == "" {
		opts.Journald = "auto"
	}
	p := &Pipeline{
		opts:       opts,
		log:        log,
		bootID:     opts.BootID,
		queue:      make(chan Record, opts.QueueSize),
		dispatched: make(chan struct{}),
	}
	if p.bootID == "" {
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err != nil {
			return nil, fmt.Errorf("audit: read boot id: %w", err)
		}
		p.bootID = strings.TrimSpace(string(b))
	}
	p.runID = opts.RunID
	if p.runID == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("audit: make run id: %w", err)
		}
		p.runID = hex.EncodeToString(b[:])
	} else if !validRunID(p.runID) {
		return nil, fmt.Errorf("audit: run id %q is not 32 lower-case hex digits", p.runID)
	}
	var writers []writer
	fail := func(err error) (*Pipeline, error) {
		for _, w := range writers {
			w.Close()
		}
		return nil, err
	}
	gid := -1
	if opts.FileGroup != "" && (opts.File != "" || opts.OCSFFile != "") {
		g, err := lookupGroup(opts.FileGroup)
		if err != nil {
			return fail(fmt.Errorf("audit file sink: file_group: %w", err))
		}
		gid = g
	}
	if opts.File != "" {
		w, err := openFile(opts.File, opts.FileMode, gid)
		if err != nil {
			return fail(fmt.Errorf("audit file sink: %w", err))
		}
		writers = append(writers, w)
	}
	if opts.OCSFFile != "" {
		if filepath.Clean(opts.OCSFFile) == filepath.Clean(opts.File) {
			return fail(fmt.Errorf("audit OCSF file sink: %s is the JSON Lines file too", opts.OCSFFile))
		}
		w, err := openOCSFFile(opts.OCSFFile, opts.FileMode, gid)
		if err != nil {
			return fail(fmt.Errorf("audit OCSF file sink: %w", err))
		}
		writers = append(writers, w)
	}
	switch opts.Journald {
	case "off":
	case "auto", "on":
		if _, err := os.Stat(opts.JournalSocket); err != nil {
			if opts.Journald == "on" {
				return fail(fmt.Errorf("audit journald sink: journald=on but %s: %w", opts.JournalSocket, err))
			}
			break
		}
		w, err := openJournal(opts.JournalSocket)
		if err != nil {
			return fail(fmt.Errorf("audit journald sink: %w", err))
		}
		writers = append(writers, w)
	default:
		return fail(fmt.Errorf("audit: journald: %q is not auto, on or off", opts.Journald))
	}
	if opts.Syslog != "" {
		w, err := openSyslog(opts.Syslog, opts.Node, opts.SyslogTLS)
		if err != nil {
			return fail(fmt.Errorf("audit syslog sink: %w", err))
		}
		writers = append(writers, w)
	}
	writers = append(writers, opts.testWriters...)
	for _, w := range writers {
		s := &sink{name: w.Name(), w: w, p: p, ch: make(chan Record, opts.SinkQueueSize)}
		p.sinks = append(p.sinks, s)
		p.sinksDone.Add(1)
		go s.run()
	}
	go p.dispatch()
	return p, nil
}

// Emit queues r and returns at once. It fills time (when zero) now; seq,
// node, cluster, agent version and boot id are filled on delivery. When the
// queue is full, r is dropped and counted; the next audit_loss record says so.
func (p *Pipeline) Emit(r Record) {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		p.queueDropped.Add(1)
		p.totalDropped.Add(1)
		return
	}
	select {
	case p.queue <- r:
	default:
		p.queueDropped.Add(1)
		p.totalDropped.Add(1)
	}
}

// ReportLoss adds n events the kernel ring buffer lost; the next audit_loss
// record reports them.
func (p *Pipeline) ReportLoss(ringbufLost uint64) {
	p.ringbufLost.Add(ringbufLost)
}

// rateFullDecisions are the decisions ReportRateFull counts, in the order of
// Pipeline.rateFull.
var rateFullDecisions = [...]string{DecisionDenied, DecisionAllowed, DecisionWouldDeny}

// ReportRateFull adds accesses, by decision, that the kernel counted without
// a rate key because its rate table was full; the next audit_loss record
// reports them. Like ReportLoss it never drops: the counts stay exact
// however full the queue is.
func (p *Pipeline) ReportRateFull(byDecision map[string]uint64) {
	for i, d := range rateFullDecisions {
		if n := byDecision[d]; n > 0 {
			p.rateFull[i].Add(n)
			p.rateFullTotal.Add(n)
		}
	}
}

// Reopen reopens the file sinks (after logrotate renamed them); other sinks
// reconnect on their own.
func (p *Pipeline) Reopen() error {
	var errs []error
	for _, s := range p.sinks {
		if r, ok := s.w.(interface{ Reopen() error }); ok {
			errs = append(errs, r.Reopen())
		}
	}
	return errors.Join(errs...)
}

// RunID is this pipeline's run id, in every record it numbers.
func (p *Pipeline) RunID() string { return p.runID }

// Stats returns counts since New.
func (p *Pipeline) Stats() Stats {
	st := Stats{
		Emitted:      p.seq.Load(),
		QueueDropped: p.totalDropped.Load(),
		RateFull:     p.rateFullTotal.Load(),
		Sinks:        map[string]SinkStats{},
	}
	for _, s := range p.sinks {
		st.Sinks[s.name] = SinkStats{Written: s.written.Load(), Failed: s.failed.Load(), Dropped: s.dropped.Load()}
	}
	return st
}

// Close stops accepting records, delivers what is queued (pending
// summaries and losses included), waits up to CloseTimeout for the sinks and
// closes them.
func (p *Pipeline) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		close(p.queue)
		p.mu.Unlock()
		<-p.dispatched
		p.sinkMu.Lock()
		p.sinkClosed = true
		for _, s := range p.sinks {
			close(s.ch)
		}
		p.sinkMu.Unlock()
		done := make(chan struct{})
		go func() { p.sinksDone.Wait(); close(done) }()
		var errs []error
		select {
		case <-done:
			// Final loss reports of sinks: the sink goroutines are gone, so
			// the writers are free to use here.
			for _, l := range p.late {
				for _, s := range p.sinks {
					if s == l.from {
						continue
					}
					if err := s.w.Write(&l.r); err != nil {
						s.failed.Add(1)
					} else {
						s.written.Add(1)
					}
				}
			}
		case <-time.After(p.opts.CloseTimeout):
			errs = append(errs, fmt.Errorf("audit: sinks did not drain within %s", p.opts.CloseTimeout))
		}
		for _, s := range p.sinks {
			if err := s.w.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close audit %s sink: %w", s.name, err))
			}
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// dispatch is the only goroutine that numbers records for all sinks. (The
// kernel limits access records per job step, device and decision, and
// counts the rest exactly; nothing is limited here.)
func (p *Pipeline) dispatch() {
	defer close(p.dispatched)
	for r := range p.queue {
		p.reportLoss()
		if p.opts.testStall != nil {
			p.opts.testStall()
		}
		p.send(r)
	}
	p.reportLoss()
}

// fill completes the fields every record carries and gives it the next seq.
func (p *Pipeline) fill(r *Record) {
	r.SchemaVersion = SchemaVersion
	r.BootID = p.bootID
	r.RunID = p.runID
	if r.Host == nil && !p.opts.Host.zero() {
		h := p.opts.Host
		r.Host = &h
	}
	r.PrevHash, r.Hash = "", ""
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	if r.Node == "" {
		r.Node = p.opts.Node
	}
	if r.Cluster == "" {
		r.Cluster = p.opts.Cluster
	}
	if r.AgentVersion == "" {
		r.AgentVersion = p.opts.AgentVersion
	}
	if r.Severity == "" {
		r.Severity = SeverityInfo
	}
	printable(r)
	r.Seq = p.seq.Add(1)
}

// printable makes every text field of r safe for a terminal, whichever sink
// or reader shows it: fields from hostile sources are Escape'd where they
// are made (comm, exe), this catches whatever else carries such text
// (messages, errors, reasons that quote a job's own fields).
func printable(r *Record) {
	for _, f := range []*string{&r.Node, &r.Cluster, &r.AgentVersion, &r.Message, &r.StepID, &r.User,
		&r.Comm, &r.Exe, &r.ExeNow, &r.ExeNamespacePath, &r.ExeDev, &r.Cgroup, &r.Reason, &r.Error} {
		*f = Printable(*f)
	}
	if h := r.Host; h != nil && (Printable(h.FQDN) != h.FQDN || Printable(h.MachineID) != h.MachineID || Printable(h.EC2InstanceID) != h.EC2InstanceID) {
		r.Host = &Host{MachineID: Printable(h.MachineID), FQDN: Printable(h.FQDN), EC2InstanceID: Printable(h.EC2InstanceID)}
	}
	if r.Device != nil && Printable(r.Device.Path) != r.Device.Path {
		d := *r.Device
		d.Path = Printable(d.Path)
		r.Device = &d
	}
	if g := r.GPU; g != nil && (Printable(g.UUID) != g.UUID || (g.MIG != nil && Printable(g.MIG.Profile) != g.MIG.Profile)) {
		c := *g
		c.UUID = Printable(c.UUID)
		if c.MIG != nil {
			c.MIG = &MIG{Profile: Printable(c.MIG.Profile)}
		}
		r.GPU = &c
	}
}

func (p *Pipeline) send(r Record) {
	p.fill(&r)
	for _, s := range p.sinks {
		s.enqueue(r)
	}
}

// broadcast hands a record that sink from already has to the other sinks.
func (p *Pipeline) broadcast(r Record, from *sink) {
	p.sinkMu.Lock()
	defer p.sinkMu.Unlock()
	if p.sinkClosed {
		p.late = append(p.late, lateRecord{r, from})
		return
	}
	for _, s := range p.sinks {
		if s != from {
			s.enqueue(r)
		}
	}
}

func (p *Pipeline) reportLoss() {
	pending := p.queueDropped.Load() != 0 || p.ringbufLost.Load() != 0
	for i := range p.rateFull {
		pending = pending || p.rateFull[i].Load() != 0
	}
	if !pending {
		return
	}
	q, rb := p.queueDropped.Swap(0), p.ringbufLost.Swap(0)
	loss := &Loss{QueueDropped: q, RingbufLost: rb, SinkFailed: map[string]uint64{}}
	msg := fmt.Sprintf("audit records lost: %d dropped at the full queue, %d lost in the kernel ring buffer", q, rb)
	var full []string
	for i, d := range rateFullDecisions {
		if n := p.rateFull[i].Swap(0); n > 0 {
			if loss.RateFull == nil {
				loss.RateFull = map[string]uint64{}
			}
			loss.RateFull[d] = n
			full = append(full, fmt.Sprintf("%d %s", n, d))
		}
	}
	if len(full) > 0 {
		msg += fmt.Sprintf("; accesses counted without job or device because the kernel's rate table was full (decisions stood): %s", strings.Join(full, ", "))
	}
	p.send(Record{Event: EventAuditLoss, Severity: SeverityWarning, Message: msg, Loss: loss})
}
