// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/gpufence/gpufence/agent/config"
)

const cloudwatchDir = "../../packaging/parallelcluster/cloudwatch/"

// agentConfig is what the tests read of the CloudWatch agent's
// configuration for ParallelCluster.
type agentConfig struct {
	Logs struct {
		LogsCollected struct {
			Files struct {
				CollectList []struct {
					FilePath     string `json:"file_path"`
					LogGroupName string `json:"log_group_name"`
				} `json:"collect_list"`
			} `json:"files"`
		} `json:"logs_collected"`
		MetricsCollected struct {
			Prometheus struct {
				ConfigPath string `json:"prometheus_config_path"`
				EMF        struct {
					Namespace    string            `json:"metric_namespace"`
					Units        map[string]string `json:"metric_unit"`
					Declarations []struct {
						SourceLabels []string   `json:"source_labels"`
						LabelMatcher string     `json:"label_matcher"`
						Dimensions   [][]string `json:"dimensions"`
						Selectors    []string   `json:"metric_selectors"`
					} `json:"metric_declaration"`
				} `json:"emf_processor"`
			} `json:"prometheus"`
		} `json:"metrics_collected"`
	} `json:"logs"`
}

func readAgentConfig(t *testing.T) agentConfig {
	t.Helper()
	b, err := os.ReadFile(cloudwatchDir + "amazon-cloudwatch-agent.json")
	if err != nil {
		t.Fatal(err)
	}
	var cw agentConfig
	if err := json.Unmarshal(b, &cw); err != nil {
		t.Fatalf("amazon-cloudwatch-agent.json: %v", err)
	}
	return cw
}

// TestCloudWatchConfig keeps the CloudWatch agent configuration for
// ParallelCluster true to the agent: every metric its EMF declarations
// select is one the agent serves, every dimension a label that metric has
// (or one the scrape config adds), the scrape reaches the agent's default
// endpoint, and the audit file shipped is the agent's default one.
func TestCloudWatchConfig(t *testing.T) {
	cw := readAgentConfig(t)
	var scrape struct {
		ScrapeConfigs []struct {
			JobName   string `yaml:"job_name"`
			BasicAuth struct {
				Username     string `yaml:"username"`
				PasswordFile string `yaml:"password_file"`
			} `yaml:"basic_auth"`
			StaticConfigs []struct {
				Targets []string          `yaml:"targets"`
				Labels  map[string]string `yaml:"labels"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	sb, err := os.ReadFile(cloudwatchDir + "prometheus.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(sb, &scrape); err != nil {
		t.Fatalf("prometheus.yaml: %v", err)
	}
	if len(scrape.ScrapeConfigs) != 1 || scrape.ScrapeConfigs[0].JobName != "gpufence" ||
		len(scrape.ScrapeConfigs[0].StaticConfigs) != 1 ||
		strings.Join(scrape.ScrapeConfigs[0].StaticConfigs[0].Targets, ",") != config.DefaultMetricsListen {
		t.Errorf("prometheus.yaml does not scrape the agent's default endpoint %s as job gpufence: %+v", config.DefaultMetricsListen, scrape)
	}
	// The per-job series the declarations select are served only to an
	// authenticated scraper (metrics.web_config).
	if ba := scrape.ScrapeConfigs[0].BasicAuth; ba.Username == "" || !strings.HasPrefix(ba.PasswordFile, "/etc/gpufence/") {
		t.Errorf("prometheus.yaml scrapes without basic_auth (username and a password_file under /etc/gpufence): %+v", ba)
	}
	extra := scrape.ScrapeConfigs[0].StaticConfigs[0].Labels
	prom := cw.Logs.MetricsCollected.Prometheus
	if !strings.HasSuffix(prom.ConfigPath, "/cloudwatch/prometheus.yaml") {
		t.Errorf("prometheus_config_path %q is not the shipped prometheus.yaml", prom.ConfigPath)
	}
	if prom.EMF.Namespace != "gpufence" {
		t.Errorf("namespace %q", prom.EMF.Namespace)
	}

	fams, err := populated(t).Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]map[string]bool{}
	for _, f := range fams {
		l := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, p := range m.GetLabel() {
				l[p.GetName()] = true
			}
		}
		labels[f.GetName()] = l
	}
	selected := map[string]bool{}
	for _, d := range prom.EMF.Declarations {
		if strings.Join(d.SourceLabels, ",") != "job" || !regexp.MustCompile(d.LabelMatcher).MatchString("gpufence") {
			t.Errorf("declaration %v does not match the scrape job gpufence", d.Selectors)
		}
		for _, sel := range d.Selectors {
			re, err := regexp.Compile(sel)
			if err != nil {
				t.Errorf("selector %q: %v", sel, err)
				continue
			}
			n := 0
			for name := range labels {
				if !re.MatchString(name) {
					continue
				}
				n++
				selected[name] = true
				for _, dims := range d.Dimensions {
					for _, dim := range dims {
						if !labels[name][dim] && extra[dim] == "" {
							t.Errorf("%s: dimension %s is neither one of its labels nor added by the scrape", name, dim)
						}
					}
				}
			}
			if n == 0 {
				t.Errorf("selector %q matches no metric the agent serves", sel)
			}
		}
	}
	for name := range prom.EMF.Units {
		if !selected[name] {
			t.Errorf("metric_unit names %s, which no declaration selects", name)
		}
	}
	// What the ParallelCluster teams watch: per-job utilization, memory,
	// idle time, and the denials.
	for _, name := range []string{nameUtilization, nameMemUsed, nameIdle, nameAccess} {
		if !selected[name] {
			t.Errorf("the CloudWatch configuration ships no %s", name)
		}
	}
	files := cw.Logs.LogsCollected.Files.CollectList
	if len(files) != 1 || files[0].FilePath != "/var/log/gpufence/audit.jsonl" || files[0].LogGroupName == "" {
		t.Errorf("logs shipped: %+v, want the agent's default audit file", files)
	}

	var alarm struct {
		Namespace string
		Threshold float64
		Metrics   []struct{ Expression string }
	}
	ab, err := os.ReadFile(cloudwatchDir + "idle-gpu-alarm.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(ab, &alarm); err != nil {
		t.Fatalf("idle-gpu-alarm.json: %v", err)
	}
	if alarm.Threshold != 3600 || len(alarm.Metrics) != 1 || !strings.Contains(alarm.Metrics[0].Expression, nameIdle) || !selected[nameIdle] {
		t.Errorf("the example alarm is not on an allocated GPU idle for an hour: %+v", alarm)
	}
}
