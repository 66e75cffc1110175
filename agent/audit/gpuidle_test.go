// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

// gpu_idle records (written by agent/metrics) validate, and the schema
// insists on what makes them useful.
func TestGPUIdleRecord(t *testing.T) {
	r := Record{SchemaVersion: SchemaVersion, Seq: 1, RunID: testRunID, BootID: testBootID, Time: time.Now(), Event: EventGPUIdle,
		Severity: SeverityNotice, Node: "n", Cluster: "c", AgentVersion: "v", Message: "job 12 has held GPU 1 below 5% utilization for 1h0m0s",
		JobID: 12, UID: UID(1001), User: "alice", GPU: &GPU{Index: 1, UUID: "GPU-1"}, IdleSeconds: 3600, IdleThreshold: 5}
	good, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := validateLine(t, good); err != nil {
		t.Fatalf("gpu_idle record rejected: %v\n%s", err, good)
	}
	for _, drop := range []string{"job_id", "uid", "gpu", "idle_seconds", "idle_threshold"} {
		var m map[string]any
		if err := json.Unmarshal(good, &m); err != nil {
			t.Fatal(err)
		}
		delete(m, drop)
		b, _ := json.Marshal(m)
		if validateLine(t, b) == nil {
			t.Errorf("gpu_idle without %s accepted", drop)
		}
	}
	var names []string
	for _, f := range journalFields(&r) {
		names = append(names, f.Name)
	}
	for _, want := range []string{"GPUFENCE_IDLE_SECONDS", "GPUFENCE_IDLE_THRESHOLD", "GPUFENCE_GPU_UUID"} {
		if !slices.Contains(names, want) {
			t.Errorf("journald entry has no %s: %v", want, names)
		}
	}
}

// gpu_table_mismatch records validate, and need the mismatch in error.
func TestGPUTableMismatchRecord(t *testing.T) {
	r := Record{SchemaVersion: SchemaVersion, Seq: 1, RunID: testRunID, BootID: testBootID, Time: time.Now(), Event: EventGPUTableMismatch,
		Severity: SeverityError, Node: "n", Cluster: "c", AgentVersion: "v",
		Message: "Slurm's GPU table (gres.conf) does not match the NVIDIA driver; steps that ask for a GPU are refused",
		Error:   "count: gres.conf names 4 GPU devices for this node but the NVIDIA driver (NVML) sees 3 GPUs"}
	good, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := validateLine(t, good); err != nil {
		t.Fatalf("gpu_table_mismatch record rejected: %v\n%s", err, good)
	}
	var m map[string]any
	if err := json.Unmarshal(good, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "error")
	b, _ := json.Marshal(m)
	if validateLine(t, b) == nil {
		t.Error("gpu_table_mismatch without error accepted")
	}
}
