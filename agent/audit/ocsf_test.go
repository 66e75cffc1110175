// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/tests/ocsf"
)

// everyKindRecords is sampleRecords plus the kinds and shapes it lacks, so
// that every event kind gpufence writes is there.
func everyKindRecords() []Record {
	uid := UID(1000)
	scope := "/sys/fs/cgroup/system.slice/slurmstepd.scope"
	return append(sampleRecords(),
		Record{Event: EventStaleEntryRemoved, Message: "removed the kernel entry of a cgroup that no longer exists", CgroupID: 4711},
		Record{Event: EventStepUnfiltered, Severity: SeverityError, Message: "job 14 step 0 ran without GPU isolation (failure=open)", JobID: 14, StepID: "0", UID: uid, Reason: "agent unreachable"},
		Record{Event: EventGPUIdle, Severity: SeverityNotice, Message: "job 12 held GPU 1 below 5% for 3600s", JobID: 12, User: "alice", UID: uid, GPU: &GPU{Index: 1, MIG: &MIG{Profile: "1g.10gb"}}, IdleSeconds: 3600, IdleThreshold: 5},
		Record{Event: EventGPUTableMismatch, Severity: SeverityError, Message: "slurmd -G and gres.conf disagree", Error: "sources_differ: slurmd -G lists 4 GPUs, gres.conf 8"},
		Record{Event: EventFilterReattached, Severity: SeverityWarning, Message: "filter re-attached to the new scope", Cgroup: scope, CgroupID: 99, Reason: "cgroup id 98 != 99"},
		Record{Event: EventJobAdopted, Severity: SeverityWarning, Message: "job 15 adopted unconfirmed", JobID: 15, PolicyMode: ModeAuditOnly, GPUs: []int{}, Cgroup: scope + "/job_15"},
		Record{Event: EventVerify, Severity: SeverityError, Message: "self-test failed", Cgroup: scope + "/gpufence-verify-77/given", CgroupID: 100, GPUs: []int{0}, PolicyMode: ModeEnforce, UID: UID(0), Error: "GPU 1 opened though not given"},
		Record{Event: EventGPUAccess, Severity: SeverityWarning, Message: "job 16 step 0 denied open of /dev/nvidia2 in a container", AccessTime: time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC), Decision: DecisionDenied, PolicyMode: ModeEnforce, JobID: 16, StepID: "0", User: "bob", UID: UID(1001), PID: 5151, Comm: "python3", ExeStatus: ExeOtherNamespace, ExeNamespacePath: "/usr/bin/python3", ExeMntNS: 4026532000, ExeDev: "0:52", ExeIno: 9, Device: &Device{Path: "/dev/nvidia2", Major: 195, Minor: 2, Kind: DeviceGPU}, GPU: &GPU{Index: 2}, Access: []string{"read", "write"}, Shares: []Share{{Kind: "shard", GPU: 2, Count: 5}}, CgroupID: 9900, Suppressed: 3},
		Record{Event: EventAccessSuppressed, Severity: SeverityWarning, Message: "4 more denied accesses in Slurm's own slurmd cgroup", Decision: DecisionWouldDeny, PolicyMode: ModeAuditOnly, Device: &Device{Path: "/dev/nvidia0", Major: 195, Minor: 0, Kind: DeviceGPU}, Suppressed: 4, CgroupID: 33, Reason: ReasonNonRootInSlurmCgroup},
	)
}

// ocsfWant is each kind's class and activity (docs/audit.md's table).
var ocsfWant = map[Event][2]int{
	EventGPUAccess:          {1001, 14},
	EventAccessSuppressed:   {1001, 14},
	EventAgentStart:         {6002, 3},
	EventAgentStop:          {6002, 4},
	EventConfigReload:       {6002, 99},
	EventPolicyApplied:      {6002, 99},
	EventPolicyReleased:     {6002, 99},
	EventJobWithoutProlog:   {6002, 99},
	EventStaleEntryRemoved:  {6002, 99},
	EventStepUnfiltered:     {6002, 99},
	EventGPUIdle:            {6002, 99},
	EventFilterReattached:   {6002, 99},
	EventJobAdopted:         {6002, 99},
	EventVerify:             {6002, 99},
	EventFilterAttachFailed: {6008, 1},
	EventLookupFailed:       {6008, 1},
	EventAuditLoss:          {6008, 1},
	EventGPUTableMismatch:   {6008, 1},
}

// pinnedOCSF is the pinned OCSF schema (tests/ocsf/schema), compiled.
func pinnedOCSF(t *testing.T) *ocsf.Schema {
	t.Helper()
	s, err := ocsf.Pinned()
	if err != nil {
		t.Fatalf("load the pinned OCSF schema: %v", err)
	}
	return s
}

func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func decodeOCSF(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("OCSF output is not a JSON object: %v\n%s", err, b)
	}
	return m
}

// Every kind's OCSF event, made from records read back from the JSON Lines
// file as gpufence audit tail reads them, validates against the pinned
// OCSF schema and carries the documented ids.
func TestOCSFValidatesAgainstSchema(t *testing.T) {
	s := pinnedOCSF(t)
	opts := testOptions(t)
	opts.RunID = testRunID
	opts.Host = Host{MachineID: "0123456789abcdef0123456789abcdef", FQDN: "gpu-node-1.cluster.example", EC2InstanceID: "i-0abc1234def567890"}
	p, err := New(opts, nil)
	must(t, err)
	recs := everyKindRecords()
	for _, r := range recs {
		p.Emit(r)
	}
	must(t, p.Close())
	got := readRecords(t, opts.File)
	if len(got) != len(recs) {
		t.Fatalf("%d records in the file, want %d", len(got), len(recs))
	}
	seen := map[Event]bool{}
	uids := map[string]bool{}
	for _, r := range got {
		b, err := OCSF(&r)
		if err != nil {
			t.Fatalf("OCSF(%s): %v", r.Event, err)
		}
		if bytes.ContainsAny(b, "\n\r") {
			t.Errorf("%s: the OCSF event is not one line: %s", r.Event, b)
		}
		if errs := s.Validate(b); len(errs) > 0 {
			t.Errorf("%s (seq %d) does not validate against OCSF %s:\n  %s\n%s", r.Event, r.Seq, OCSFVersion, strings.Join(errs, "\n  "), b)
		}
		seen[r.Event] = true
		ev := decodeOCSF(t, b)
		want := ocsfWant[r.Event]
		if strings.Contains(strings.Join(r.Access, ","), "mknod") {
			want[1] = 1
		}
		if ev["class_uid"] != json.Number(strconv.Itoa(want[0])) || ev["activity_id"] != json.Number(strconv.Itoa(want[1])) {
			t.Errorf("%s: class %v activity %v, want %v", r.Event, ev["class_uid"], ev["activity_id"], want)
		}
		meta := ev["metadata"].(map[string]any)
		uid := meta["uid"].(string)
		if uid != testRunID+":"+strconv.FormatUint(r.Seq, 10) || uids[uid] {
			t.Errorf("%s: metadata.uid %q not run_id:seq or repeated", r.Event, uid)
		}
		uids[uid] = true
		if meta["version"] != OCSFVersion || meta["event_code"] != string(r.Event) || meta["logged_time"] != json.Number(strconv.FormatInt(r.Time.UnixMilli(), 10)) {
			t.Errorf("%s: metadata %v", r.Event, meta)
		}
		wantTime := r.Time
		if !r.AccessTime.IsZero() {
			wantTime = r.AccessTime
		}
		if ev["time"] != json.Number(strconv.FormatInt(wantTime.UnixMilli(), 10)) {
			t.Errorf("%s: time %v, want %d", r.Event, ev["time"], wantTime.UnixMilli())
		}
		dev := ev["device"].(map[string]any)
		if dev["uid"] != opts.Host.MachineID || dev["instance_uid"] != opts.Host.EC2InstanceID || dev["hostname"] != opts.Host.FQDN || dev["name"] != "gpu-node-1" || dev["boot_uid"] != testBootID {
			t.Errorf("%s: device %v", r.Event, dev)
		}
		un, _ := ev["unmapped"].(map[string]any)
		if un["cluster"] != "research" {
			t.Errorf("%s: unmapped.cluster %v", r.Event, un["cluster"])
		}
		if r.Event != EventGPUAccess && r.Event != EventAccessSuppressed {
			continue
		}
		f := ev["file"].(map[string]any)
		if f["type_id"] != json.Number("3") || f["uid"] != strconv.Itoa(int(r.Device.Major))+":"+strconv.Itoa(int(r.Device.Minor)) {
			t.Errorf("%s: file %v, want a character device %d:%d", r.Event, f, r.Device.Major, r.Device.Minor)
		}
		disp := map[string]string{DecisionAllowed: "1", DecisionDenied: "2", DecisionWouldDeny: "15"}[r.Decision]
		if ev["disposition_id"] != json.Number(disp) || ev["status_detail"] != r.Decision {
			t.Errorf("%s %s: disposition_id %v, want %s", r.Event, r.Decision, ev["disposition_id"], disp)
		}
		if r.GPU != nil && un["gpu"] == nil {
			t.Errorf("%s: the GPU is not in unmapped: %v", r.Event, un)
		}
		proc, _ := ev["actor"].(map[string]any)["process"].(map[string]any)
		pf, _ := proc["file"].(map[string]any)
		switch {
		case r.ExeStatus == ExeVerified && (pf == nil || pf["path"] != r.Exe):
			t.Errorf("%s: verified exe %s not in actor.process.file: %v", r.Event, r.Exe, proc)
		case r.ExeStatus != ExeVerified && r.ExeStatus != "" && (pf != nil || un["exe_status"] != r.ExeStatus):
			// exe_now and a namespace's path never name the program.
			t.Errorf("%s: exe_status %s gave actor.process.file %v, unmapped %v", r.Event, r.ExeStatus, pf, un)
		}
	}
	for _, e := range Events {
		if !seen[e] {
			t.Errorf("no %s record was checked", e)
		}
	}
}

func TestOCSFEveryEventHasAClass(t *testing.T) {
	for _, e := range Events {
		if _, ok := ocsfClassOf[e]; !ok {
			t.Errorf("event %s has no OCSF class", e)
		}
		if _, ok := ocsfWant[e]; !ok {
			t.Errorf("event %s is not in the test's table", e)
		}
	}
	if _, err := OCSF(&Record{Event: "bogus", Time: time.Now()}); err == nil || !strings.Contains(err.Error(), `"bogus" has no OCSF mapping`) {
		t.Errorf("unknown event: %v", err)
	}
}

// The validator rejects what the OCSF schema does not allow; each case
// changes one thing in a valid event.
func TestOCSFValidatorRejects(t *testing.T) {
	s := pinnedOCSF(t)
	r := sampleRecords()[3] // a denied gpu_access
	r.Seq, r.RunID, r.BootID, r.Time, r.Node = 7, testRunID, testBootID, time.Now(), "gpu-node-1"
	good, err := OCSF(&r)
	must(t, err)
	if errs := s.Validate(good); len(errs) > 0 {
		t.Fatalf("the base event does not validate: %v\n%s", errs, good)
	}
	lc := Record{Event: EventAgentStart, Seq: 1, RunID: testRunID, Time: time.Now(), Node: "n", Severity: SeverityInfo}
	lcGood, err := OCSF(&lc)
	must(t, err)
	er := Record{Event: EventLookupFailed, Seq: 2, RunID: testRunID, Time: time.Now(), Node: "n", Severity: SeverityWarning, Error: "x"}
	erGood, err := OCSF(&er)
	must(t, err)
	for _, c := range []struct {
		name, want string
		base       []byte
		edit       func(m map[string]any)
	}{
		{"unknown attribute", "gpu_index: not an attribute of file_activity", good, func(m map[string]any) { m["gpu_index"] = 1 }},
		{"unknown nested attribute", "actor.process.gpu: not an attribute of process", good, func(m map[string]any) {
			m["actor"].(map[string]any)["process"].(map[string]any)["gpu"] = 1
		}},
		{"block device label on a character device", `file.type: "Character Device" does not match type_id 4, which is "Block Device"`, good, func(m map[string]any) {
			m["file"].(map[string]any)["type_id"] = 4
		}},
		{"bogus enum id", "file.type_id: 42 is not a value of its enum", good, func(m map[string]any) { m["file"].(map[string]any)["type_id"] = 42 }},
		{"bogus disposition", "disposition_id: 1500 is not a value of its enum", good, func(m map[string]any) { m["disposition_id"] = 1500 }},
		{"missing required file", "file: required by file_activity, missing", good, func(m map[string]any) { delete(m, "file") }},
		{"missing required file name", "file.name: required by file", good, func(m map[string]any) { delete(m["file"].(map[string]any), "name") }},
		{"missing metadata.version", "metadata.version: required by metadata", good, func(m map[string]any) { delete(m["metadata"].(map[string]any), "version") }},
		{"missing severity_id", "severity_id: required", good, func(m map[string]any) { delete(m, "severity_id") }},
		{"time as a string", "time: 2026-11-29T08:00:00Z, want an integer", good, func(m map[string]any) { m["time"] = "2026-11-29T08:00:00Z" }},
		{"uid as a number", "actor.user.uid: json.Number, want a string", good, func(m map[string]any) {
			m["actor"].(map[string]any)["user"].(map[string]any)["uid"] = json.Number("1000")
		}},
		{"wrong type_uid", "type_uid 100101 is not class_uid*100+activity_id = 100114", good, func(m map[string]any) { m["type_uid"] = 100101 }},
		{"wrong category", "category_uid 6: class 1001 is in category 1", good, func(m map[string]any) { m["category_uid"] = 6 }},
		{"class name mismatch", `class_name: "Process Activity" does not match class_uid 1001`, good, func(m map[string]any) { m["class_name"] = "Process Activity" }},
		{"type name mismatch", `type_name: "File System Activity: Read" does not match type_uid 100114, which is "File System Activity: Open"`, good, func(m map[string]any) { m["type_name"] = "File System Activity: Read" }},
		{"activity name mismatch", `activity_name: "Read" does not match activity_id 14, which is "Open"`, good, func(m map[string]any) { m["activity_name"] = "Read" }},
		{"profile not declared", "disposition_id: belongs to profile security_control", good, func(m map[string]any) {
			m["metadata"].(map[string]any)["profiles"] = []string{"host"}
		}},
		{"actor with nothing", "actor.actor needs at least one of", good, func(m map[string]any) { m["actor"] = map[string]any{} }},
		{"class with no such class", "class_uid 1999: no such class", good, func(m map[string]any) { m["class_uid"] = 1999 }},
		{"lifecycle without app", "app: required by application_lifecycle", lcGood, func(m map[string]any) { delete(m, "app") }},
		{"file attribute on a lifecycle event", "file: not an attribute of application_lifecycle", lcGood, func(m map[string]any) { m["file"] = map[string]any{"name": "x", "type_id": 1} }},
		{"app on an application error", "app: not an attribute of application_error", erGood, func(m map[string]any) { m["app"] = map[string]any{"name": "gpufence"} }},
		{"other with no name", "activity_name: must name the source's own value", lcGood, func(m map[string]any) {
			m["activity_id"], m["type_uid"], m["activity_name"] = 99, 600299, ""
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := decodeOCSF(t, c.base)
			c.edit(m)
			b, err := json.Marshal(m)
			must(t, err)
			errs := s.Validate(b)
			if !strings.Contains(strings.Join(errs, "\n"), c.want) {
				t.Errorf("validator said %q, want an error containing %q", errs, c.want)
			}
		})
	}
	// Anything goes inside unmapped.
	m := decodeOCSF(t, good)
	m["unmapped"].(map[string]any)["anything"] = map[string]any{"at": []any{1, "x"}}
	b, _ := json.Marshal(m)
	if errs := s.Validate(b); len(errs) > 0 {
		t.Errorf("unmapped members were checked: %v", errs)
	}
}

// The copy of the schema is the one SOURCE names: every file's SHA-256
// matches, and nothing is there that SOURCE does not list.
func TestOCSFSchemaPinned(t *testing.T) {
	f, err := os.Open(filepath.Join(ocsf.Dir(), "SOURCE"))
	must(t, err)
	defer f.Close()
	listed := map[string]bool{}
	fields := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		if k, v, ok := strings.Cut(l, ": "); ok && !strings.Contains(k, " ") {
			fields[k] = v
			continue
		}
		sum, name, ok := strings.Cut(l, "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SOURCE: line %q is neither a field nor a checksum", l)
		}
		b, err := os.ReadFile(filepath.Join(ocsf.Dir(), name))
		if err != nil {
			t.Errorf("SOURCE lists %s: %v", name, err)
			continue
		}
		got := sha256.Sum256(b)
		if hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s: SHA-256 %x, SOURCE says %s (the copy was edited; run make ocsf-schema)", name, got, sum)
		}
		listed[name] = true
	}
	must(t, sc.Err())
	if fields["tag"] != OCSFVersion || len(fields["commit"]) != 40 || fields["repository"] != "https://github.com/ocsf/ocsf-schema" {
		t.Errorf("SOURCE names %v; want tag %s, a commit, the OCSF repository", fields, OCSFVersion)
	}
	var v struct{ Version string }
	must(t, readJSONFile(filepath.Join(ocsf.Dir(), "version.json"), &v))
	if v.Version != OCSFVersion {
		t.Errorf("the pinned schema is %s, OCSFVersion %s", v.Version, OCSFVersion)
	}
	for _, want := range []string{"LICENSE", "dictionary.json", "categories.json", "events/base_event.json", "events/system/file_activity.json", "events/application/application_lifecycle.json", "events/application/application_error.json"} {
		if !listed[want] {
			t.Errorf("SOURCE does not list %s", want)
		}
	}
	must(t, filepath.WalkDir(ocsf.Dir(), func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(ocsf.Dir(), p)
		if rel != "SOURCE" && !listed[rel] {
			t.Errorf("%s is in the copy but not in SOURCE", rel)
		}
		return nil
	}))
}

// Records as an older agent, or an odd moment, wrote them still make
// valid events: no node, host or run id; a seq past OCSF's integer; a
// device without a path; a summary of no known job.
func TestOCSFSparseRecords(t *testing.T) {
	s := pinnedOCSF(t)
	for _, line := range []string{
		`{"schema_version":"1","seq":3,"boot_id":"` + testBootID + `","time":"2026-01-02T03:04:05.123456789Z","event":"agent_start","severity":"info","node":"","cluster":"","agent_version":"","message":""}`,
		`{"schema_version":"1","seq":4294967296,"run_id":"` + testRunID + `","time":"2026-01-02T03:04:05Z","event":"config_reload","severity":"notice","node":"n1","cluster":"c","agent_version":"v","message":"m"}`,
		`{"schema_version":"1","seq":5,"time":"2026-01-02T03:04:05Z","event":"gpu_access","severity":"warning","node":"n1","cluster":"c","agent_version":"v","message":"m","decision":"denied","policy_mode":"enforce","uid":0,"pid":1,"comm":"x","device":{"major":195,"minor":255},"access":["write"],"cgroup_id":1}`,
		`{"schema_version":"1","seq":6,"time":"2026-01-02T03:04:05Z","event":"access_suppressed","severity":"warning","node":"n1","cluster":"c","agent_version":"v","message":"m","decision":"would-deny","policy_mode":"audit-only","device":{"path":"/dev/nvidia0","major":195,"minor":0},"suppressed":2,"cgroup_id":1}`,
	} {
		var r Record
		must(t, json.Unmarshal([]byte(line), &r))
		b, err := OCSF(&r)
		if err != nil {
			t.Errorf("%s: %v", line, err)
			continue
		}
		if errs := s.Validate(b); len(errs) > 0 {
			t.Errorf("%s: %v\n%s", r.Event, errs, b)
		}
		ev := decodeOCSF(t, b)
		meta := ev["metadata"].(map[string]any)
		if _, ok := meta["sequence"]; ok != (r.Seq <= 1<<31-1) {
			t.Errorf("seq %d: metadata.sequence %v", r.Seq, meta["sequence"])
		}
		if r.Time.Nanosecond() > 0 && ev["time"] != json.Number(strconv.FormatInt(r.Time.UnixMilli(), 10)) {
			t.Errorf("time %v: %v", r.Time, ev["time"])
		}
	}
}
