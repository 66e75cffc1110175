// SPDX-License-Identifier: Apache-2.0

package config

import "testing"

func TestIMEXChannels(t *testing.T) {
	tests := []struct {
		body      string
		want      string
		wantMajor uint32
		wantErr   []string
	}{
		{body: "", want: IMEXAuto},
		{body: "imex_channels: slurm\n", want: IMEXSlurm},
		{body: "imex_channels: none\nimex_channels_major: 230\n", want: IMEXNone, wantMajor: 230},
		{body: "imex_channels: unrestricted\n", want: IMEXUnrestricted},
		{body: "imex_channels: all\n", wantErr: []string{"imex_channels", `"all"`, "agent.yaml"}},
		{body: "imex_channels_major: 4096\n", wantErr: []string{"imex_channels_major", "4096"}},
		{body: "nvidia_caps_major: 230\nimex_channels_major: 230\n", wantErr: []string{"imex_channels_major", "same as"}},
	}
	for _, tt := range tests {
		if c, ok := loadYAML(t, tt.body, tt.wantErr); ok && (c.IMEXChannels != tt.want || c.IMEXChannelsMajor != tt.wantMajor) {
			t.Errorf("%q: IMEXChannels = %q, major %d; want %q, %d", tt.body, c.IMEXChannels, c.IMEXChannelsMajor, tt.want, tt.wantMajor)
		}
	}
}
