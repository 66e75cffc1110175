package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNvidiaCapsMajor(t *testing.T) {
	tests := []struct {
		body    string
		want    uint32
		wantErr []string
	}{
		{body: "", want: 0},
		{body: "nvidia_caps_major: 237\n", want: 237},
		{body: "nvidia_caps_major: 4096\n", wantErr: []string{"nvidia_caps_major", "4096", "agent.yaml"}},
		{body: "nvidia_major: 237\nnvidia_caps_major: 237\n", wantErr: []string{"nvidia_caps_major", "same as nvidia_major"}},
	}
	for _, tt := range tests {
		p := filepath.Join(t.TempDir(), "agent.yaml")
		if err := os.WriteFile(p, []byte(tt.body), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p, true)
		if len(tt.wantErr) > 0 {
			if err == nil {
				t.Errorf("%q: no error", tt.body)
				continue
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q: error %q does not name %q", tt.body, err, w)
				}
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tt.body, err)
		} else if c.NvidiaCapsMajor != tt.want {
			t.Errorf("%q: NvidiaCapsMajor = %d, want %d", tt.body, c.NvidiaCapsMajor, tt.want)
		}
	}
}
