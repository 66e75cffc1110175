// SPDX-License-Identifier: Apache-2.0

package config

import "testing"

// TestSlurmdConfig: the slurmd key is empty by default (found beside
// Slurm's other commands) and must be absolute when set.
func TestSlurmdConfig(t *testing.T) {
	if c, ok := loadYAML(t, "", nil); !ok || c.Slurmd != "" {
		t.Fatalf("default slurmd = %q", c.Slurmd)
	}
	if c, ok := loadYAML(t, "slurmd: /opt/slurm/sbin/slurmd\n", nil); !ok || c.Slurmd != "/opt/slurm/sbin/slurmd" {
		t.Fatalf("slurmd = %q", c.Slurmd)
	}
	loadYAML(t, "slurmd: sbin/slurmd\n", []string{`agent.yaml: slurmd: "sbin/slurmd" must be an absolute path`})
}

func TestSlurmdGPUTableConfig(t *testing.T) {
	for _, tc := range []struct {
		name, body, want, wantErr string
	}{
		{name: "default auto", body: "", want: SlurmdGPUTableAuto},
		{name: "required", body: "slurmd_gpu_table: required\n", want: SlurmdGPUTableRequired},
		{name: "off", body: "slurmd_gpu_table: off\n", want: SlurmdGPUTableOff},
		{name: "unknown value named with file", body: "slurmd_gpu_table: yes\n", wantErr: `agent.yaml: slurmd_gpu_table: "yes" is not one of auto, required, off`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wantErr []string
			if tc.wantErr != "" {
				wantErr = []string{tc.wantErr}
			}
			c, ok := loadYAML(t, tc.body, wantErr)
			if !ok {
				return
			}
			if c.SlurmdGPUTable != tc.want {
				t.Fatalf("slurmd_gpu_table = %q; want %q", c.SlurmdGPUTable, tc.want)
			}
		})
	}
}
