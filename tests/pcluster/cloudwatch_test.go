// SPDX-License-Identifier: Apache-2.0

package pcluster

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/crypto/bcrypt"
	"gopkg.in/yaml.v3"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/metrics"
)

// imds is a stand-in for EC2's instance metadata service that, like
// IMDSv2, answers metadata only to a request with a session token.
type imds struct {
	srv       *httptest.Server
	untokened atomic.Int32
}

func newIMDS(t *testing.T, values map[string]string) *imds {
	t.Helper()
	m := &imds{}
	const token = "tok-123"
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/latest/api/token" {
			if r.Method != http.MethodPut || r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
				http.Error(w, "bad token request", http.StatusBadRequest)
				return
			}
			w.Write([]byte(token))
			return
		}
		if r.Header.Get("X-aws-ec2-metadata-token") != token {
			m.untokened.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		v, ok := values[strings.TrimPrefix(r.URL.Path, "/latest/meta-data/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(v))
	}))
	t.Cleanup(m.srv.Close)
	return m
}

// cwRoot is a folder standing in for a ParallelCluster node's root: its
// cfnconfig, the package's CloudWatch files and agent.yaml, and a
// CloudWatch agent control script that records how it was called.
func cwRoot(t *testing.T, cluster string) string {
	t.Helper()
	root := t.TempDir()
	write(t, filepath.Join(root, "etc/parallelcluster/cfnconfig"), "stack_name=x\ncfn_cluster_name="+cluster+"\ncfn_node_type=ComputeFleet\n")
	src := "../../packaging/parallelcluster/cloudwatch"
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		write(t, filepath.Join(root, "usr/share/gpufence/cloudwatch", e.Name()), read(t, filepath.Join(src, e.Name())))
	}
	write(t, filepath.Join(root, "etc/gpufence/agent.yaml"), read(t, "../../packaging/agent.yaml"))
	ctl := filepath.Join(root, "opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl")
	write(t, ctl, "#!/bin/sh\necho \"$*\" >> \""+root+"/ctl.log\"\n")
	if err := os.Chmod(ctl, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// nodeStep runs one function of gpufence-node.sh with root as /.
func nodeStep(t *testing.T, root, endpoint string, extraEnv []string, step string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", "-c", `GPUFENCE_NODE_LIB=1 source "$0" && `+step, script)
	cmd.Env = append(os.Environ(), append(extraEnv, "GPUFENCE_ROOT="+root, "GPUFENCE_IMDS="+endpoint)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestCloudWatchNode(t *testing.T) {
	const iid = "i-0123456789abcdef0"
	m := newIMDS(t, map[string]string{"instance-id": iid})
	root := cwRoot(t, "gpu-prod")
	out, err := nodeStep(t, root, m.srv.URL, nil, "cloudwatch_node")
	if err != nil {
		t.Fatalf("cloudwatch_node: %v\n%s", err, out)
	}
	if n := m.untokened.Load(); n != 0 {
		t.Errorf("%d metadata requests without an IMDSv2 token", n)
	}
	prom := read(t, filepath.Join(root, "etc/gpufence/cloudwatch/prometheus.yaml"))
	if !strings.Contains(prom, `ClusterName: "gpu-prod"`) || !strings.Contains(prom, `instance_id: "`+iid+`"`) || strings.Contains(prom, "__") {
		t.Errorf("prometheus.yaml does not name the cluster and instance:\n%s", prom)
	}
	// The password the CloudWatch agent sends must pass the agent's own
	// web configuration, as the exporter toolkit reads it.
	pwPath := filepath.Join(root, "etc/gpufence/cloudwatch/metrics.password")
	webPath := filepath.Join(root, "etc/gpufence/metrics-web.yaml")
	for _, p := range []string{pwPath, webPath} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
	pw := read(t, pwPath)
	if len(pw) < 32 {
		t.Errorf("password of %d characters, want at least 32", len(pw))
	}
	if err := metrics.CheckWebConfig(webPath); err != nil {
		t.Fatalf("the web configuration written is not one the agent takes: %v", err)
	}
	var web struct {
		Users map[string]string `yaml:"basic_auth_users"`
	}
	if err := yaml.Unmarshal([]byte(read(t, webPath)), &web); err != nil {
		t.Fatal(err)
	}
	if err := bcrypt.CompareHashAndPassword([]byte(web.Users["cloudwatch"]), []byte(pw)); err != nil {
		t.Errorf("the hash for user cloudwatch does not match the password file: %v", err)
	}
	agentYAML := filepath.Join(root, "etc/gpufence/agent.yaml")
	cfg, err := config.Load(agentYAML, true)
	if err != nil {
		t.Fatalf("agent.yaml after the script: %v", err)
	}
	if cfg.Metrics.WebConfig != "/etc/gpufence/metrics-web.yaml" {
		t.Errorf("metrics.web_config = %q", cfg.Metrics.WebConfig)
	}
	wantCtl := "-a append-config -m ec2 -s -c file:" + root + "/usr/share/gpufence/cloudwatch/amazon-cloudwatch-agent.json"
	if got := strings.TrimSpace(read(t, filepath.Join(root, "ctl.log"))); got != wantCtl {
		t.Errorf("amazon-cloudwatch-agent-ctl called with\n %q, want\n %q", got, wantCtl)
	}

	// Again: the password is kept, agent.yaml keeps one metrics: key.
	out, err = nodeStep(t, root, m.srv.URL, nil, "cloudwatch_node")
	if err != nil {
		t.Fatalf("cloudwatch_node again: %v\n%s", err, out)
	}
	if read(t, pwPath) != pw {
		t.Error("a second run replaced the password")
	}
	if n := count(read(t, agentYAML), "metrics:"); n != 1 {
		t.Errorf("agent.yaml has %d metrics: keys after two runs", n)
	}
}

func TestCloudWatchNodeRefuses(t *testing.T) {
	cases := []struct {
		name, cluster, iid, agentYAML, want string
	}{
		{name: "hostile instance id", cluster: "gpu-prod", iid: `i-123"; touch /tmp/x; "`, want: "not a valid instance name"},
		{name: "hostile cluster name", cluster: `a/b&c`, iid: "i-0123456789abcdef0", want: "not a valid cluster name"},
		{name: "metrics section of the admin's", cluster: "gpu-prod", iid: "i-0123456789abcdef0",
			agentYAML: "metrics:\n  listen: 127.0.0.1:9945\n", want: "without web_config"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newIMDS(t, map[string]string{"instance-id": c.iid})
			root := cwRoot(t, c.cluster)
			if c.agentYAML != "" {
				write(t, filepath.Join(root, "etc/gpufence/agent.yaml"), c.agentYAML)
			}
			out, err := nodeStep(t, root, m.srv.URL, nil, "cloudwatch_node")
			if err == nil || !strings.Contains(out, c.want) {
				t.Fatalf("want a failure naming %q, got err=%v:\n%s", c.want, err, out)
			}
			if c.agentYAML != "" && read(t, filepath.Join(root, "etc/gpufence/agent.yaml")) != c.agentYAML {
				t.Error("agent.yaml changed although the script refused")
			}
			if _, err := os.Stat(filepath.Join(root, "ctl.log")); err == nil {
				t.Error("the CloudWatch agent was configured although the script refused")
			}
		})
	}
	t.Run("no IMDS", func(t *testing.T) {
		root := cwRoot(t, "gpu-prod")
		out, err := nodeStep(t, root, "http://127.0.0.1:1", nil, "cloudwatch_node")
		if err == nil || !strings.Contains(out, "no IMDSv2 token") {
			t.Fatalf("want an IMDS error, got err=%v:\n%s", err, out)
		}
	})
}

func TestCloudWatchCluster(t *testing.T) {
	m := newIMDS(t, map[string]string{"placement/region": "us-west-2"})
	root := cwRoot(t, "gpu-prod")
	// A stand-in for the aws CLI (no AWS here): it records its arguments
	// and keeps the file:// inputs it was given.
	bin := t.TempDir()
	calls := filepath.Join(bin, "calls")
	write(t, filepath.Join(bin, "aws"), `#!/bin/sh
echo "$*" >> "`+calls+`"
for a in "$@"; do case $a in file://*) cp "${a#file://}" "`+bin+`/";; esac; done
`)
	if err := os.Chmod(filepath.Join(bin, "aws"), 0o755); err != nil {
		t.Fatal(err)
	}
	const arn = "arn:aws:sns:us-west-2:123456789012:gpu-idle"
	path := []string{"PATH=" + bin + ":" + os.Getenv("PATH")}
	out, err := nodeStep(t, root, m.srv.URL, path, "cloudwatch_cluster "+arn)
	if err != nil {
		t.Fatalf("cloudwatch_cluster: %v\n%s", err, out)
	}
	got := strings.Split(strings.TrimSpace(read(t, calls)), "\n")
	if len(got) != 2 || !strings.HasPrefix(got[0], "--region us-west-2 cloudwatch put-dashboard --dashboard-name gpufence-gpu-prod --dashboard-body file://") ||
		!strings.HasPrefix(got[1], "--region us-west-2 cloudwatch put-metric-alarm --cli-input-json file://") {
		t.Fatalf("aws calls:\n%s", strings.Join(got, "\n"))
	}
	dash := read(t, filepath.Join(bin, "dashboard.json"))
	var body map[string]any
	if err := json.Unmarshal([]byte(dash), &body); err != nil {
		t.Fatalf("dashboard body: %v", err)
	}
	if strings.Contains(dash, "__") || !strings.Contains(dash, `"us-west-2"`) || !strings.Contains(dash, "gpu-prod") {
		t.Errorf("dashboard not filled in for gpu-prod in us-west-2:\n%s", dash)
	}
	var alarm struct {
		AlarmName    string
		AlarmActions []string
	}
	raw := read(t, filepath.Join(bin, "alarm.json"))
	if err := json.Unmarshal([]byte(raw), &alarm); err != nil {
		t.Fatalf("alarm input: %v", err)
	}
	if strings.Contains(raw, "__") || alarm.AlarmName != "gpufence-allocated-gpu-idle-1h-gpu-prod" || len(alarm.AlarmActions) != 1 || alarm.AlarmActions[0] != arn {
		t.Errorf("alarm not filled in: name %q, actions %q", alarm.AlarmName, alarm.AlarmActions)
	}

	// Without an SNS topic: the dashboard only.
	os.Remove(calls)
	if out, err := nodeStep(t, root, m.srv.URL, path, "cloudwatch_cluster"); err != nil || !strings.Contains(out, "alarm is not created") {
		t.Fatalf("without a topic: err=%v\n%s", err, out)
	}
	if got := strings.Split(strings.TrimSpace(read(t, calls)), "\n"); len(got) != 1 || !strings.Contains(got[0], "put-dashboard") {
		t.Errorf("without a topic, aws calls:\n%s", strings.Join(got, "\n"))
	}
}

func TestCloudWatchOptions(t *testing.T) {
	for _, args := range [][]string{
		{"login", "--cloudwatch"},
		{"image", "--cloudwatch"},
		{"compute", "--sns-topic", "arn:aws:sns:us-east-1:123456789012:t"},
		{"head", "--sns-topic"},
		{"head", "--bogus"},
		{"compute", "a.deb", "b.deb"},
	} {
		out, err := exec.Command("bash", append([]string{script}, args...)...).CombinedOutput()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || len(lines) != 2 || !strings.Contains(lines[1], "--help") {
			t.Errorf("%q: want exit 2 with one error line and a hint, got %v:\n%s", args, err, out)
		}
	}
	out, err := exec.Command("bash", script, "head", "--cloudwatch", "--sns-topic", "arn:aws:sns:us-east-1:1:x;rm").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a valid sns name") {
		t.Errorf("a malformed topic ARN: want it refused, got %v:\n%s", err, out)
	}
}
