// SPDX-License-Identifier: Apache-2.0

package config

import (
	"testing"
)

func TestNVMLConfig(t *testing.T) {
	for _, tc := range []struct {
		name, body, want, wantErr string
	}{
		{name: "default auto", body: "", want: NVMLAuto},
		{name: "required", body: "nvml: required\n", want: NVMLRequired},
		{name: "off", body: "nvml: off\n", want: NVMLOff},
		{name: "unknown value named with file", body: "nvml: maybe\n", wantErr: `agent.yaml: nvml: "maybe" is not one of auto, required, off`},
		{name: "yaml bool is no value", body: "nvml: false\n", wantErr: `nvml: "false"`},
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
			if c.NVML != tc.want {
				t.Fatalf("nvml = %q; want %q", c.NVML, tc.want)
			}
		})
	}
}
