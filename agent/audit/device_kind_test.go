// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"encoding/json"
	"testing"
	"time"
)

// TestSchemaDeviceKind: a denial of an NVSwitch management node, as the
// agent records it (no gpu, device.kind), is valid; the schema knows every
// kind the agent writes and no other.
func TestSchemaDeviceKind(t *testing.T) {
	uid := UID(1000)
	for _, kind := range []string{DeviceGPU, DeviceMIGCapability, DeviceNVSwitch, DeviceNVLink, DeviceIMEXChannel, "switch"} {
		r := Record{SchemaVersion: "1", Seq: 1, RunID: testRunID, BootID: testBootID, Time: time.Now().UTC(), Event: EventGPUAccess, Severity: SeverityWarning,
			Node: "n", Cluster: "c", AgentVersion: "v", Message: "NVSwitch management device /dev/nvidia-nvswitchctl (236:255) denied to job 12 step 0",
			Decision: DecisionDenied, PolicyMode: ModeEnforce, JobID: 12, StepID: "0", UID: uid, PID: 4242, Comm: "python",
			Device: &Device{Path: "/dev/nvidia-nvswitchctl", Major: 236, Minor: 255, Kind: kind}, Access: []string{"read", "write"}, CgroupID: 9876}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		err = validateLine(t, b)
		if kind == "switch" {
			if err == nil {
				t.Errorf("schema accepted device kind %q", kind)
			}
		} else if err != nil {
			t.Errorf("device kind %q rejected: %v\n%s", kind, err, b)
		}
	}
	if f := journalFields(&Record{Event: EventGPUAccess, Device: &Device{Major: 236, Minor: 255, Kind: DeviceNVSwitch}}); !hasField(f, "GPUFENCE_DEVICE_KIND", DeviceNVSwitch) {
		t.Errorf("journal fields %v lack GPUFENCE_DEVICE_KIND=nvswitch", f)
	}
}

func hasField(fs []journalField, name, value string) bool {
	for _, f := range fs {
		if f.Name == name && f.Value == value {
			return true
		}
	}
	return false
}
