// SPDX-License-Identifier: Apache-2.0

package config

import "testing"

func TestFabricManagement(t *testing.T) {
	tests := []struct {
		body             string
		want             string
		nvswitch, nvlink uint32
		wantErr          []string
	}{
		{body: "", want: FabricDeny},
		{body: "fabric_management: allow\n", want: FabricAllow},
		{body: "fabric_management: deny\nnvswitch_major: 236\nnvlink_major: 238\n", want: FabricDeny, nvswitch: 236, nvlink: 238},
		{body: "fabric_management: off\n", wantErr: []string{"agent.yaml", "fabric_management", `"off" is not one of deny, allow`}},
		{body: "nvswitch_major: 4096\n", wantErr: []string{"nvswitch_major", "4096 is not a valid char major"}},
		{body: "nvlink_major: 70000\n", wantErr: []string{"nvlink_major", "70000 is not a valid char major"}},
		{body: "nvswitch_major: 195\n", wantErr: []string{"nvswitch_major", "195 is the NVIDIA GPU major"}},
		{body: "nvidia_major: 200\nnvlink_major: 200\n", wantErr: []string{"nvlink_major", "200 is the NVIDIA GPU major"}},
		{body: "nvidia_caps_major: 237\nnvswitch_major: 237\n", wantErr: []string{"nvswitch_major", "same as nvidia_caps_major"}},
		{body: "nvswitch_major: 236\nnvlink_major: 236\n", wantErr: []string{"nvlink_major", "same as nvswitch_major"}},
	}
	for _, tt := range tests {
		c, ok := loadYAML(t, tt.body, tt.wantErr)
		if ok && (c.FabricManagement != tt.want || c.NVSwitchMajor != tt.nvswitch || c.NVLinkMajor != tt.nvlink) {
			t.Errorf("%q: fabric_management %q, nvswitch_major %d, nvlink_major %d; want %q, %d, %d",
				tt.body, c.FabricManagement, c.NVSwitchMajor, c.NVLinkMajor, tt.want, tt.nvswitch, tt.nvlink)
		}
	}
}
