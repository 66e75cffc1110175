// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/gpufence/gpufence/agent/gpulist"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// metricsSetup picks, once per suite, the metrics endpoint every agent start
// listens on (a free port: parallel suites on one machine must not share
// one), the dcgm-exporter job mapping directory, and the web configuration
// (basic auth, a password of this run's own) that admits the suite's
// scrapers to the per-job series.
func (st *suite) metricsSetup() error {
	if st.metricsAddr != "" {
		return nil
	}
	addr, err := freeAddr()
	if err != nil {
		return fmt.Errorf("metrics port: %w", err)
	}
	pw := make([]byte, 16)
	if _, err := rand.Read(pw); err != nil {
		return err
	}
	st.metricsUser, st.metricsPassword = "prometheus", hex.EncodeToString(pw)
	hash, err := bcrypt.GenerateFromPassword([]byte(st.metricsPassword), bcrypt.MinCost)
	if err != nil {
		return err
	}
	st.webConfig = filepath.Join(st.c.Root(), "etc", "metrics-web.yaml")
	if err := os.WriteFile(st.webConfig, []byte(fmt.Sprintf("basic_auth_users:\n  %s: %s\n", st.metricsUser, hash)), 0o600); err != nil {
		return err
	}
	st.metricsAddr = addr
	st.jobMapDir = filepath.Join(st.c.Root(), "run", "dcgm-job-mapping")
	return nil
}

// scrape GETs path from the agent's endpoint, with the suite's basic-auth
// credentials when auth is set.
func (st *suite) scrape(path string, auth bool) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+st.metricsAddr+path, nil)
	if err != nil {
		return 0, "", err
	}
	if auth {
		req.SetBasicAuth(st.metricsUser, st.metricsPassword)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// promServer is a real Prometheus server (Debian's package) scraping the
// suite's agent every second, with its own configuration and storage.
type promServer struct {
	url string
	cmd *exec.Cmd
	log string
}

func startPrometheus(t *testing.T, target, user, password string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("no prometheus binary (Debian package prometheus; tests/deps.sh installs it): %v", err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	// basic_auth as docs/metrics.md tells operators to scrape with.
	conf := fmt.Sprintf("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: gpufence\n    basic_auth:\n      username: %q\n      password: %q\n    static_configs:\n      - targets: [%q]\n", user, password, target)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p := &promServer{url: "http://" + addr, log: filepath.Join(dir, "prometheus.log")}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	exited := make(chan struct{})
	go func() { p.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// By the PID we started, never by name.
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(p.log)
			t.Fatalf("prometheus exited at start:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(p.log)
			t.Fatalf("prometheus not ready after 30s: %v\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type promSample struct {
	Metric map[string]string
	Value  float64
}

// query runs an instant query through Prometheus's HTTP API.
func (p *promServer) query(t *testing.T, q string) []promSample {
	t.Helper()
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string
		Error  string
		Data   struct {
			ResultType string
			Result     []struct {
				Metric map[string]string
				Value  [2]any
			}
		}
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Status != "success" || r.Data.ResultType != "vector" {
		t.Fatalf("query %q: %v %s", q, err, body)
	}
	var out []promSample
	for _, s := range r.Data.Result {
		str, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			t.Fatalf("query %q: value %v", q, s.Value)
		}
		out = append(out, promSample{s.Metric, v})
	}
	return out
}

// waitQuery polls q until ok accepts the result, or fails after timeout.
func (p *promServer) waitQuery(t *testing.T, q string, timeout time.Duration, what string, ok func([]promSample) bool) []promSample {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := p.query(t, q)
		if ok(got) {
			return got
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(p.log)
			t.Fatalf("%s: %s gave %v after %s\nprometheus log:\n%s", what, q, got, timeout, b)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestPrivilegedMetrics: a real Prometheus scrapes the agent and sees a
// job's GPU series appear while it runs and go when it ends, counts the
// job's denied opens, and dcgm-exporter's mapping file for the job's GPU
// names the job exactly while it runs.
func TestPrivilegedMetrics(t *testing.T) {
	st := get(t)
	t0 := time.Now()
	prom := startPrometheus(t, st.metricsAddr, st.metricsUser, st.metricsPassword)
	prom.waitQuery(t, `up{job="gpufence"}`, 20*time.Second, "agent scraped", func(s []promSample) bool { return len(s) == 1 && s[0].Value == 1 })
	if s := prom.query(t, `gpufence_build_info`); len(s) != 1 || !strings.HasPrefix(s[0].Metric["goversion"], "go") {
		t.Errorf("gpufence_build_info: %v", s)
	}
	denied := func() float64 {
		s := prom.query(t, `gpufence_gpu_access_total{decision="denied"}`)
		if len(s) != 1 {
			t.Fatalf("gpufence_gpu_access_total{decision=denied}: %v", s)
		}
		return s[0].Value
	}
	before := denied()

	marker := filepath.Join(st.c.Root(), "work", fmt.Sprintf("metrics-%d", time.Now().UnixNano()))
	r := st.c.Run(st.ctx, user, "sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap",
		fmt.Sprintf("touch %s; %s %s; sleep 60", marker, st.open, strings.Join(st.c.DevPaths(), " ")))
	mustOK(t, r)
	job := strings.TrimSpace(r.Stdout)
	ended := false
	defer func() {
		if !ended {
			st.c.Run(st.ctx, "", "scancel", job)
			st.c.WaitJob(st.ctx, job)
		}
	}()
	gpu := jobGPU(t, st, job)

	// The job's series: job, user and GPU, while the job runs.
	sel := fmt.Sprintf(`gpufence_job_gpu_allocated{job_id=%q}`, job)
	got := prom.waitQuery(t, sel, 20*time.Second, "job series appears", func(s []promSample) bool { return len(s) > 0 })
	t.Logf("job %s's series in Prometheus %s after the test began", job, time.Since(t0).Round(time.Millisecond))
	// Slurm's index is slurm_gpu; gpu, UUID and the rest of dcgm-exporter's
	// GPU labels are NVML's, which the fake GPUs lack: empty, so Prometheus
	// has none of them. Hostname is the agent's host, this one.
	host, _ := os.Hostname()
	if len(got) != 1 || got[0].Value != 1 || got[0].Metric["user"] != user || got[0].Metric["slurm_gpu"] != strconv.Itoa(gpu) ||
		got[0].Metric["Hostname"] != host {
		t.Errorf("%s = %v, want one series with user %s, slurm_gpu %d and Hostname %s", sel, got, user, gpu, host)
	}
	for _, l := range []string{"gpu", "UUID", "pci_bus_id", "device", "modelName"} {
		if v, ok := got[0].Metric[l]; len(got) == 1 && ok {
			t.Errorf("%s has %s=%q without NVML", sel, l, v)
		}
	}
	// dcgm-exporter's file for that GPU (no NVML here: named by the device
	// minor, which is the index for the fake GPUs) names the job.
	mapFile := filepath.Join(st.jobMapDir, strconv.Itoa(gpu))
	if b, err := os.ReadFile(mapFile); err != nil || string(b) != job+"\n" {
		t.Errorf("dcgm mapping file %s: %q %v, want %q", mapFile, b, err, job+"\n")
	}
	// The batch step probes every GPU: three of them are denied.
	prom.waitQuery(t, `gpufence_gpu_access_total{decision="denied"}`, 20*time.Second, "denials counted", func(s []promSample) bool {
		return len(s) == 1 && s[0].Value >= before+3
	})
	prom.waitQuery(t, `gpufence_requests_total{type="step_start",result="ok"} > 0`, 10*time.Second, "step_start requests counted",
		func(s []promSample) bool { return len(s) == 1 })
	prom.waitQuery(t, `gpufence_policies{kind="step"} > 0`, 10*time.Second, "step policies", func(s []promSample) bool { return len(s) == 1 })

	mustOK(t, st.c.Run(st.ctx, "", "scancel", job))
	if _, err := st.c.WaitJob(st.ctx, job); err != nil {
		t.Fatal(err)
	}
	ended = true
	// Gone at the next scrape: Prometheus marks a vanished series stale.
	prom.waitQuery(t, sel, 20*time.Second, "job series disappears", func(s []promSample) bool { return len(s) == 0 })
	t.Logf("job %s's series gone from Prometheus %s after the test began", job, time.Since(t0).Round(time.Millisecond))
	if _, err := os.Stat(mapFile); !os.IsNotExist(err) {
		b, _ := os.ReadFile(mapFile)
		t.Errorf("dcgm mapping file %s still there after the job ended: %q %v", mapFile, b, err)
	}
	if code, body, err := st.scrape("/healthz", true); err != nil || code != 200 {
		t.Errorf("/healthz: %d %q %v", code, body, err)
	}
}

// jobGPU is the one GPU slurmctld gave a running job on this node.
func jobGPU(t *testing.T, st *suite, job string) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d := st.c.Run(st.ctx, "", "scontrol", "show", "job", "-d", job)
		if _, rest, ok := strings.Cut(d.Stdout, "(IDX:"); ok && strings.Contains(d.Stdout, "JobState=RUNNING") {
			list, _, _ := strings.Cut(rest, ")")
			gpus, err := gpulist.ParseIDX(list)
			if err != nil || len(gpus) != 1 {
				t.Fatalf("job %s GRES index %q: %v", job, list, err)
			}
			return gpus[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s not running with a GPU after 20s:\n%s", job, d.Stdout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
