// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/proto/agentclient"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/tests/cluster"
)

// holders is the attack of issue 18 (1): any local user opens TCP
// connections to the metrics port and holds them, reconnecting each one the
// agent closes, so that the agent's descriptors stay spent.
type holders struct {
	stop chan struct{}
	wg   sync.WaitGroup
	// open is how many connections the attacker holds now, peak the most
	// at once; dials counts connects, closed those the agent ended.
	open, peak, dials, closed, dialErrs atomic.Int64
}

func hold(addr string, n int) *holders {
	h := &holders{stop: make(chan struct{})}
	for range n {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			for {
				select {
				case <-h.stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", addr, 2*time.Second)
				if err != nil {
					h.dialErrs.Add(1)
				} else {
					h.dials.Add(1)
					if v := h.open.Add(1); v > h.peak.Load() {
						h.peak.Store(v)
					}
					ended := make(chan struct{})
					go func() {
						// Sends nothing; reads until the agent closes.
						c.Read(make([]byte, 1))
						close(ended)
					}()
					select {
					case <-ended:
						h.closed.Add(1)
					case <-h.stop:
					}
					c.Close()
					h.open.Add(-1)
				}
				// The attacker comes back at once, but not in a spin that
				// would only measure this machine's two cores.
				select {
				case <-h.stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
	}
	return h
}

func (h *holders) release() {
	close(h.stop)
	h.wg.Wait()
}

// fdTable is how many descriptors process pid has open, and the lowest
// number not in use.
func fdTable(pid int) (held, lowest int) {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1, -1
	}
	used := map[int]bool{}
	for _, e := range es {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			used[n] = true
		}
	}
	for used[lowest] {
		lowest++
	}
	return len(es), lowest
}

// fdCount is how many descriptors process pid has open.
func fdCount(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(es)
}

// TestPrivilegedAttackMetricsExhaustion: issue 18's first attack on the
// shipped default (metrics on 127.0.0.1:9945, no web_config), against a
// real agent with an open-files limit of 256 and the plugin configured
// failure=open (the setting under which exhaustion used to open GPUs).
// The attacker holds twice the agent's limit in connections to the
// metrics port. Meanwhile real requests on the plugin socket are all
// answered, real srun steps run isolated, the agent's descriptors stay
// below its limit; within seconds of the holders leaving a step works; no
// step ever ran without isolation; the connections shed are counted and
// logged. Before it, the default endpoint serves no job or user label to
// an unauthenticated scraper while a job holds a GPU (attack 5).
func TestPrivilegedAttackMetricsExhaustion(t *testing.T) {
	st := get(t)
	const nofile = 256
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Fatalf("no prlimit (util-linux): %v", err)
	}
	line := strings.Join([]string{"required", st.plugin, "socket=" + st.sock, "timeout=2", "failure=open", "spool=" + st.spool()}, " ")
	if err := st.c.WritePlugstack([]string{line}); err != nil {
		t.Fatal(err)
	}
	defer st.c.WritePlugstack([]string{st.plugstackLine()})
	if err := st.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	args, err := st.agentArgs(agentOpts{openMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	auditFile := st.auditFiles[len(st.auditFiles)-1]
	p, err := st.c.StartAgent(st.ctx, prlimit, append([]string{fmt.Sprintf("--nofile=%d:%d", nofile, nofile), st.gpufence}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	st.agent = p
	defer func() {
		if err := st.agent.Stop(); err != nil {
			t.Errorf("stop the attacked agent: %v", err)
		}
		if err := st.startAgent(); err != nil {
			t.Errorf("restart the suite's agent: %v", err)
		}
	}()
	// prlimit execs the agent: the listener is p's own pid.
	if err := cluster.WaitListener(st.sock, p.PID, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	limits, _ := os.ReadFile(fmt.Sprintf("/proc/%d/limits", p.PID))
	if !regexp.MustCompile(fmt.Sprintf(`Max open files\s+%d\s+%d`, nofile, nofile)).Match(limits) {
		t.Fatalf("agent pid %d does not run with an open-files limit of %d:\n%s", p.PID, nofile, limits)
	}
	agentLog := st.c.LogPath(filepath.Base(prlimit) + ".log")
	spoolBefore, _ := os.ReadFile(st.spool())

	// Attack 5 on the default: a job holds a GPU, an unauthenticated
	// scraper sees that one is held, not which job or whose.
	t.Run("no job or user label unauthenticated", func(t *testing.T) {
		release := st.hold(t, 1)
		defer release()
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, body, err := st.scrape("/metrics", false)
			if err != nil || code != http.StatusOK {
				t.Fatalf("unauthenticated scrape: %d %v", code, err)
			}
			if strings.Contains(body, "job_id=") || strings.Contains(body, "user=") || strings.Contains(body, "slurm_gpu=") ||
				strings.Contains(body, "UUID=") || strings.Contains(body, "\nprocess_open_fds") {
				t.Fatalf("the default endpoint names jobs, users, GPUs or the agent's fds to an unauthenticated scraper:\n%s", grepLines(body, "job_id=|user=|slurm_gpu=|UUID=|process_open_fds"))
			}
			if regexp.MustCompile(`(?m)^gpufence_gpus_allocated [1-9]`).MatchString(body) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gpufence_gpus_allocated never counted the held GPU:\n%s", grepLines(body, "gpufence_gpus_allocated"))
			}
			time.Sleep(250 * time.Millisecond)
		}
	})

	step := func(what string) {
		t.Helper()
		t0 := time.Now()
		rep, r := st.srun(t, nil, "--gres=gpu:1")
		if r.Code != 0 {
			t.Errorf("%s: srun failed after %s: %s", what, time.Since(t0).Round(time.Millisecond), r)
			return
		}
		if strings.Contains(r.Stderr, "WITHOUT GPU isolation") {
			t.Errorf("%s: the step FAILED OPEN:\n%s", what, r.Stderr)
		}
		st.expectGPUs(t, rep, gpusOf(t, rep, "SLURM_STEP_GPUS"))
		t.Logf("%s: step isolated in %s", what, time.Since(t0).Round(time.Millisecond))
	}
	step("before the attack")

	var peakFDs atomic.Int64
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := int64(fdCount(p.PID)); n > peakFDs.Load() {
				peakFDs.Store(n)
			}
			select {
			case <-sampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	// Real protobuf on the plugin socket throughout the attack: a
	// StepStart as slurmstepd sends it. The test process is in no step's
	// cgroup, so the agent's answer is a refusal naming it; what counts is
	// that an answer comes.
	var answered, unanswered atomic.Int64
	var worst atomic.Int64
	var firstFail atomic.Value
	asking := make(chan struct{})
	asked := make(chan struct{})
	go func() {
		defer close(asked)
		for {
			t0 := time.Now()
			_, err := agentclient.Call(st.sock, &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 4000000018, StepId: 0, Uid: 1000}}}, 5*time.Second)
			if d := int64(time.Since(t0)); d > worst.Load() {
				worst.Store(d)
			}
			if err == nil || errors.Is(err, agentclient.ErrAgent) {
				answered.Add(1)
			} else {
				unanswered.Add(1)
				firstFail.CompareAndSwap(nil, err.Error())
			}
			select {
			case <-asking:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()

	h := hold(st.metricsAddr, 2*nofile)
	attackStart := time.Now()
	// The attack runs a while before the first step and keeps running
	// through two: the old agent lost its socket within the first second.
	time.Sleep(3 * time.Second)
	step("during the attack (1)")
	step("during the attack (2)")
	attackFor := time.Since(attackStart)
	h.release()
	released := time.Now()
	t0 := time.Now()
	var recovered time.Duration
	for {
		_, err := agentclient.Call(st.sock, &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 4000000018, Uid: 1000}}}, 5*time.Second)
		if err == nil || errors.Is(err, agentclient.ErrAgent) {
			recovered = time.Since(t0)
			break
		}
		if time.Since(t0) > 10*time.Second {
			t.Errorf("the plugin socket does not answer 10s after the holders left: %v", err)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	step("after the holders left")
	stepAfter := time.Since(released)
	close(asking)
	<-asked
	close(sampling)
	<-sampled

	t.Logf("attack: %d holders for %s, %d connects (%d ended by the agent, %d refused), at most %d held at once; agent fds peaked at %d of %d",
		2*nofile, attackFor.Round(time.Millisecond), h.dials.Load(), h.closed.Load(), h.dialErrs.Load(), h.peak.Load(), peakFDs.Load(), nofile)
	t.Logf("plugin socket: %d requests answered, %d not (first: %v), slowest %s; answered %s and a step isolated %s after the holders left",
		answered.Load(), unanswered.Load(), firstFail.Load(), time.Duration(worst.Load()).Round(time.Millisecond), recovered.Round(time.Millisecond), stepAfter.Round(time.Millisecond))
	if unanswered.Load() != 0 {
		t.Errorf("%d plugin requests got no answer during the attack (first: %v)", unanswered.Load(), firstFail.Load())
	}
	if h.peak.Load() <= int64(nofile)/4 && h.dials.Load() < int64(4*nofile) {
		t.Errorf("the attack never came near the limit: %d connects, at most %d held", h.dials.Load(), h.peak.Load())
	}
	if peakFDs.Load() >= nofile {
		t.Errorf("the agent's descriptors reached its limit (%d of %d)", peakFDs.Load(), nofile)
	}
	if recovered > 5*time.Second || stepAfter > 20*time.Second {
		t.Errorf("recovery too slow: plugin answered after %s, a step worked after %s", recovered, stepAfter)
	}

	// Counted and logged, not silent.
	code, body, err := st.scrape("/metrics", false)
	if err != nil || code != http.StatusOK {
		t.Fatalf("scrape after the attack: %d %v", code, err)
	}
	shed := metricValue(body, "gpufence_metrics_connections_shed_total")
	t.Logf("counted: gpufence_metrics_connections_shed_total %v; %s", shed, grepLines(body, `^gpufence_accept_errors_total\{.*\} [1-9]`))
	if shed < 1 {
		t.Errorf("no shed connection counted: %s", grepLines(body, "gpufence_metrics_connections_shed_total|gpufence_accept_errors_total"))
	}
	logb, _ := os.ReadFile(agentLog)
	if !strings.Contains(string(logb), "connections shed") {
		t.Errorf("the agent's log (%s) does not say it shed connections", agentLog)
	}
	if code, body, err := st.scrape("/healthz", false); err != nil || code != http.StatusOK {
		t.Errorf("/healthz after the attack: %d %q %v", code, body, err)
	}

	// No step ever failed open: nothing new in the plugin's spool, no
	// step_unfiltered record.
	if b, _ := os.ReadFile(st.spool()); len(b) > len(spoolBefore) {
		t.Errorf("the plugin spooled unfiltered steps during the attack:\n%s", b[len(spoolBefore):])
	}
	for _, r := range readAudit(t, auditFile) {
		if r.Event == audit.EventStepUnfiltered {
			t.Errorf("step ran without isolation: %+v", r)
		}
	}
}

// TestPrivilegedAttackMetricsLeakAuthenticated: with metrics.web_config
// (basic auth, a bcrypt hash of this run's password) the per-job series
// reach only the scraper with the password: none, a wrong one or an unknown
// user get 401 and no series; the right one sees the job and its user.
func TestPrivilegedAttackMetricsLeakAuthenticated(t *testing.T) {
	st := get(t)
	r := st.c.Run(st.ctx, user, "sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 120")
	mustOK(t, r)
	job := strings.TrimSpace(r.Stdout)
	defer func() {
		st.c.Run(st.ctx, "", "scancel", job)
		st.c.WaitJob(st.ctx, job)
	}()
	gpu := jobGPU(t, st, job)
	for _, tc := range []struct {
		name     string
		user, pw string
	}{
		{"no credentials", "", ""},
		{"wrong password", st.metricsUser, "not-" + st.metricsPassword},
		{"unknown user", "root", st.metricsPassword},
	} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+st.metricsAddr+"/metrics", nil)
		if tc.user != "" {
			req.SetBasicAuth(tc.user, tc.pw)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(b), "gpufence_") {
			t.Errorf("%s: %d, want 401 and no series:\n%s", tc.name, resp.StatusCode, b)
		}
	}
	// Labels in the exposition's (sorted) order; slurm_gpu is Slurm's index.
	want := regexp.MustCompile(`gpufence_job_gpu_allocated\{[^}]*job_id="` + regexp.QuoteMeta(job) + `",[^}]*slurm_gpu="` + strconv.Itoa(gpu) + `",user="` + user + `"\}`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body, err := st.scrape("/metrics", true)
		if err != nil || code != http.StatusOK {
			t.Fatalf("authenticated scrape: %d %v", code, err)
		}
		if want.MatchString(body) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the authenticated scrape has no series for job %s of %s:\n%s", job, user, grepLines(body, "gpufence_job_gpu_allocated"))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// metricValue is the value of the unlabelled series name in an exposition.
func metricValue(body, name string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// grepLines are the lines of s that match the regular expression re.
func grepLines(s, re string) string {
	rx := regexp.MustCompile(re)
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if rx.MatchString(l) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// nofileLimits reads process pid's soft and hard open-files limits.
func nofileLimits(pid int) (soft, hard string, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return "", "", err
	}
	m := regexp.MustCompile(`Max open files\s+(\S+)\s+(\S+)`).FindSubmatch(b)
	if m == nil {
		return "", "", fmt.Errorf("no open-files line in /proc/%d/limits", pid)
	}
	return string(m[1]), string(m[2]), nil
}

func setNofile(pid int, soft, hard string) error {
	if out, err := exec.Command("prlimit", "--pid", strconv.Itoa(pid), "--nofile="+soft+":"+hard).CombinedOutput(); err != nil {
		return fmt.Errorf("prlimit --pid %d --nofile=%s:%s: %v %s", pid, soft, hard, err, out)
	}
	return nil
}

// TestPrivilegedPluginSocketSurvivesEMFILE: the agent's descriptor table
// is made full for real (its soft open-files limit set below the
// descriptors it holds, with prlimit --pid), then freed. Meanwhile
// /healthz, asked over a connection opened before, fails (the systemd
// watchdog runs the same check, so systemd would restart an agent that
// stayed so); a StepStart sent to the socket meets accept4's EMFILE, which
// is logged and counted while the loop carries on; and the request is
// answered once descriptors are free, /healthz says ok, a step runs. The
// old loop returned on the first EMFILE: the request was never answered,
// nothing was logged, and /healthz kept saying ok.
func TestPrivilegedPluginSocketSurvivesEMFILE(t *testing.T) {
	st := get(t)
	pid := st.agent.PID
	soft, hard, err := nofileLimits(pid)
	if err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := setNofile(pid, soft, hard); err != nil {
				t.Error(err)
			}
		}
	}
	defer restore()
	// One keep-alive connection to the endpoint, opened while descriptors
	// are free, carries the health checks below.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1}}
	healthz := func() (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+st.metricsAddr+"/healthz", nil)
		req.SetBasicAuth(st.metricsUser, st.metricsPassword)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("/healthz: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := healthz(); code != http.StatusOK {
		t.Fatalf("/healthz before: %d %q", code, body)
	}
	logPath := st.c.LogPath(filepath.Base(st.gpufence) + ".log")
	logBefore, _ := os.ReadFile(logPath)

	// A new descriptor takes the lowest free number, and the limit bounds
	// that number: set to the lowest free one, every open fails.
	held, lowest := fdTable(pid)
	full := strconv.Itoa(lowest)
	// Only the soft limit: raising a hard limit again needs
	// CAP_SYS_RESOURCE, which a test machine may not grant.
	if err := setNofile(pid, full, hard); err != nil {
		t.Fatal(err)
	}
	filled := time.Now()
	t.Logf("agent pid %d holds %d descriptors, the lowest free is %d; soft open-files limit set to %s (was %s:%s)", pid, held, lowest, full, soft, hard)
	type answer struct {
		err error
		at  time.Time
	}
	answered := make(chan answer, 1)
	go func() {
		_, err := agentclient.Call(st.sock, &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 4000000019, Uid: 1000}}}, 20*time.Second)
		answered <- answer{err, time.Now()}
	}()
	// 503 from the probe; or 500, when exporter-toolkit cannot reread the
	// web configuration for want of a descriptor: a failure either way.
	code, body := healthz()
	if code != http.StatusServiceUnavailable && code != http.StatusInternalServerError {
		t.Errorf("/healthz with the descriptor table full: %d %q, want a failure", code, body)
	}
	t.Logf("/healthz with the table full: %d %s", code, strings.TrimSpace(body))
	// The failing accept shows in the log (at most every 10 s, so once).
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		if l := grepLines(string(b[len(logBefore):]), `accept failed; retrying.*listener=plugin.*reason=EMFILE`); l != "" {
			t.Logf("agent log: %s", l)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 'accept failed' line for the plugin socket in %s 10s after its table filled:\n%s", logPath, tailLines(string(b[len(logBefore):]), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	restore()
	freed := time.Now()
	// The request that met EMFILE gets an answer: a refusal naming what
	// failed while descriptors were short, or the usual one after.
	select {
	case a := <-answered:
		if a.err != nil && !errors.Is(a.err, agentclient.ErrAgent) {
			t.Fatalf("the request sent with the table full got no answer: %v", a.err)
		}
		t.Logf("the request sent with the table full was answered %s after it filled (descriptors freed after %s): %v",
			a.at.Sub(filled).Round(time.Millisecond), freed.Sub(filled).Round(time.Millisecond), a.err)
	case <-time.After(15 * time.Second):
		t.Fatal("the request sent with the table full was not answered 15s after descriptors were free: the socket stopped serving")
	}
	// And the socket serves on: the old loop had returned for good.
	t0 := time.Now()
	if _, err := agentclient.Call(st.sock, &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 4000000019, Uid: 1000}}}, 5*time.Second); err != nil && !errors.Is(err, agentclient.ErrAgent) {
		t.Errorf("a request after descriptors were free: %v", err)
	} else {
		t.Logf("a request after descriptors were free answered in %s", time.Since(t0).Round(time.Millisecond))
	}
	if code, body := healthz(); code != http.StatusOK {
		t.Errorf("/healthz after: %d %q", code, body)
	}
	code, body, err = st.scrape("/metrics", true)
	if err != nil || code != http.StatusOK {
		t.Fatalf("scrape: %d %v", code, err)
	}
	m := regexp.MustCompile(`(?m)^gpufence_accept_errors_total\{listener="plugin",reason="EMFILE"\} (\S+)$`).FindStringSubmatch(body)
	if m == nil || m[1] == "0" {
		t.Errorf("plugin EMFILE not counted: %s", grepLines(body, "gpufence_accept_errors_total"))
	} else {
		t.Logf("gpufence_accept_errors_total{listener=\"plugin\",reason=\"EMFILE\"} %s", m[1])
	}
	b, _ := os.ReadFile(logPath)
	if !strings.Contains(string(b[len(logBefore):]), "accepting again") {
		t.Errorf("the agent did not log that it accepts again")
	}
	rep, r := st.srun(t, nil, "--gres=gpu:1")
	mustOK(t, r)
	st.expectGPUs(t, rep, gpusOf(t, rep, "SLURM_STEP_GPUS"))
}

// TestPrivilegedHealthzSocketActivated: under socket activation the agent's
// health check exchanges a frame with systemd's socket, the one it serves
// (not the configured path, which need not exist).
func TestPrivilegedHealthzSocketActivated(t *testing.T) {
	st := get(t)
	// A step first, so that Slurm's system cgroup exists as in any suite
	// run (the final checks count its exempt entry).
	_, r := st.srun(t, nil, "--gres=gpu:1")
	mustOK(t, r)
	if err := st.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := st.startAgent(); err != nil {
			t.Errorf("restart the suite's agent: %v", err)
		}
	}()
	sockPath := st.sock + ".activated"
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sockPath, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(sockPath)
	os.Chmod(sockPath, 0o600)
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	// The file stays, as systemd's does while its socket unit runs.
	ln.SetUnlinkOnClose(false)
	ln.Close()
	a := st.startActivated(t, f)
	f.Close()
	defer a.kill()
	if _, err := os.Stat(st.sock); err == nil {
		t.Fatalf("%s exists: the check below would not tell the activated socket from it", st.sock)
	}
	code, body, err := st.scrape("/healthz", true)
	if err != nil || code != http.StatusOK {
		t.Errorf("/healthz of a socket-activated agent: %d %q %v", code, body, err)
	}
}
