package config

import "testing"

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
