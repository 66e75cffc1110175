// SPDX-License-Identifier: Apache-2.0

package events

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// TestAccessRecordNamesFabricNodes: a denied access to an NVSwitch or
// NVLink management node is a gpu_access record naming the node, its kind
// and the job step, with no GPU.
func TestAccessRecordNamesFabricNodes(t *testing.T) {
	e := New(Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Recorder: &audittest.Recorder{},
		Owners: registry.New(nil, slog.New(slog.NewTextHandler(io.Discard, nil))), Table: noTable{}, Users: &users.Cache{},
		Fabric: devices.Fabric{NVSwitchMajor: 236, NVLinkMajor: 238}})
	defer e.Close()
	step := registry.Owner{JobID: 42, StepID: 0, UID: 1000, GPUs: []int{1}}
	tests := []struct {
		major, minor uint32
		kind, path   string
		msg          string
		known        bool
		wantStep     string
	}{
		{236, 255, audit.DeviceNVSwitch, "/dev/nvidia-nvswitchctl", "NVSwitch management device /dev/nvidia-nvswitchctl (236:255) denied to job 42 step 0", true, "0"},
		{236, 3, audit.DeviceNVSwitch, "/dev/nvidia-nvswitch3", "NVSwitch management device /dev/nvidia-nvswitch3 (236:3) denied to job 42 step 0", true, "0"},
		{238, 0, audit.DeviceNVLink, "/dev/nvidia-nvlink", "NVLink management device /dev/nvidia-nvlink (238:0) denied to a cgroup without a policy entry", false, ""},
		{238, 9, audit.DeviceNVLink, "", "NVLink management device 238:9 denied", true, "0"},
		{237, 1, "", "", "device 237:1 denied", true, "0"},
	}
	for _, tt := range tests {
		r := e.accessRecord(devfilter.Event{Major: tt.major, Minor: tt.minor, Decision: devfilter.DecisionDenied, TGID: 0, UID: 1000}, step, tt.known, 0)
		if r.Event != audit.EventGPUAccess || r.Device == nil || r.Device.Kind != tt.kind || r.Device.Path != tt.path ||
			r.Device.Major != tt.major || r.Device.Minor != tt.minor || r.GPU != nil || r.StepID != tt.wantStep {
			t.Errorf("%d:%d: record %+v device %+v, want kind %q path %q, no GPU, step %q", tt.major, tt.minor, r, r.Device, tt.kind, tt.path, tt.wantStep)
		}
		if !strings.HasPrefix(r.Message, tt.msg) {
			t.Errorf("%d:%d: message %q, want it to start with %q", tt.major, tt.minor, r.Message, tt.msg)
		}
	}
}
