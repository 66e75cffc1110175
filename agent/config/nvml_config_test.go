package config

import (
	"os"
	"path/filepath"
	"strings"
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
			p := filepath.Join(t.TempDir(), "agent.yaml")
			if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := Load(p, true)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || c.NVML != tc.want {
				t.Fatalf("nvml = %q, %v; want %q", c.NVML, err, tc.want)
			}
		})
	}
}
