// SPDX-License-Identifier: Apache-2.0

package events

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// TestAccessRecordNamesIMEXChannels: a denied access of the IMEX channel
// major is a gpu_access record naming the channel (the minor), its node and
// kind, with no GPU; without an IMEX major it is a bare device.
func TestAccessRecordNamesIMEXChannels(t *testing.T) {
	for _, tt := range []struct {
		imexMajor    uint32
		major, minor uint32
		kind, path   string
		msg          string
	}{
		{228, 228, 2047, audit.DeviceIMEXChannel, "/dev/nvidia-caps-imex-channels/channel2047", "IMEX channel 2047 (/dev/nvidia-caps-imex-channels/channel2047, 228:2047) denied to job 42 step 0"},
		{228, 228, 0, audit.DeviceIMEXChannel, "/dev/nvidia-caps-imex-channels/channel0", "IMEX channel 0 (/dev/nvidia-caps-imex-channels/channel0, 228:0) denied to job 42 step 0"},
		{228, 229, 1, "", "", "device 229:1 denied to job 42 step 0"},
		{0, 228, 1, "", "", "device 228:1 denied to job 42 step 0"},
	} {
		e := New(Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Recorder: &audittest.Recorder{},
			Owners: registry.New(nil, slog.New(slog.NewTextHandler(io.Discard, nil))), Table: noTable{}, Users: &users.Cache{},
			IMEXMajor: tt.imexMajor})
		step := registry.Owner{JobID: 42, StepID: 0, UID: 1000, GPUs: []int{1}}
		r := e.accessRecord(devfilter.Event{Major: tt.major, Minor: tt.minor, Decision: devfilter.DecisionDenied, UID: 1000}, step, true, 0)
		e.Close()
		if r.Event != audit.EventGPUAccess || r.Device == nil || r.Device.Kind != tt.kind || r.Device.Path != tt.path ||
			r.Device.Major != tt.major || r.Device.Minor != tt.minor || r.GPU != nil || r.StepID != "0" {
			t.Errorf("IMEX major %d, %d:%d: record %+v device %+v, want kind %q path %q, no GPU", tt.imexMajor, tt.major, tt.minor, r, r.Device, tt.kind, tt.path)
		}
		if !strings.HasPrefix(r.Message, tt.msg) {
			t.Errorf("IMEX major %d, %d:%d: message %q, want it to start with %q", tt.imexMajor, tt.major, tt.minor, r.Message, tt.msg)
		}
	}
}
