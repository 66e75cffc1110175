// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"encoding/json"
	"testing"
	"time"
)

// TestSchemaShares: a gpu_access record of a shard or mps job carries its
// shares; the schema refuses another kind, a share without its GPU, an
// empty list and a count of 0 (omitted instead).
func TestSchemaShares(t *testing.T) {
	base := func() Record {
		return Record{SchemaVersion: "1", Seq: 1, RunID: testRunID, BootID: testBootID, Time: time.Now().UTC(), Event: EventGPUAccess, Severity: SeverityWarning,
			Node: "n", Cluster: "c", AgentVersion: "v", Message: "GPU 1 denied to job 12 step 0",
			Decision: DecisionDenied, PolicyMode: ModeEnforce, JobID: 12, StepID: "0", UID: UID(1000), PID: 4250, Comm: "probe",
			Device: &Device{Path: "/dev/nvidia1", Major: 195, Minor: 1, Kind: DeviceGPU}, GPU: &GPU{Index: 1}, Access: []string{"read"}, CgroupID: 9876,
			Shares: []Share{{Kind: "shard", GPU: 2, Count: 5}}}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*Record)
		valid bool
	}{
		{"shard", func(*Record) {}, true},
		{"mps, no count", func(r *Record) { r.Shares = []Share{{Kind: "mps", GPU: 0}} }, true},
		{"none", func(r *Record) { r.Shares = nil }, true},
		{"another kind", func(r *Record) { r.Shares[0].Kind = "gpu" }, false},
		{"negative GPU", func(r *Record) { r.Shares[0].GPU = -1 }, false},
	} {
		r := base()
		tc.edit(&r)
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := validateLine(t, b); (err == nil) != tc.valid {
			t.Errorf("%s: schema says %v, want valid %v\n%s", tc.name, err, tc.valid, b)
		}
	}
	for _, raw := range []string{`[]`, `[{"kind":"shard"}]`, `[{"kind":"shard","gpu":1,"count":0}]`} {
		r := base()
		r.Shares = nil
		b, _ := json.Marshal(r)
		var m map[string]any
		json.Unmarshal(b, &m)
		var v any
		json.Unmarshal([]byte(raw), &v)
		m["shares"] = v
		b, _ = json.Marshal(m)
		if err := validateLine(t, b); err == nil {
			t.Errorf("shares %s: valid, want refused", raw)
		}
	}
	r := base()
	if f := journalFields(&r); !hasField(f, "GPUFENCE_SHARES", "shard:5 on GPU 2") {
		t.Errorf("journal fields %v lack the share", f)
	}
}
