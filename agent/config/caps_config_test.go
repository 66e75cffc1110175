// SPDX-License-Identifier: Apache-2.0

package config

import (
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
		if c, ok := loadYAML(t, tt.body, tt.wantErr); ok && c.NvidiaCapsMajor != tt.want {
			t.Errorf("%q: NvidiaCapsMajor = %d, want %d", tt.body, c.NvidiaCapsMajor, tt.want)
		}
	}
}
