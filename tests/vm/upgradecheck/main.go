// SPDX-License-Identifier: Apache-2.0

// Command upgradecheck is the judge of the VM upgrade test
// (tests/vm/upgrade-node.sh), run inside the VM:
//
//	upgradecheck ping -socket PATH -until FILE -interval 20ms > pings
//	upgradecheck check -audit audit.jsonl -probe probe.out -probe-job N -probe-gpus 0 \
//	    -burst DIR -burst-job M -burst-gpus 1-2 -pings pings -window upgrade:T0:T1 ...
//
// ping asks the agent, over its socket, a question every agent answers
// without touching its state (a request of an unknown protocol version: the
// server refuses it with an error), and logs when each ping was sent and
// how long the answer took: across an agent restart the longest wait is
// how long the socket went unanswered.
//
// check prints the figures and exits 1 when any fails: a job's own GPU
// gave EPERM, a foreign GPU opened, a step failed, or the audit trail does
// not account for every access the probes made (records + their suppressed
// counts + access_suppressed summaries = attempts, per step, device and
// decision; docs/audit.md "Rate limit").
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/proto/wire"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: upgradecheck ping|check [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "ping":
		os.Exit(ping(os.Args[2:]))
	case "check":
		os.Exit(check(os.Args[2:], os.Stdout))
	}
	fmt.Fprintf(os.Stderr, "upgradecheck: unknown command %q (want ping or check)\n", os.Args[1])
	os.Exit(2)
}

// ping logs "SENT_UNIX LATENCY_S ok|error TEXT" per ping until the file
// -until exists.
func ping(args []string) int {
	fs := flag.NewFlagSet("ping", flag.ExitOnError)
	socket := fs.String("socket", "/run/gpufence/agent.sock", "the agent's socket")
	until := fs.String("until", "", "stop once this file exists (required)")
	interval := fs.Duration("interval", 20*time.Millisecond, "pause between pings")
	timeout := fs.Duration("timeout", 60*time.Second, "give up on one ping after this long")
	fs.Parse(args)
	if *until == "" {
		fmt.Fprintln(os.Stderr, "upgradecheck ping: -until is required")
		return 2
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for {
		if _, err := os.Stat(*until); err == nil {
			return 0
		}
		sent := time.Now()
		err := pingOnce(*socket, sent.Add(*timeout))
		lat := time.Since(sent)
		status := "ok"
		if err != nil {
			status = "error " + strings.ReplaceAll(err.Error(), "\n", " ")
		}
		fmt.Fprintf(out, "%d.%06d %.6f %s\n", sent.Unix(), sent.Nanosecond()/1000, lat.Seconds(), status)
		out.Flush()
		time.Sleep(*interval)
	}
}

// pingOnce sends a request no agent acts on and waits for its refusal:
// the answer proves an agent read the socket and replied.
func pingOnce(socket string, deadline time.Time) error {
	c, err := net.DialTimeout("unix", socket, time.Until(deadline))
	if err != nil {
		return err
	}
	conn := wire.NewConn(c)
	defer conn.Close()
	if err := conn.Write(&pb.Request{Version: pb.ProtocolVersion(9999)}, deadline); err != nil {
		return err
	}
	resp := &pb.Response{}
	if err := conn.Read(resp, deadline); err != nil {
		return err
	}
	if !strings.Contains(resp.GetError(), "protocol version") {
		return fmt.Errorf("unexpected answer %q", resp.GetError())
	}
	return nil
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func check(args []string, w io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	auditPath := fs.String("audit", "/var/log/gpufence/audit.jsonl", "the audit file")
	probePath := fs.String("probe", "", "the probe's output (gf-open -stamp: UNIX_NANOS /dev/nvidiaN RESULT lines)")
	probeJob := fs.Uint("probe-job", 0, "the probe's job id")
	probeStep := fs.String("probe-step", "batch", "the probe's step id")
	probeGPUs := fs.String("probe-gpus", "", "GPU indices Slurm gave the probe's job (scontrol show job -d IDX:), e.g. 0 or 1-2")
	burstJob := fs.Uint("burst-job", 0, "the job the bursts' steps ran in")
	burstGPUs := fs.String("burst-gpus", "", "GPU indices Slurm gave the burst job")
	burstN := fs.Int("burst-n", 100, "steps each burst launched")
	major := fs.Uint("major", 195, "char major of the fake GPUs (minor = index)")
	pingsPath := fs.String("pings", "", "the pinger's log")
	var bursts, windows multi
	fs.Var(&bursts, "burst", "a burst's folder: NAME.out (gf-open -env) and NAME.rc (RC START END) per step; repeatable")
	fs.Var(&windows, "window", "LABEL:START:END (Unix seconds) to report on; repeatable")
	fs.Parse(args)

	c := &checker{w: w}
	own, err := parseIndices(*probeGPUs)
	if err != nil || len(own) == 0 {
		fmt.Fprintf(w, "FAIL: -probe-gpus %q: %v\n", *probeGPUs, err)
		return 2
	}
	bg, err := parseIndices(*burstGPUs)
	if err != nil {
		fmt.Fprintf(w, "FAIL: -burst-gpus %q: %v\n", *burstGPUs, err)
		return 2
	}
	recs, err := readAudit(*auditPath)
	if err != nil {
		fmt.Fprintf(w, "FAIL: %v\n", err)
		return 2
	}
	books := account(recs, uint32(*major))
	fmt.Fprintf(w, "audit: %d records (%d access records, %d access_suppressed, %d audit_loss, %d agent_start)\n",
		len(recs), books.accessRecords, books.summaries, books.losses, books.starts)
	for _, r := range recs {
		if r.Event == "agent_start" {
			fmt.Fprintf(w, "  agent_start %s %s\n", r.Time.Format(time.RFC3339Nano), r.AgentVersion)
		}
	}
	c.expect(books.losses == 0, "audit_loss records for the audit file, ring buffer, queue or rate table: %d (want 0)", books.losses)
	if books.journaldLost > 0 {
		// A copy, not the record: the file has them (seq below), and the
		// loss is itself recorded. Reported, not judged.
		fmt.Fprintf(w, "WARN the journald copy lost %d records (journald did not take them within the sink's 1 s)\n", books.journaldLost)
	}
	c.expect(books.seqGaps == 0, "seq gaps in the audit file: %d over %d agent runs (want 0)", books.seqGaps, books.runs)
	c.expect(books.unattributed == 0, "GPU access counts without a job: %d %v (want 0)", books.unattributed, books.unattributedBy)

	var wins []window
	for _, s := range windows {
		win, err := parseWindow(s)
		if err != nil {
			fmt.Fprintf(w, "FAIL: -window %q: %v\n", s, err)
			return 2
		}
		wins = append(wins, win)
	}

	if *probePath != "" {
		p, err := readProbe(*probePath)
		if err != nil {
			fmt.Fprintf(w, "FAIL: %v\n", err)
			return 2
		}
		c.probe(p, own, uint32(*probeJob), *probeStep, books, wins)
	}
	for _, dir := range bursts {
		steps, err := readBurst(dir)
		if err != nil {
			fmt.Fprintf(w, "FAIL: %v\n", err)
			return 2
		}
		c.burst(filepath.Base(dir), steps, *burstN, bg, own, uint32(*burstJob), books, wins)
	}
	if *pingsPath != "" {
		pings, err := readPings(*pingsPath)
		if err != nil {
			fmt.Fprintf(w, "FAIL: %v\n", err)
			return 2
		}
		c.pings(pings, wins)
	}
	if c.failed {
		fmt.Fprintln(w, "check: FAIL")
		return 1
	}
	fmt.Fprintln(w, "check: PASS")
	return 0
}

type checker struct {
	w      io.Writer
	failed bool
}

// expect prints the figure, marked FAIL when ok is false.
func (c *checker) expect(ok bool, format string, a ...any) {
	mark := "ok  "
	if !ok {
		mark = "FAIL"
		c.failed = true
	}
	fmt.Fprintf(c.w, "%s %s\n", mark, fmt.Sprintf(format, a...))
}

// record is the part of an audit record the books need.
type record struct {
	Time         time.Time `json:"time"`
	Event        string    `json:"event"`
	Decision     string    `json:"decision"`
	JobID        uint32    `json:"job_id"`
	StepID       string    `json:"step_id"`
	AgentVersion string    `json:"agent_version"`
	Suppressed   uint64    `json:"suppressed"`
	Seq          uint64    `json:"seq"`
	Loss         *struct {
		QueueDropped uint64            `json:"queue_dropped"`
		RingbufLost  uint64            `json:"ringbuf_lost"`
		SinkFailed   map[string]uint64 `json:"sink_failed"`
		SinkDropped  map[string]uint64 `json:"sink_dropped"`
		RateFull     map[string]uint64 `json:"rate_full"`
	} `json:"loss"`
	Device *struct {
		Major uint32 `json:"major"`
		Minor uint32 `json:"minor"`
	} `json:"device"`
}

func readAudit(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, n, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// key is one line of the books: a step, a device, a decision.
type key struct {
	job      uint32
	step     string
	minor    uint32
	decision string
}

type books struct {
	counts                                   map[key]uint64
	accessRecords, summaries, losses, starts int
	unattributed                             uint64
	unattributedBy                           map[string]uint64
	// journaldLost: records only the journald copy lost; seqGaps: records
	// missing from the file, over runs agent runs (seq restarts at 1).
	journaldLost  uint64
	seqGaps, runs int
}

// account adds up the accesses the audit trail reports: a gpu_access
// record counts 1 + its suppressed, an access_suppressed summary its
// suppressed.
func account(recs []record, major uint32) books {
	b := books{counts: map[key]uint64{}, unattributedBy: map[string]uint64{}}
	var prev uint64
	for i, r := range recs {
		switch {
		case r.Seq == 1 || i == 0:
			b.runs++
		case r.Seq != prev+1:
			b.seqGaps++
		}
		prev = r.Seq
		var n uint64
		switch r.Event {
		case "gpu_access":
			n = 1 + r.Suppressed
			b.accessRecords++
		case "access_suppressed":
			n = r.Suppressed
			b.summaries++
		case "audit_loss":
			if journaldOnly(r) {
				for _, v := range r.Loss.SinkFailed {
					b.journaldLost += v
				}
				for _, v := range r.Loss.SinkDropped {
					b.journaldLost += v
				}
			} else {
				b.losses++
			}
			continue
		case "agent_start":
			b.starts++
			continue
		default:
			continue
		}
		if r.Device == nil || r.Device.Major != major {
			continue
		}
		if r.JobID == 0 {
			b.unattributed += n
			b.unattributedBy[fmt.Sprintf("%d:%d %s", r.Device.Major, r.Device.Minor, r.Decision)] += n
			continue
		}
		b.counts[key{r.JobID, r.StepID, r.Device.Minor, r.Decision}] += n
	}
	return b
}

// journaldOnly: an audit_loss that only the journald sink suffered.
func journaldOnly(r record) bool {
	l := r.Loss
	if l == nil || l.QueueDropped != 0 || l.RingbufLost != 0 || len(l.RateFull) != 0 {
		return false
	}
	for s, v := range l.SinkFailed {
		if s != "journald" && v != 0 {
			return false
		}
	}
	for s, v := range l.SinkDropped {
		if s != "journald" && v != 0 {
			return false
		}
	}
	return true
}

// attempt is one open the probe made.
type attempt struct {
	t      float64
	minor  uint32
	result string
}

// readProbe reads "UNIX_NANOS /dev/nvidiaN RESULT" lines; other lines
// (Slurm's own messages) are counted and shown, not judged.
func readProbe(path string) ([]attempt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []attempt
	other := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		a, ok := parseAttempt(sc.Text())
		if !ok {
			if other < 5 {
				fmt.Fprintf(os.Stderr, "probe: not an attempt: %q\n", sc.Text())
			}
			other++
			continue
		}
		out = append(out, a)
	}
	if other > 0 {
		fmt.Fprintf(os.Stderr, "probe: %d lines that are not attempts\n", other)
	}
	return out, sc.Err()
}

func parseAttempt(line string) (attempt, bool) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return attempt{}, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return attempt{}, false
	}
	t := float64(ns) / 1e9
	minor, ok := nvidiaMinor(f[1])
	if !ok {
		return attempt{}, false
	}
	return attempt{t: t, minor: minor, result: f[2]}, true
}

// nvidiaMinor: /dev/nvidiaN is the fake GPU of index and minor N.
func nvidiaMinor(path string) (uint32, bool) {
	s, ok := strings.CutPrefix(path, "/dev/nvidia")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

// decisionOf is what the filter decided for a result: ENXIO means the open
// passed the filter and reached the (absent) driver.
func decisionOf(result string) string {
	switch result {
	case "EPERM":
		return "denied"
	case "ENXIO", "OK":
		return "allowed"
	}
	return ""
}

func (c *checker) probe(p []attempt, own []int, job uint32, step string, b books, wins []window) {
	tally := map[key]uint64{}
	bad := map[string]int{}
	var first, last float64
	for i, a := range p {
		if i == 0 {
			first = a.t
		}
		last = a.t
		mine := contains(own, int(a.minor))
		switch {
		case mine && a.result != "ENXIO":
			bad[fmt.Sprintf("own GPU %d gave %s", a.minor, a.result)]++
		case !mine && a.result != "EPERM":
			bad[fmt.Sprintf("foreign GPU %d gave %s", a.minor, a.result)]++
		}
		if d := decisionOf(a.result); d != "" {
			tally[key{job, step, a.minor, d}]++
		}
	}
	fmt.Fprintf(c.w, "probe: job %d step %s, own GPUs %v: %d attempts over %.1f s\n", job, step, own, len(p), last-first)
	c.expect(len(p) > 0, "probe attempts: %d (want > 0)", len(p))
	ownEPERM, foreignOpen := 0, 0
	for _, a := range p {
		mine := contains(own, int(a.minor))
		if mine && a.result == "EPERM" {
			ownEPERM++
		}
		if !mine && a.result != "EPERM" {
			foreignOpen++
		}
	}
	c.expect(ownEPERM == 0, "EPERM on the probe's own GPU: %d (want 0)", ownEPERM)
	c.expect(foreignOpen == 0, "foreign GPU opens (anything but EPERM): %d (want 0)", foreignOpen)
	c.expect(len(bad) == 0, "other wrong results: %v", bad)
	c.books("probe", tally, b)
	for _, win := range wins {
		n, wrong := 0, 0
		for _, a := range p {
			if a.t >= win.start && a.t <= win.end {
				n++
				mine := contains(own, int(a.minor))
				if (mine && a.result != "ENXIO") || (!mine && a.result != "EPERM") {
					wrong++
				}
			}
		}
		c.expect(wrong == 0, "probe during %s (%.2f s): %d attempts, %d wrong", win.label, win.end-win.start, n, wrong)
	}
}

// books compares the attempts with what the audit trail accounts for.
func (c *checker) books(what string, tally map[key]uint64, b books) {
	keys := make([]key, 0, len(tally))
	for k := range tally {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].step != keys[j].step {
			return keys[i].step < keys[j].step
		}
		if keys[i].minor != keys[j].minor {
			return keys[i].minor < keys[j].minor
		}
		return keys[i].decision < keys[j].decision
	})
	var attempts, audited uint64
	mismatch := 0
	for _, k := range keys {
		attempts += tally[k]
		audited += b.counts[k]
		if tally[k] != b.counts[k] {
			mismatch++
			if mismatch <= 10 {
				fmt.Fprintf(c.w, "     %s job %d step %s GPU %d %s: %d attempts, %d in the audit trail\n",
					what, k.job, k.step, k.minor, k.decision, tally[k], b.counts[k])
			}
		}
	}
	// Per decision, for the report.
	for _, d := range []string{"denied", "allowed"} {
		var at, au uint64
		for _, k := range keys {
			if k.decision == d {
				at += tally[k]
				au += b.counts[k]
			}
		}
		c.expect(at == au, "%s %s: %d attempts, %d accounted in the audit trail (records + suppressed)", what, d, at, au)
	}
	c.expect(mismatch == 0, "%s: %d of %d (step, GPU, decision) keys differ", what, mismatch, len(keys))
}

// step is one srun of a burst.
type step struct {
	name       string
	gpu        bool
	rc         int
	start, end float64
	stepID     string
	results    map[uint32]string
}

func readBurst(dir string) ([]step, error) {
	rcs, err := filepath.Glob(filepath.Join(dir, "*.rc"))
	if err != nil {
		return nil, err
	}
	outs, _ := filepath.Glob(filepath.Join(dir, "*.out"))
	var steps []step
	for _, rc := range rcs {
		name := strings.TrimSuffix(filepath.Base(rc), ".rc")
		s := step{name: name, gpu: strings.HasPrefix(name, "gpu-"), results: map[uint32]string{}}
		b, err := os.ReadFile(rc)
		if err != nil {
			return nil, err
		}
		f := strings.Fields(string(b))
		if len(f) != 3 {
			return nil, fmt.Errorf("%s: %q, want RC START END", rc, b)
		}
		s.rc, err = strconv.Atoi(f[0])
		if err == nil {
			s.start, err = strconv.ParseFloat(f[1], 64)
		}
		if err == nil {
			s.end, err = strconv.ParseFloat(f[2], 64)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rc, err)
		}
		out, err := os.ReadFile(filepath.Join(dir, name+".out"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, "env SLURM_STEP_ID="); ok {
				s.stepID = v
			}
			fl := strings.Fields(line)
			if len(fl) == 2 {
				if m, ok := nvidiaMinor(fl[0]); ok {
					s.results[m] = fl[1]
				}
			}
		}
		steps = append(steps, s)
	}
	if len(steps) < len(outs) {
		return nil, fmt.Errorf("%s: %d outputs but %d exit codes: a step never ended", dir, len(outs), len(steps))
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i].start < steps[j].start })
	return steps, nil
}

func (c *checker) burst(label string, steps []step, want int, bg, probeGPUs []int, job uint32, b books, wins []window) {
	failed, foreign, wrong, gpuSteps := 0, 0, 0, 0
	var lats []float64
	tally := map[key]uint64{}
	var first, last float64
	for i, s := range steps {
		if i == 0 || s.start < first {
			first = s.start
		}
		if s.end > last {
			last = s.end
		}
		lats = append(lats, s.end-s.start)
		if s.rc != 0 {
			failed++
			if failed <= 5 {
				fmt.Fprintf(c.w, "     %s %s exited %d after %.2f s\n", label, s.name, s.rc, s.end-s.start)
			}
			continue
		}
		if s.gpu {
			gpuSteps++
		}
		opened := 0
		for m, r := range s.results {
			if r != "EPERM" && !contains(bg, int(m)) {
				foreign++
			}
			if r == "ENXIO" {
				opened++
			}
			if s.stepID == "" {
				wrong++
				continue
			}
			if d := decisionOf(r); d != "" {
				tally[key{job, s.stepID, m, d}]++
			}
		}
		// A GPU step holds one of the job's GPUs, a CPU-only one none.
		if (s.gpu && opened != 1) || (!s.gpu && opened != 0) || len(s.results) == 0 {
			wrong++
			if wrong <= 5 {
				fmt.Fprintf(c.w, "     %s %s (step %s): %v\n", label, s.name, s.stepID, s.results)
			}
		}
	}
	sort.Float64s(lats)
	med, max := 0.0, 0.0
	if len(lats) > 0 {
		med, max = lats[len(lats)/2], lats[len(lats)-1]
	}
	fmt.Fprintf(c.w, "%s: %d steps (%d GPU) in %.1f s; step latency median %.2f s, max %.2f s\n",
		label, len(steps), gpuSteps, last-first, med, max)
	c.expect(len(steps) == want, "%s steps that ended: %d (want %d)", label, len(steps), want)
	c.expect(failed == 0, "%s failed steps: %d of %d", label, failed, len(steps))
	c.expect(foreign == 0, "%s foreign GPU opens: %d (the probe's GPUs %v, the job's %v)", label, foreign, probeGPUs, bg)
	c.expect(wrong == 0, "%s steps with the wrong GPUs or no output: %d", label, wrong)
	c.books(label, tally, b)
	for _, win := range wins {
		during := 0
		for _, s := range steps {
			if s.start <= win.end && s.end >= win.start {
				during++
			}
		}
		if during > 0 {
			fmt.Fprintf(c.w, "     %s steps running or registering during %s: %d\n", label, win.label, during)
		}
	}
}

type pingResult struct {
	sent, lat float64
	err       string
}

func readPings(path string) ([]pingResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []pingResult
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.SplitN(sc.Text(), " ", 3)
		if len(fl) != 3 {
			return nil, fmt.Errorf("%s: bad line %q", path, sc.Text())
		}
		var p pingResult
		p.sent, err = strconv.ParseFloat(fl[0], 64)
		if err == nil {
			p.lat, err = strconv.ParseFloat(fl[1], 64)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if fl[2] != "ok" {
			p.err = fl[2]
		}
		out = append(out, p)
	}
	return out, sc.Err()
}

func (c *checker) pings(ps []pingResult, wins []window) {
	errs := 0
	for _, p := range ps {
		if p.err != "" {
			errs++
			if errs <= 3 {
				fmt.Fprintf(c.w, "     ping at %.3f: %s\n", p.sent, p.err)
			}
		}
	}
	c.expect(errs == 0, "pings of the agent's socket: %d, %d unanswered or refused (want 0)", len(ps), errs)
	for _, win := range wins {
		max, at := 0.0, 0.0
		for _, p := range ps {
			if p.sent+p.lat >= win.start && p.sent <= win.end && p.lat > max {
				max, at = p.lat, p.sent
			}
		}
		fmt.Fprintf(c.w, "     socket unanswered during %s: longest ping %.3f s (sent at %.3f)\n", win.label, max, at)
	}
}

type window struct {
	label      string
	start, end float64
}

func parseWindow(s string) (window, error) {
	f := strings.Split(s, ":")
	if len(f) != 3 {
		return window{}, errors.New("want LABEL:START:END")
	}
	a, err1 := strconv.ParseFloat(f[1], 64)
	b, err2 := strconv.ParseFloat(f[2], 64)
	if err := errors.Join(err1, err2); err != nil {
		return window{}, err
	}
	if b < a {
		return window{}, errors.New("END before START")
	}
	return window{f[0], a, b}, nil
}

// parseIndices reads Slurm's IDX list: "0", "1-2", "0,2-3".
func parseIndices(s string) ([]int, error) {
	var out []int
	if s == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, err
			}
		}
		if b < a || b-a > 1024 {
			return nil, fmt.Errorf("bad range %q", part)
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
	}
	return out, nil
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
