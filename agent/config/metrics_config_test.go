// SPDX-License-Identifier: Apache-2.0

package config

import (
	"testing"
	"time"
)

func TestMetricsConfig(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    Metrics
		wantErr []string
	}{
		{name: "defaults", body: "", want: Metrics{Listen: "127.0.0.1:9945", MaxConnections: 64, SampleInterval: Duration{15 * time.Second}, IdleThreshold: 5, IdleAuditAfter: Duration{time.Hour}}},
		{name: "disabled and tuned", body: "metrics:\n  listen: \"\"\n  sample_interval: 2s\n  idle_threshold: 10\n  idle_audit_after: \"0s\"\n",
			want: Metrics{MaxConnections: 64, SampleInterval: Duration{2 * time.Second}, IdleThreshold: 10}},
		{name: "every address", body: "metrics:\n  listen: \":9945\"\n", want: Metrics{Listen: ":9945", MaxConnections: 64, SampleInterval: Duration{15 * time.Second}, IdleThreshold: 5, IdleAuditAfter: Duration{time.Hour}}},
		{name: "no port", body: "metrics:\n  listen: localhost\n", wantErr: []string{"metrics.listen", "localhost", "agent.yaml"}},
		{name: "port out of range", body: "metrics:\n  listen: 127.0.0.1:70000\n", wantErr: []string{"metrics.listen", "70000"}},
		{name: "sample too fast", body: "metrics:\n  sample_interval: 100ms\n", wantErr: []string{"metrics.sample_interval"}},
		{name: "threshold not a percentage", body: "metrics:\n  idle_threshold: 101\n", wantErr: []string{"metrics.idle_threshold", "101"}},
		{name: "idle audit shorter than a sample", body: "metrics:\n  idle_audit_after: 5s\n", wantErr: []string{"metrics.idle_audit_after", "15s"}},
		{name: "authenticated detail", body: "metrics:\n  web_config: /etc/gpufence/web.yaml\n  max_connections: 8\n",
			want: Metrics{Listen: "127.0.0.1:9945", WebConfig: "/etc/gpufence/web.yaml", MaxConnections: 8, SampleInterval: Duration{15 * time.Second}, IdleThreshold: 5, IdleAuditAfter: Duration{time.Hour}}},
		{name: "relative web config", body: "metrics:\n  web_config: web.yaml\n", wantErr: []string{"metrics.web_config", "web.yaml", "absolute"}},
		{name: "no connections", body: "metrics:\n  max_connections: 0\n", wantErr: []string{"metrics.max_connections", "0"}},
		{name: "too many connections", body: "metrics:\n  max_connections: 100000\n", wantErr: []string{"metrics.max_connections", "100000"}},
		{name: "relative mapping dir", body: "dcgm_job_mapping_dir: run/map\n", wantErr: []string{"dcgm_job_mapping_dir", "run/map"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ok := loadYAML(t, tt.body, tt.wantErr)
			if !ok {
				return
			}
			if c.Metrics != tt.want {
				t.Errorf("metrics %+v, want %+v", c.Metrics, tt.want)
			}
		})
	}
}
