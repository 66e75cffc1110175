// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

const (
	testBootID = "9663521c-8306-485f-8bae-9f1dc2d1b46b"
	testRunID  = "5f3c9a1e7b2d4c6a8e0f1a2b3c4d5e6f"
)

var (
	schemaOnce sync.Once
	schema     *jsonschema.Schema
	schemaErr  error
)

func loadSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	schemaOnce.Do(func() {
		_, here, _, _ := runtime.Caller(0)
		path := filepath.Join(filepath.Dir(here), "..", "..", "docs", "audit.schema.json")
		f, err := os.Open(path)
		if err != nil {
			schemaErr = err
			return
		}
		defer f.Close()
		doc, err := jsonschema.UnmarshalJSON(f)
		if err != nil {
			schemaErr = err
			return
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if schemaErr = c.AddResource("audit.schema.json", doc); schemaErr != nil {
			return
		}
		schema, schemaErr = c.Compile("audit.schema.json")
	})
	if schemaErr != nil {
		t.Fatalf("load docs/audit.schema.json: %v", schemaErr)
	}
	return schema
}

// validateLine checks one JSON line against the schema.
func validateLine(t *testing.T, line []byte) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(line))
	if err != nil {
		return err
	}
	return loadSchema(t).Validate(v)
}

// readRecords reads a JSON Lines file, validating every line.
func readRecords(t *testing.T, path string) []Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if err := validateLine(t, sc.Bytes()); err != nil {
			t.Fatalf("record does not validate: %v\n%s", err, sc.Bytes())
		}
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkSeqs fails unless the seqs of recs are unique and every seq from 1 to
// the highest is either present or listed as lost by an audit_loss record of
// sinkName. It returns the seqs that were lost.
func checkSeqs(t *testing.T, recs []Record, sinkName string) map[uint64]bool {
	t.Helper()
	seen := map[uint64]bool{}
	lost := map[uint64]bool{}
	var top uint64
	var counted uint64
	for _, r := range recs {
		if seen[r.Seq] {
			t.Fatalf("seq %d appears twice", r.Seq)
		}
		seen[r.Seq] = true
		top = max(top, r.Seq)
		if r.Event == EventAuditLoss && r.Loss.Sink == sinkName {
			counted += r.Loss.SinkFailed[sinkName] + r.Loss.SinkDropped[sinkName]
			for _, rg := range r.Loss.LostSeqs {
				for s := rg.First; s <= rg.Last; s++ {
					if lost[s] {
						t.Fatalf("seq %d reported lost twice", s)
					}
					lost[s] = true
					top = max(top, s)
				}
			}
		}
	}
	if uint64(len(lost)) != counted {
		t.Errorf("audit_loss records count %d lost records but list %d seqs", counted, len(lost))
	}
	var missing []uint64
	for s := uint64(1); s <= top; s++ {
		if seen[s] && lost[s] {
			t.Errorf("seq %d is both written and reported lost", s)
		}
		if !seen[s] && !lost[s] {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		sort.Slice(missing, func(i, j int) bool { return missing[i] < missing[j] })
		t.Errorf("unexplained seq gaps: %v", missing)
	}
	return lost
}

// sampleRecords returns one record of every event kind, as the agent emits them.
func sampleRecords() []Record {
	uid := UID(1000)
	dev := &Device{Path: "/dev/nvidia1", Major: 195, Minor: 1}
	gpu := &GPU{Index: 1, UUID: "GPU-5a8b3e0c-1d2f-4a6b-9c7d-0e1f2a3b4c5d"}
	return []Record{
		{Event: EventAgentStart, Message: "gpufence agent started (mode enforce, 4 GPUs)", PolicyMode: ModeEnforce},
		{Event: EventPolicyApplied, Severity: SeverityNotice, Message: "job 12 step 0 may use GPUs 0,1", JobID: 12, StepID: "0", User: "alice", UID: uid, GPUs: []int{0, 1}, Cgroup: "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_12/step_0"},
		{Event: EventPolicyApplied, Message: "job 12 step extern may use no GPU", JobID: 12, StepID: "extern", User: "alice", UID: uid, GPUs: []int{}, Cgroup: "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_12/step_extern"},
		{Event: EventGPUAccess, Severity: SeverityWarning, Message: "job 12 step 0 (alice) denied open of /dev/nvidia3", AccessTime: time.Date(2026, 11, 29, 8, 0, 0, 5, time.FixedZone("x", 3600)), Decision: DecisionDenied, PolicyMode: ModeEnforce, JobID: 12, StepID: "0", User: "alice", UID: uid, PID: 4242, Comm: "python", Exe: "/usr/bin/python3.11", ExeStatus: ExeVerified, ExeDev: "254:0", ExeIno: 1234, Device: &Device{Path: "/dev/nvidia3", Major: 195, Minor: 3, Kind: DeviceGPU}, GPU: &GPU{Index: 3}, Access: []string{"read", "write"}, CgroupID: 9876},
		{Event: EventGPUAccess, Message: "job 12 step batch allowed open of /dev/nvidia1", Decision: DecisionAllowed, PolicyMode: ModeEnforce, JobID: 12, StepID: "batch", User: "alice", UID: uid, PID: 4243, Comm: "nvidia-smi", ExeStatus: ExeExited, ExeDev: "254:0", ExeIno: 77, Device: dev, GPU: gpu, Access: []string{"read"}, CgroupID: 9877},
		{Event: EventGPUAccess, Severity: SeverityWarning, Message: "root would be denied mknod of 195:7", Decision: DecisionWouldDeny, PolicyMode: ModeAuditOnly, UID: UID(0), PID: 77, Comm: "mknod", ExeStatus: ExeChanged, ExeNow: "/usr/bin/sleep", ExeDev: "0:31", ExeIno: 2, Device: &Device{Major: 195, Minor: 7}, Access: []string{"mknod"}, CgroupID: 12},
		{Event: EventAccessSuppressed, Severity: SeverityWarning, Message: "37 more denied accesses", Decision: DecisionDenied, PolicyMode: ModeEnforce, JobID: 12, StepID: "0", UID: uid, PID: 4242, Comm: "python", Device: dev, Access: []string{"read"}, Suppressed: 37, CgroupID: 9876},
		{Event: EventPolicyReleased, Message: "job 12 step 0 ended", JobID: 12, StepID: "0", User: "alice", UID: uid, GPUs: []int{0, 1}, Cgroup: "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_12/step_0", Reason: "step end"},
		{Event: EventFilterAttachFailed, Severity: SeverityError, Message: "cannot attach the device filter", Cgroup: "/sys/fs/cgroup/system.slice/slurmstepd.scope", Error: "attach device filter to /sys/fs/cgroup/system.slice/slurmstepd.scope: operation not permitted"},
		{Event: EventLookupFailed, Severity: SeverityWarning, Message: "cannot find the step of pid 99", PID: 99, Error: "read /proc/99/cgroup: no such file or directory"},
		{Event: EventConfigReload, Severity: SeverityNotice, Message: "configuration reloaded from /etc/gpufence/agent.yaml"},
		{Event: EventJobWithoutProlog, Severity: SeverityWarning, Message: "job 13 step 0 started without a prolog record; it gets no GPU", JobID: 13, StepID: "0", UID: uid},
		{Event: EventAuditLoss, Severity: SeverityWarning, Message: "lost", Loss: &Loss{QueueDropped: 3, RingbufLost: 2, SinkFailed: map[string]uint64{}, RateFull: map[string]uint64{DecisionDenied: 4}}},
		{Event: EventAgentStop, Message: "gpufence agent stopping (SIGTERM)"},
	}
}

func testOptions(t *testing.T) Options {
	return Options{
		File:         filepath.Join(t.TempDir(), "log", "audit.jsonl"),
		Journald:     "off",
		Node:         "gpu-node-1",
		Cluster:      "research",
		AgentVersion: "v0.3.0-test",
		BootID:       testBootID,
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
