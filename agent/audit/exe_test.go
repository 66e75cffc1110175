// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestSchemaExeOtherNamespace: a record of a process whose exe path is its
// own mount namespace's is valid with exe_namespace_path, the kernel's
// file and the namespace; the schema refuses it calling the path exe or
// exe_now, or without the file that a SOC needs to find the program.
func TestSchemaExeOtherNamespace(t *testing.T) {
	base := func() Record {
		return Record{SchemaVersion: "1", Seq: 1, RunID: testRunID, BootID: testBootID, Time: time.Now().UTC(), Event: EventGPUAccess, Severity: SeverityWarning,
			Node: "n", Cluster: "c", AgentVersion: "v", Message: "GPU 2 denied to job 12 step 0",
			Decision: DecisionDenied, PolicyMode: ModeEnforce, JobID: 12, StepID: "0", UID: UID(1000), PID: 4250, Comm: "true",
			ExeStatus: ExeOtherNamespace, ExeNamespacePath: "/usr/bin/true", ExeMntNS: 4026532179, ExeDev: "254:0", ExeIno: 5678,
			Device: &Device{Path: "/dev/nvidia2", Major: 195, Minor: 2, Kind: DeviceGPU}, GPU: &GPU{Index: 2}, Access: []string{"read"}, CgroupID: 9876}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*Record)
		valid bool
	}{
		{"as the agent writes it", func(*Record) {}, true},
		{"the namespace's path as exe", func(r *Record) { r.Exe = r.ExeNamespacePath }, false},
		{"the namespace's path as exe_now", func(r *Record) { r.ExeNow = r.ExeNamespacePath }, false},
		{"verified with a namespace path", func(r *Record) { r.ExeStatus = ExeVerified }, false},
		{"no namespace path", func(r *Record) { r.ExeNamespacePath = "" }, false},
		{"no file identity", func(r *Record) { r.ExeDev, r.ExeIno = "", 0 }, false},
		{"no namespace", func(r *Record) { r.ExeMntNS = 0 }, false},
		{"a verified exe in a container's namespace", func(r *Record) {
			r.ExeStatus, r.Exe, r.ExeNamespacePath = ExeVerified, "/usr/bin/true", ""
		}, true},
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
	r := base()
	f := journalFields(&r)
	if !hasField(f, "GPUFENCE_EXE_NAMESPACE_PATH", "/usr/bin/true") || !hasField(f, "GPUFENCE_EXE_MNT_NS", "4026532179") {
		t.Errorf("journal fields %v lack the namespace path and namespace", f)
	}
	if got := exeLabel(&r); got != "[other namespace] /usr/bin/true" {
		t.Errorf("audit tail's exe column %q, want it marked as the namespace's path", got)
	}
	r.ExeNamespacePath = "/usr/bin/\x1b[2Jtrue"
	printable(&r)
	if strings.Contains(r.ExeNamespacePath, "\x1b") {
		t.Errorf("exe_namespace_path %q keeps a control character", r.ExeNamespacePath)
	}
}
