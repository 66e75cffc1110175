// SPDX-License-Identifier: Apache-2.0

package devices

import (
	"strings"
	"testing"
)

func TestFabricMajors(t *testing.T) {
	tests := []struct {
		name, devices string
		want          Fabric
	}{
		{"both", "Character devices:\n195 nvidia-frontend\n236 nvidia-nvswitch\n237 nvidia-caps\n238 nvidia-nvlink\n\nBlock devices:\n236 nvidia-nvlink-not-a-char\n", Fabric{236, 238}},
		{"nvswitch only", "Character devices:\n195 nvidia\n509 nvidia-nvswitch\n", Fabric{NVSwitchMajor: 509}},
		// Prefixes are other modules.
		{"none", "Character devices:\n195 nvidia\n240 nvidia-uvm\n241 nvidia-nvswitch-x\n\nBlock devices:\n238 nvidia-nvlink\n", Fabric{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FabricMajors(strings.NewReader(tt.devices))
			if err != nil || got != tt.want {
				t.Errorf("FabricMajors = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
	if _, err := FabricMajors(strings.NewReader("Character devices:\nx nvidia-nvswitch\n")); err == nil {
		t.Error("FabricMajors accepted a bad line")
	}
}

func TestFabricOf(t *testing.T) {
	f := Fabric{NVSwitchMajor: 236, NVLinkMajor: 238}
	tests := []struct {
		major, minor uint32
		kind         FabricKind
		path         string
	}{
		{236, 255, NVSwitch, "/dev/nvidia-nvswitchctl"},
		{236, 0, NVSwitch, "/dev/nvidia-nvswitch0"},
		{236, 11, NVSwitch, "/dev/nvidia-nvswitch11"},
		{238, 0, NVLink, "/dev/nvidia-nvlink"},
		{238, 1, NVLink, ""},
		{195, 0, NotFabric, ""},
		{237, 255, NotFabric, ""},
	}
	for _, tt := range tests {
		if kind, path := f.Of(tt.major, tt.minor); kind != tt.kind || path != tt.path {
			t.Errorf("Of(%d, %d) = %v, %q; want %v, %q", tt.major, tt.minor, kind, path, tt.kind, tt.path)
		}
	}
	// An unknown major (0) is never a management node.
	if kind, _ := (Fabric{}).Of(0, 0); kind != NotFabric {
		t.Errorf("Fabric{}.Of(0, 0) = %v", kind)
	}
	if kind, _ := (Fabric{NVLinkMajor: 238}).Of(0, 255); kind != NotFabric {
		t.Errorf("Of(0, 255) with no nvswitch major = %v", kind)
	}
}
