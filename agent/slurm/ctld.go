// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpufence/gpufence/agent/gpulist"
)

// ControllerJob is slurmctld's view of one job on one node, read only from
// output that no job user can steer: JSON (where every user-writable string
// is an escaped value) or, for a release whose clients print no JSON, the
// text of `scontrol show job -d` accepted only when its structure is
// unambiguous.
type ControllerJob struct {
	ID uint32
	// UID is the job's owner.
	UID uint32
	// State is Slurm's base job state (RUNNING, PENDING, COMPLETED, …).
	State string
	// OnNode is true when the job's allocation includes the node.
	OnNode bool
	// GPUs are the GPU indices the job holds whole on the node, ascending;
	// empty for a CPU-only job or one not on the node.
	GPUs []int
	// Shares are the shared GRES (gres/shard, gres/mps) the job holds on
	// the node, by the shared GRES's own device numbers: Shares (the GPU
	// table's) says which GPU each is on.
	Shares []Share
	// Source names the output the view was read from, for audit records.
	Source string
}

// Running reports whether the job's allocation on the node still exists:
// slurmctld lists the node in it and the job has not ended or gone back to
// the queue. A requeued job that runs again sends a new prolog.
func (j ControllerJob) Running() bool {
	if !j.OnNode {
		return false
	}
	switch j.State {
	case "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED", "RESIZING", "SIGNALING", "STAGE_OUT":
		return true
	}
	return false
}

// ErrJobUnknown is slurmctld's answer for a job it does not know: it ended
// long enough ago to be purged (MinJobAge), or never existed.
var ErrJobUnknown = errors.New("slurmctld does not know the job (ended and purged, or never existed)")

// AmbiguousError is returned when slurmctld's output cannot be trusted to
// name the job's GPUs: it could be read in more than one way (a job user's
// newlines in their job name, comment or working directory), it is
// malformed, it was cut at the cap, or no complete answer came in time (a
// user can make slurmctld slow). The job gets no GPU from it.
type AmbiguousError struct{ Reason string }

func (e *AmbiguousError) Error() string {
	return "slurmctld's output is ambiguous: " + e.Reason
}

func ambiguous(format string, a ...any) error {
	return &AmbiguousError{Reason: fmt.Sprintf(format, a...)}
}

// UnreachableError is returned when the client said it could not connect
// to slurmctld (Slurm's "Unable to contact slurm controller (connect
// failure)"): slurmctld is down or not listening. It is the only error that
// means slurmctld could not be asked; a slow or odd answer is an
// *AmbiguousError, since a user can cause one.
type UnreachableError struct{ Msg string }

func (e *UnreachableError) Error() string { return "slurmctld unreachable: " + e.Msg }

// connectFailure is how Slurm's clients say they could not connect
// (slurm_strerror of SLURM_COMMUNICATIONS_CONNECTION_ERROR and of
// SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR, 22.05 to 26.05).
var connectFailure = []byte("Unable to contact slurm controller (connect failure)")

// The error numbers of a connect failure in a JSON "errors" entry.
const (
	errnoConnection     = 1001 // SLURM_COMMUNICATIONS_CONNECTION_ERROR
	errnoCtldConnection = 1800 // SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR
)

// errTooBig marks a query form whose answer is larger or slower than its
// share of the question's time allows (22.05's squeue --json prints every
// job of the cluster, which a user can make large): the next form is
// tried, and this one skipped for squeueBackoff.
var errTooBig = errors.New("answer too large or too slow for this form")

// errNoVerdict marks an answer that says nothing about the job: no record
// of it and no error naming why. 25.11's scontrol --json show job <id>
// prints exactly that (exit 0, "jobs": [], "errors": []) both for a job it
// does not know and when it could not connect to slurmctld; 22.05's squeue
// --json prints a bare "Unspecified error" when it could not. The next form
// is asked; they say which it is.
var errNoVerdict = errors.New("no record of the job and no error saying why")

// errUnsupported marks a query form this Slurm's clients do not offer (no
// --json before 23.02 for scontrol; no JSON serializer plugin installed).
var errUnsupported = errors.New("not supported by this Slurm's clients")

// Caps on what the agent reads from one client command. One job's record
// is tens of KB at most (slurmctld caps its strings at 1 KB, paths at
// PATH_MAX; JSON escapes a control byte as six). squeue --json on 22.05
// prints every job of the cluster whatever the filters: 5,000 held jobs
// with long names print 300 MB and take 4.5 s there.
const (
	maxJobOutput    = 1 << 20
	maxSqueueOutput = 64 << 20
)

// squeueShare is the part of a question's time the squeue form may use,
// leaving the rest to the per-job text form should it be too slow.
const squeueShare = 0.6

// squeueBackoff is how long the squeue form is skipped once it was too
// large or too slow.
const squeueBackoff = 5 * time.Minute

// Controller asks slurmctld about jobs with Slurm's own client commands,
// which authenticate to slurmctld with munge like any other client.
type Controller struct {
	// SlurmConf is passed to the commands as SLURM_CONF.
	SlurmConf string
	// Node is this node's name in slurm.conf.
	Node string
	// BinDir holds scontrol and squeue; empty: <prefix>/bin when slurm.conf
	// is <prefix>/etc/slurm.conf and scontrol is there (ParallelCluster's
	// /opt/slurm), else PATH.
	BinDir string

	mu sync.Mutex
	// from is the first query form to try, once one failed as unsupported.
	from int
	// squeueSkip: the squeue form is skipped until then (errTooBig).
	squeueSkip time.Time
	// squeueCall is the squeue --json in flight, which every question
	// asked meanwhile shares: one listing answers them all.
	squeueCall *squeueCall
}

type squeueCall struct {
	done chan struct{}
	doc  jobsDoc
	err  error
}

// queries are the forms tried in order: one job as JSON (23.02+); the jobs
// on the node as JSON (squeue --json -w; 22.05's squeue ignores the filter
// and lists every job, so its answer is capped, and too large or too slow
// passes to the next form); one job as text, read strictly.
var queries = []struct {
	name string
	run  func(c *Controller, ctx context.Context, id uint32) (ControllerJob, error)
}{
	{"scontrol --json show job", (*Controller).scontrolJSON},
	{"squeue --json", (*Controller).squeueJSON},
	{"scontrol show job -d", (*Controller).scontrolText},
}

// Job returns slurmctld's view of job id on c.Node. Errors: ErrJobUnknown,
// *AmbiguousError, or why slurmctld could not be asked.
func (c *Controller) Job(ctx context.Context, id uint32) (ControllerJob, error) {
	c.mu.Lock()
	from := c.from
	c.mu.Unlock()
	var errs []error
	for i := from; i < len(queries); i++ {
		j, err := queries[i].run(c, ctx, id)
		if errors.Is(err, errUnsupported) || errors.Is(err, errTooBig) || errors.Is(err, errNoVerdict) {
			errs = append(errs, fmt.Errorf("%s: %w", queries[i].name, err))
			if errors.Is(err, errUnsupported) {
				// Never asked this way again.
				c.mu.Lock()
				c.from = max(c.from, i+1)
				c.mu.Unlock()
			}
			continue
		}
		if err == nil {
			j.Source = queries[i].name
		}
		return j, classify(queries[i].name, err)
	}
	return ControllerJob{}, &AmbiguousError{Reason: fmt.Sprintf("no way to ask slurmctld: %v", errors.Join(errs...))}
}

// classify keeps ErrJobUnknown, *UnreachableError and *AmbiguousError, and
// makes any other error (a client's odd failure, a field that does not
// parse) an *AmbiguousError: only a connect failure means slurmctld could
// not be asked.
func classify(form string, err error) error {
	if err == nil || errors.Is(err, ErrJobUnknown) || settled(err) {
		return err
	}
	return &AmbiguousError{Reason: fmt.Sprintf("%s: %v", form, err)}
}

// settled reports whether err already says what slurmctld's answer means:
// an *AmbiguousError or an *UnreachableError.
func settled(err error) bool {
	var amb *AmbiguousError
	var unreach *UnreachableError
	return errors.As(err, &amb) || errors.As(err, &unreach)
}

func (c *Controller) bin(name string) string {
	if c.BinDir != "" {
		return filepath.Join(c.BinDir, name)
	}
	if c.SlurmConf != "" {
		etc := filepath.Dir(c.SlurmConf)
		if filepath.Base(etc) == "etc" {
			p := filepath.Join(filepath.Dir(etc), "bin", name)
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				return p
			}
		}
	}
	return name
}

// run runs a Slurm client with an environment of its own: no variable of
// the agent's (SQUEUE_FORMAT, SLURM_TIME_FORMAT, SLURM_CLUSTERS, …) may change
// what it prints or whom it asks. It reads at most limit bytes of stdout:
// past that the client is stopped and the answer is ambiguous, as is one
// that did not end before ctx (a user can make slurmctld slow; only the
// client's own connect failure says slurmctld is down).
func (c *Controller) run(ctx context.Context, limit int, name string, args ...string) (stdout, stderr []byte, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin(name), args...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C", "LC_ALL=C"}
	if c.SlurmConf != "" {
		cmd.Env = append(cmd.Env, "SLURM_CONF="+c.SlurmConf)
	}
	out := &capped{max: limit, full: cancel}
	errb := &capped{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, errb
	// A child the client left holding its stdout must not hold the agent
	// past the deadline.
	cmd.WaitDelay = 200 * time.Millisecond
	t0 := time.Now()
	err = cmd.Run()
	cmdline := strings.Join(append([]string{name}, args...), " ")
	switch {
	case out.over:
		return nil, nil, &AmbiguousError{Reason: fmt.Sprintf("%s printed more than %d bytes", cmdline, limit)}
	case err != nil && ctx.Err() != nil:
		return nil, nil, &AmbiguousError{Reason: fmt.Sprintf("%s gave no complete answer in %v (%d bytes read)", cmdline, time.Since(t0).Round(time.Millisecond), out.Len())}
	case err != nil && len(bytes.TrimSpace(out.Bytes())) == 0 && bytes.Contains(errb.Bytes(), connectFailure):
		return nil, nil, &UnreachableError{Msg: cmdline + ": " + firstLine(errb.Bytes())}
	}
	return out.Bytes(), errb.Bytes(), err
}

// capped is a buffer that keeps at most max bytes; the write past them
// notes the overflow and calls full (which stops the client: reading on
// would cost the time and memory the cap is there to bound). It holds its
// buffer in a field, not embedded: an embedded bytes.Buffer's ReadFrom
// would be what io.Copy calls, past Write and its cap.
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
	full func()
}

func (b *capped) Write(p []byte) (int, error) {
	if b.over || b.buf.Len()+len(p) > b.max {
		if !b.over && b.full != nil {
			b.full()
		}
		b.over = true
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *capped) Bytes() []byte { return b.buf.Bytes() }
func (b *capped) Len() int      { return b.buf.Len() }

func unknownJobText(b []byte) bool {
	return bytes.Contains(b, []byte("Invalid job id specified"))
}

func (c *Controller) scontrolJSON(ctx context.Context, id uint32) (ControllerJob, error) {
	out, stderr, err := c.run(ctx, maxJobOutput, "scontrol", "--json", "show", "job", strconv.FormatUint(uint64(id), 10))
	if err != nil && len(bytes.TrimSpace(out)) == 0 {
		switch {
		case settled(err):
			return ControllerJob{}, err
		case bytes.Contains(stderr, []byte("unrecognized option")), bytes.Contains(stderr, []byte("invalid option")),
			bytes.Contains(stderr, []byte("plugin")) && bytes.Contains(stderr, []byte("JSON")):
			return ControllerJob{}, fmt.Errorf("%w: %s", errUnsupported, firstLine(stderr))
		case unknownJobText(stderr):
			return ControllerJob{}, ErrJobUnknown
		}
		return ControllerJob{}, fmt.Errorf("scontrol --json show job %d: %w: %s", id, err, firstLine(stderr))
	}
	doc, err := parseJobsDoc(out)
	if err != nil {
		return ControllerJob{}, err
	}
	if !doc.has(id) && len(doc.Errors) == 0 {
		return ControllerJob{}, errNoVerdict
	}
	return doc.job(id, c.Node)
}

// squeueJSON reads job id from one `squeue --json -w <node>` shared by
// every question asked while it runs. It may use squeueShare of the time
// left; an answer over the cap or slower than that is errTooBig, and the
// form is then skipped for squeueBackoff.
func (c *Controller) squeueJSON(ctx context.Context, id uint32) (ControllerJob, error) {
	c.mu.Lock()
	if time.Now().Before(c.squeueSkip) {
		c.mu.Unlock()
		return ControllerJob{}, fmt.Errorf("%w: skipped until %s", errTooBig, c.squeueSkip.Format(time.TimeOnly))
	}
	call := c.squeueCall
	if call == nil {
		call = &squeueCall{done: make(chan struct{})}
		c.squeueCall = call
		c.mu.Unlock()
		call.doc, call.err = c.squeueList(ctx)
		c.mu.Lock()
		c.squeueCall = nil
		if errors.Is(call.err, errTooBig) {
			c.squeueSkip = time.Now().Add(squeueBackoff)
		}
		c.mu.Unlock()
		close(call.done)
	} else {
		c.mu.Unlock()
		select {
		case <-call.done:
		case <-ctx.Done():
			return ControllerJob{}, &AmbiguousError{Reason: "squeue --json (asked for another job) gave no complete answer in time"}
		}
	}
	if call.err != nil {
		return ControllerJob{}, call.err
	}
	if !call.doc.has(id) && slices.ContainsFunc(call.doc.Errors, func(e jsonError) bool { return e.ErrorNumber == -1 }) {
		return ControllerJob{}, errNoVerdict
	}
	return call.doc.job(id, c.Node)
}

func (c *Controller) squeueList(ctx context.Context) (jobsDoc, error) {
	sctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, time.Duration(float64(time.Until(dl))*squeueShare))
		defer cancel()
	}
	args := []string{"--json"}
	if c.Node != "" {
		// Honoured since 23.02 (most filters with --json), ignored by
		// 22.05; the answer is read for the job and node either way.
		args = append(args, "-w", c.Node)
	}
	out, stderr, err := c.run(sctx, maxSqueueOutput, "squeue", args...)
	var amb *AmbiguousError
	switch {
	case errors.As(err, &amb) && ctx.Err() == nil:
		return jobsDoc{}, fmt.Errorf("%w: %s", errTooBig, amb.Reason)
	case settled(err):
		return jobsDoc{}, err
	case err != nil && len(bytes.TrimSpace(out)) == 0:
		if bytes.Contains(stderr, []byte("unrecognized option")) || bytes.Contains(stderr, []byte("plugin")) {
			return jobsDoc{}, fmt.Errorf("%w: %s", errUnsupported, firstLine(stderr))
		}
		return jobsDoc{}, fmt.Errorf("squeue --json: %w: %s", err, firstLine(stderr))
	}
	return parseJobsDoc(out)
}

func (c *Controller) scontrolText(ctx context.Context, id uint32) (ControllerJob, error) {
	out, stderr, err := c.run(ctx, maxJobOutput, "scontrol", "show", "job", "-d", strconv.FormatUint(uint64(id), 10))
	if err != nil {
		switch {
		case settled(err):
			return ControllerJob{}, err
		case unknownJobText(stderr):
			// stderr only: stdout holds the job's own fields.
			return ControllerJob{}, ErrJobUnknown
		}
		return ControllerJob{}, fmt.Errorf("scontrol show job -d %d: %w: %s", id, err, firstLine(stderr))
	}
	return ParseJobText(string(out), id, c.Node)
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

// jsonJob holds the fields of a job in any of Slurm's JSON dumps, 22.05
// (openapi v0.0.38) to 26.05 (data_parser v0.0.43). Every field used is
// set by slurmctld; strings a user writes are escaped JSON values.
type jsonJob struct {
	JobID  *uint32 `json:"job_id"`
	UserID *uint32 `json:"user_id"`
	// A string before 23.11, a list of flags since.
	JobState     json.RawMessage `json:"job_state"`
	JobResources json.RawMessage `json:"job_resources"`
	GresDetail   []string        `json:"gres_detail"`
}

// jobsDoc is one JSON answer of scontrol or squeue.
type jobsDoc struct {
	Jobs   []jsonJob   `json:"jobs"`
	Errors []jsonError `json:"errors"`
}

type jsonError struct {
	Error       string `json:"error"`
	Description string `json:"description"`
	ErrorNumber int    `json:"error_number"`
}

// has reports whether the answer holds a record of job id.
func (doc jobsDoc) has(id uint32) bool {
	return slices.ContainsFunc(doc.Jobs, func(j jsonJob) bool { return j.JobID != nil && *j.JobID == id })
}

func parseJobsDoc(out []byte) (jobsDoc, error) {
	var doc jobsDoc
	if err := json.Unmarshal(out, &doc); err != nil {
		return jobsDoc{}, &AmbiguousError{Reason: fmt.Sprintf("slurmctld's JSON (%d bytes) does not parse: %v", len(out), err)}
	}
	return doc, nil
}

func (doc jobsDoc) job(id uint32, node string) (ControllerJob, error) {
	var match []jsonJob
	for _, j := range doc.Jobs {
		if j.JobID != nil && *j.JobID == id {
			match = append(match, j)
		}
	}
	if len(match) == 0 {
		for _, e := range doc.Errors {
			switch {
			// ESLURM_INVALID_JOB_ID
			case e.ErrorNumber == 2017 || strings.Contains(e.Error, "Invalid job id") || strings.Contains(e.Description, "Invalid job id"):
				return ControllerJob{}, ErrJobUnknown
			case e.ErrorNumber == errnoConnection || e.ErrorNumber == errnoCtldConnection:
				return ControllerJob{}, &UnreachableError{Msg: strings.TrimSpace(e.Error + " " + e.Description)}
			}
		}
		if len(doc.Errors) > 0 {
			return ControllerJob{}, fmt.Errorf("slurmctld: %s %s", doc.Errors[0].Error, doc.Errors[0].Description)
		}
		return ControllerJob{}, ErrJobUnknown
	}
	if len(match) > 1 {
		return ControllerJob{}, ambiguous("%d records of job %d", len(match), id)
	}
	j := match[0]
	state, err := jsonState(j.JobState)
	if err != nil {
		return ControllerJob{}, fmt.Errorf("job %d: %w", id, err)
	}
	if j.UserID == nil {
		return ControllerJob{}, fmt.Errorf("job %d: no user_id in slurmctld's JSON", id)
	}
	cj := ControllerJob{ID: id, UID: *j.UserID, State: state, GPUs: []int{}}
	nodes, err := jsonResourceNodes(j.JobResources)
	if err != nil {
		return ControllerJob{}, fmt.Errorf("job %d: %w", id, err)
	}
	at := -1
	for i, n := range nodes {
		if n == node {
			if at >= 0 {
				return ControllerJob{}, ambiguous("node %s is twice in the allocation of job %d", node, id)
			}
			at = i
		}
	}
	if at < 0 {
		return cj, nil
	}
	cj.OnNode = true
	switch {
	case len(j.GresDetail) == 0:
		return cj, nil // no GRES at all
	case len(j.GresDetail) != len(nodes):
		return ControllerJob{}, ambiguous("job %d has %d gres_detail entries for %d nodes", id, len(j.GresDetail), len(nodes))
	}
	if cj.GPUs, cj.Shares, err = gresOfNode(j.GresDetail[at]); err != nil {
		return ControllerJob{}, fmt.Errorf("job %d: %w", id, err)
	}
	return cj, nil
}

func jsonState(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var flags []string
	if err := json.Unmarshal(raw, &flags); err != nil || len(flags) == 0 {
		return "", fmt.Errorf("job_state %s is neither a state nor a list of them", string(raw))
	}
	// The base state comes first; the rest are flags (COMPLETING, …).
	for _, f := range flags[1:] {
		if f == "COMPLETING" {
			return f, nil
		}
	}
	return flags[0], nil
}

// jsonResourceNodes returns the job's allocated nodes in allocation order:
// job_resources.nodes is a hostlist string before 24.05 and an object whose
// "list" it is since.
func jsonResourceNodes(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil // pending: no resources
	}
	var res struct {
		Nodes json.RawMessage `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("job_resources: %w", err)
	}
	var list string
	if err := json.Unmarshal(res.Nodes, &list); err != nil {
		var obj struct {
			List *string `json:"list"`
		}
		if err := json.Unmarshal(res.Nodes, &obj); err != nil || obj.List == nil {
			return nil, fmt.Errorf("job_resources.nodes %s is neither a host list nor an object with one", string(res.Nodes))
		}
		list = *obj.List
	}
	if list == "" {
		return nil, nil
	}
	nodes, err := ExpandHostlist(list)
	if err != nil {
		return nil, fmt.Errorf("job_resources nodes %q: %w", list, err)
	}
	return nodes, nil
}

// Share is a shared GRES a job holds on one device of it.
type Share struct {
	// Kind is "shard" or "mps".
	Kind string
	// Device is the shared GRES's device number on the node, as
	// slurmctld numbers it (Shares places it on a GPU).
	Device int
	// Count is how many shards (mps: percent of the GPU) the job holds on
	// the device; 0 where slurmctld does not say per device (22.05's
	// "shard:4(IDX:0-1)" names only the total).
	Count uint64
}

// gresOfNode reads one node's GRES string as Slurm prints it per node
// (gres_stepmgr.c, gres_ctld.c: gres_*_job_build_details): the GPU
// indices held whole, "gpu:2(IDX:0-1)", "gpu:a100:1(IDX:3)", and the
// shares, "shard:5(IDX:0)" (22.05), "shard:5(5/10,0/10,0/10,0/10)"
// (23.02 on: allocated/available per device). Every gpu, shard and mps
// entry must name its devices; one that does not (Slurm's "(CNT:n)",
// printed when it kept no device bitmap) cannot be placed and is an error
// naming it. Other GRES (nic, …) are skipped.
func gresOfNode(gres string) ([]int, []Share, error) {
	gpus := []int{}
	var shares []Share
	for _, item := range splitGres(gres) {
		name, _, _ := strings.Cut(item, ":")
		name, _, _ = strings.Cut(name, "(")
		kind, shared := shareKind(name)
		if name != "gpu" && !shared {
			continue
		}
		head, inner, ok := strings.Cut(item, "(")
		inner, tail, closed := strings.Cut(inner, ")")
		switch {
		case !ok:
			return nil, nil, fmt.Errorf("GRES %q names no devices", item)
		case !closed || tail != "":
			return nil, nil, fmt.Errorf("GRES %q: unterminated device list", item)
		}
		if list, isIDX := strings.CutPrefix(inner, "IDX:"); isIDX {
			if list == "N/A" {
				// A GRES of count 0 on this node.
				continue
			}
			g, err := gpulist.ParseIDX(list)
			if err != nil {
				return nil, nil, fmt.Errorf("GRES %q: %w", item, err)
			}
			if !shared {
				gpus = append(gpus, g...)
				continue
			}
			total, err := gresCount(head)
			if err != nil {
				return nil, nil, fmt.Errorf("GRES %q: %w", item, err)
			}
			for _, d := range g {
				sh := Share{Kind: kind, Device: d}
				if len(g) == 1 {
					sh.Count = total
				}
				shares = append(shares, sh)
			}
			continue
		}
		if !shared || strings.HasPrefix(inner, "CNT:") {
			return nil, nil, fmt.Errorf("GRES %q names no device indices", item)
		}
		s, err := perDeviceShares(kind, head, inner)
		if err != nil {
			return nil, nil, fmt.Errorf("GRES %q: %w", item, err)
		}
		shares = append(shares, s...)
	}
	// Several typed entries (gpu:a100, gpu:h100) each list their own.
	slices.Sort(gpus)
	if c := slices.Compact(slices.Clone(gpus)); len(c) != len(gpus) {
		return nil, nil, fmt.Errorf("GRES %q names a GPU index twice", gres)
	}
	seen := map[Share]bool{}
	for _, s := range shares {
		k := Share{Kind: s.Kind, Device: s.Device}
		if seen[k] {
			return nil, nil, fmt.Errorf("GRES %q names %s device %d twice", gres, s.Kind, s.Device)
		}
		seen[k] = true
	}
	return gpus, shares, nil
}

// gresCount is the count of "shard:a100:5": the last field.
func gresCount(head string) (uint64, error) {
	i := strings.LastIndexByte(head, ':')
	if i < 0 {
		return 0, fmt.Errorf("no count")
	}
	n, err := strconv.ParseUint(head[i+1:], 10, 63)
	if err != nil {
		return 0, fmt.Errorf("count %q: %w", head[i+1:], err)
	}
	return n, nil
}

// perDeviceShares reads "5/10,0/10,0/10,0/10", one allocated/available
// pair per device of the shared GRES: the job's shares are on the devices
// whose allocated count is not 0. The allocated counts must add up to the
// entry's count and none may exceed its device's: anything else is output
// not understood, and the job gets no GPU from it.
func perDeviceShares(kind, head, list string) ([]Share, error) {
	total, err := gresCount(head)
	if err != nil {
		return nil, err
	}
	parts := strings.Split(list, ",")
	if len(parts) > maxGPUs {
		return nil, fmt.Errorf("%d devices; gpufence names GPUs 0 to %d", len(parts), gpulist.MaxIndex)
	}
	var out []Share
	var sum uint64
	for d, p := range parts {
		a, b, ok := strings.Cut(p, "/")
		used, err1 := strconv.ParseUint(a, 10, 32)
		avail, err2 := strconv.ParseUint(b, 10, 32)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%q is not allocated/available", p)
		}
		if used > avail {
			return nil, fmt.Errorf("device %d: %d allocated of %d", d, used, avail)
		}
		if used == 0 {
			continue
		}
		sum += used
		out = append(out, Share{Kind: kind, Device: d, Count: used})
	}
	if sum != total {
		return nil, fmt.Errorf("the devices' allocated counts add up to %d, the entry says %d", sum, total)
	}
	return out, nil
}

// The lines `scontrol show job -d` prints around a job's per-node
// allocation (src/api/job_info.c): three spaces before a key of the job,
// five before a node group. A user's newline can fake any of them, so each
// must be found exactly once.
var (
	textJobLine  = regexp.MustCompile(`^JobId=(\d+) `)
	textGresLine = regexp.MustCompile(`^   JOB_GRES=`)
	textMinLine  = regexp.MustCompile(`^   MinCPUsNode=`)
	textNodeLine = regexp.MustCompile(`^     Nodes=(\S+) CPU_IDs=\S* Mem=\d+ GRES=(\S*) ?$`)
	anyNodes     = regexp.MustCompile(`(^|\s)Nodes=(\S+)`)
	textUID      = regexp.MustCompile(`^[^()]*\((\d+)\)$`)
)

// ParseJobText reads job id on node from `scontrol show job -d` text, for
// Slurm releases without JSON output. The job's per-node block must be the
// only one: exactly one JobId line, one JOB_GRES line followed by node
// lines and then one MinCPUsNode line, and exactly one line anywhere naming
// node in a Nodes= field. Anything else is ambiguous: a job user wrote it.
func ParseJobText(out string, id uint32, node string) (ControllerJob, error) {
	lines := strings.Split(out, "\n")
	jobAt, gresAt, minAt := -1, -1, -1
	var nodeLines []int
	for i, l := range lines {
		if m := textJobLine.FindStringSubmatch(l); m != nil {
			if jobAt >= 0 {
				return ControllerJob{}, ambiguous("more than one JobId line")
			}
			jobAt = i
			if m[1] != strconv.FormatUint(uint64(id), 10) {
				return ControllerJob{}, ambiguous("JobId=%s, asked for job %d", m[1], id)
			}
		}
		if textGresLine.MatchString(l) {
			if gresAt >= 0 {
				return ControllerJob{}, ambiguous("more than one JOB_GRES line")
			}
			gresAt = i
		}
		if textMinLine.MatchString(l) {
			if minAt >= 0 {
				return ControllerJob{}, ambiguous("more than one MinCPUsNode line")
			}
			minAt = i
		}
		for _, m := range anyNodes.FindAllStringSubmatch(l, -1) {
			match, err := hostMatches(m[2], node)
			if err != nil || match {
				nodeLines = append(nodeLines, i)
				break
			}
		}
	}
	if jobAt != 0 {
		return ControllerJob{}, ambiguous("no JobId line first")
	}
	state, err := textField(lines, "   JobState=", id)
	if err != nil {
		return ControllerJob{}, err
	}
	user, err := textField(lines, "   UserId=", id)
	if err != nil {
		return ControllerJob{}, err
	}
	m := textUID.FindStringSubmatch(user)
	if m == nil {
		return ControllerJob{}, fmt.Errorf("job %d: UserId=%s is not name(uid)", id, user)
	}
	uid, err := strconv.ParseUint(m[1], 10, 32)
	if err != nil {
		return ControllerJob{}, fmt.Errorf("job %d: UserId=%s: %w", id, user, err)
	}
	cj := ControllerJob{ID: id, UID: uint32(uid), State: state, GPUs: []int{}}
	if gresAt < 0 {
		if len(nodeLines) > 0 {
			return ControllerJob{}, ambiguous("a Nodes= line naming %s but no allocation block", node)
		}
		return cj, nil // no resources (pending)
	}
	if minAt < gresAt {
		return ControllerJob{}, ambiguous("no MinCPUsNode line after JOB_GRES")
	}
	if len(nodeLines) > 1 {
		return ControllerJob{}, ambiguous("%d lines name node %s in a Nodes= field", len(nodeLines), node)
	}
	for i := gresAt + 1; i < minAt; i++ {
		m := textNodeLine.FindStringSubmatch(lines[i])
		if m == nil {
			return ControllerJob{}, ambiguous("line %d inside the allocation block is not a node line", i+1)
		}
		match, err := hostMatches(m[1], node)
		if err != nil {
			return ControllerJob{}, fmt.Errorf("scontrol: %w", err)
		}
		if !match {
			continue
		}
		if len(nodeLines) != 1 || nodeLines[0] != i {
			return ControllerJob{}, ambiguous("node %s named outside its allocation block", node)
		}
		cj.OnNode = true
		if cj.GPUs, cj.Shares, err = gresOfNode(m[2]); err != nil {
			return ControllerJob{}, fmt.Errorf("job %d: %w", id, err)
		}
	}
	if !cj.OnNode && len(nodeLines) > 0 {
		return ControllerJob{}, ambiguous("node %s named outside its allocation block", node)
	}
	return cj, nil
}

// textField reads the first word after prefix on the one line Slurm prints
// it on; a second such line (a user's newline) is ambiguous.
func textField(lines []string, prefix string, id uint32) (string, error) {
	val, seen := "", false
	for _, l := range lines {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		if seen {
			return "", ambiguous("more than one %s line", strings.TrimSpace(prefix))
		}
		val, _, _ = strings.Cut(strings.TrimPrefix(l, prefix), " ")
		seen = true
	}
	if !seen {
		return "", fmt.Errorf("job %d: no %s in scontrol's output", id, strings.TrimSpace(prefix))
	}
	return val, nil
}

// splitGres splits "gpu:2(IDX:0-1),mps:100(0/100)" on commas outside
// parentheses.
func splitGres(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}
