// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// decodeJournal parses the native protocol, the inverse of encodeJournal.
func decodeJournal(t *testing.T, b []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	for len(b) > 0 {
		i := bytes.IndexAny(b, "=\n")
		if i < 0 {
			t.Fatalf("truncated field %q", b)
		}
		name := string(b[:i])
		if b[i] == '=' {
			j := bytes.IndexByte(b[i:], '\n')
			out[name] = string(b[i+1 : i+j])
			b = b[i+j+1:]
			continue
		}
		n := binary.LittleEndian.Uint64(b[i+1 : i+9])
		out[name] = string(b[i+9 : i+9+int(n)])
		b = b[i+9+int(n)+1:]
	}
	return out
}

func TestJournalFieldMapping(t *testing.T) {
	r := sampleRecords()[3]
	r.SchemaVersion, r.Seq, r.RunID, r.BootID, r.Node, r.Cluster, r.AgentVersion = "1", 42, testRunID, testBootID, "gpu-node-1", "research", "v1"
	r.Time = time.Date(2026, 11, 29, 8, 0, 0, 5, time.UTC)
	r.Host = &Host{MachineID: "4f6a0c0e3a9b4f2a8d5e6c7b8a9f0e1d", FQDN: "gpu-node-1.example.org", EC2InstanceID: "i-0123456789abcdef0"}
	r.Message = "denied\nsecond line"
	got := decodeJournal(t, encodeJournal(journalFields(&r)))
	want := map[string]string{
		"MESSAGE": "denied\nsecond line", "PRIORITY": "4", "SYSLOG_IDENTIFIER": "gpufence",
		"GPUFENCE_SEQ": "42", "GPUFENCE_EVENT": "gpu_access", "GPUFENCE_DECISION": "denied",
		"GPUFENCE_POLICY_MODE": "enforce", "GPUFENCE_JOB_ID": "12", "GPUFENCE_STEP_ID": "0",
		"GPUFENCE_USER": "alice", "GPUFENCE_UID": "1000", "GPUFENCE_PID": "4242", "GPUFENCE_COMM": "python",
		"GPUFENCE_EXE": "/usr/bin/python3.11", "GPUFENCE_DEVICE_PATH": "/dev/nvidia3", "GPUFENCE_DEVICE": "195:3", "GPUFENCE_DEVICE_KIND": "gpu",
		"GPUFENCE_GPU_INDEX": "3", "GPUFENCE_ACCESS": "read,write", "GPUFENCE_CGROUP_ID": "9876",
		"GPUFENCE_NODE": "gpu-node-1", "GPUFENCE_CLUSTER": "research", "GPUFENCE_BOOT_ID": testBootID, "GPUFENCE_RUN_ID": testRunID,
		"GPUFENCE_TIME": "2026-11-29T08:00:00.000000005Z", "GPUFENCE_ACCESS_TIME": "2026-11-29T07:00:00.000000005Z",
		"GPUFENCE_MACHINE_ID": "4f6a0c0e3a9b4f2a8d5e6c7b8a9f0e1d", "GPUFENCE_FQDN": "gpu-node-1.example.org", "GPUFENCE_EC2_INSTANCE_ID": "i-0123456789abcdef0", "GPUFENCE_SCHEMA_VERSION": "1", "GPUFENCE_AGENT_VERSION": "v1",
		"GPUFENCE_SEVERITY": "warning", "GPUFENCE_EXE_STATUS": "verified", "GPUFENCE_EXE_DEV": "254:0", "GPUFENCE_EXE_INO": "1234",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if strings.HasPrefix(k, "_") || strings.ToUpper(k) != k {
			t.Errorf("field name %q is not allowed for a client", k)
		}
	}
	// The pipeline never hands a sink a newline (printable); the encoder
	// frames one all the same, and the record stays valid otherwise.
	r.Message = "denied"
	if err := validateLine(t, []byte(decodeJournal(t, encodeJournal(journalFields(&r)))["GPUFENCE_RECORD"])); err != nil {
		t.Errorf("GPUFENCE_RECORD is not a valid record: %v", err)
	}
	root := sampleRecords()[5]
	if f := decodeJournal(t, encodeJournal(journalFields(&root))); f["GPUFENCE_UID"] != "0" || f["GPUFENCE_JOB_ID"] != "" {
		t.Errorf("uid 0 / no job: %v", f)
	}
}

// TestPrivilegedJournald starts a private systemd-journald namespace
// ("gpufence-test-<pid>"): it has its own socket under
// /run/systemd/journal.<namespace>/ and its own journal files, does not read
// /dev/kmsg or bind /dev/log, so it leaves the host's logging alone. The
// test removes both directories afterwards.
func TestPrivilegedJournald(t *testing.T) {
	const journald = "/lib/systemd/systemd-journald"
	if os.Geteuid() != 0 {
		t.Skip("needs root to run systemd-journald; the field mapping is covered by TestJournalFieldMapping")
	}
	if _, err := os.Stat(journald); err != nil {
		t.Skipf("no %s (%v); the field mapping is covered by TestJournalFieldMapping", journald, err)
	}
	journalctl, err := exec.LookPath("journalctl")
	if err != nil {
		t.Skip("no journalctl to read the journal back; the field mapping is covered by TestJournalFieldMapping")
	}
	mid, err := os.ReadFile("/etc/machine-id")
	if err != nil {
		t.Skipf("no /etc/machine-id, journald cannot name its files: %v", err)
	}
	ns := fmt.Sprintf("gpufence-test-%d", os.Getpid())
	runDir := "/run/systemd/journal." + ns
	machine := strings.TrimSpace(string(mid))
	for _, d := range []string{runDir, "/run/log/journal/" + machine + "." + ns, "/var/log/journal/" + machine + "." + ns} {
		if _, err := os.Stat(d); err == nil {
			t.Skipf("%s exists already; not touching it", d)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	cmd := exec.Command(journald, ns)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start %s: %v", journald, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	sock := filepath.Join(runDir, "socket")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Skipf("journald namespace %s did not create %s: %s", ns, sock, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	opts := testOptions(t)
	opts.File = ""
	opts.Journald = "on"
	opts.JournalSocket = sock
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := sampleRecords()[3]
	want.Message = "journald test " + ns
	p.Emit(want)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats().Sinks["journald"]; st.Written != 1 {
		t.Fatalf("journald sink: %+v", st)
	}
	var entry map[string]any
	deadline = time.Now().Add(10 * time.Second)
	for entry == nil {
		out, err := exec.Command(journalctl, "--namespace="+ns, "-o", "json", "--no-pager", "SYSLOG_IDENTIFIER=gpufence").Output()
		if err == nil {
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				var e map[string]any
				if json.Unmarshal([]byte(line), &e) == nil && e["MESSAGE"] == want.Message {
					entry = e
				}
			}
		}
		if entry == nil {
			if time.Now().After(deadline) {
				t.Fatalf("record not found in journal namespace %s: %v %s", ns, err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for k, v := range map[string]string{
		"PRIORITY": "4", "GPUFENCE_EVENT": "gpu_access", "GPUFENCE_JOB_ID": "12", "GPUFENCE_STEP_ID": "0",
		"GPUFENCE_UID": "1000", "GPUFENCE_DECISION": "denied", "GPUFENCE_DEVICE": "195:3", "GPUFENCE_GPU_INDEX": "3",
		"GPUFENCE_SEQ": "1", "GPUFENCE_NODE": "gpu-node-1",
	} {
		if entry[k] != v {
			t.Errorf("journal field %s = %v, want %s", k, entry[k], v)
		}
	}
	if s, _ := entry["GPUFENCE_RECORD"].(string); validateLine(t, []byte(s)) != nil {
		t.Errorf("GPUFENCE_RECORD in the journal is not a valid record: %v", entry["GPUFENCE_RECORD"])
	}
}
