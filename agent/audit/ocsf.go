// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"path"
	"strconv"
	"time"
)

// OCSFVersion is the OCSF schema release the OCSF output follows
// (metadata.version); the tests validate against a pinned copy of it
// (tests/ocsf/schema/SOURCE).
const OCSFVersion = "1.8.0"

// OCSF class, category and activity ids used (docs/audit.md, "OCSF").
const (
	ocsfCategorySystem      = 1
	ocsfCategoryApplication = 6

	ocsfClassFileActivity = 1001
	ocsfClassAppLifecycle = 6002
	ocsfClassAppError     = 6008

	ocsfActivityCreate = 1  // File System Activity: Create (mknod)
	ocsfActivityOpen   = 14 // File System Activity: Open
	ocsfActivityStart  = 3  // Application Lifecycle: Start
	ocsfActivityStop   = 4  // Application Lifecycle: Stop
	ocsfActivityError  = 1  // Application Error: General Error
	ocsfActivityOther  = 99 // any class: Other (activity_name says which)
)

type ocsfClass struct {
	uid, category int
	name, catName string
}

var (
	ocsfFileActivity = ocsfClass{ocsfClassFileActivity, ocsfCategorySystem, "File System Activity", "System Activity"}
	ocsfAppLifecycle = ocsfClass{ocsfClassAppLifecycle, ocsfCategoryApplication, "Application Lifecycle", "Application Activity"}
	ocsfAppError     = ocsfClass{ocsfClassAppError, ocsfCategoryApplication, "Application Error", "Application Activity"}
)

// ocsfClassOf is the class of each event kind; every kind in Events has one.
var ocsfClassOf = map[Event]ocsfClass{
	EventGPUAccess:          ocsfFileActivity,
	EventAccessSuppressed:   ocsfFileActivity,
	EventAgentStart:         ocsfAppLifecycle,
	EventAgentStop:          ocsfAppLifecycle,
	EventConfigReload:       ocsfAppLifecycle,
	EventPolicyApplied:      ocsfAppLifecycle,
	EventPolicyReleased:     ocsfAppLifecycle,
	EventJobWithoutProlog:   ocsfAppLifecycle,
	EventStaleEntryRemoved:  ocsfAppLifecycle,
	EventStepUnfiltered:     ocsfAppLifecycle,
	EventGPUIdle:            ocsfAppLifecycle,
	EventFilterReattached:   ocsfAppLifecycle,
	EventJobAdopted:         ocsfAppLifecycle,
	EventVerify:             ocsfAppLifecycle,
	EventFilterAttachFailed: ocsfAppError,
	EventLookupFailed:       ocsfAppError,
	EventAuditLoss:          ocsfAppError,
	EventGPUTableMismatch:   ocsfAppError,
}

// ocsfActivity is the activity of r in its class, and its caption.
func ocsfActivity(c ocsfClass, r *Record) (int, string) {
	switch c.uid {
	case ocsfClassFileActivity:
		for _, a := range r.Access {
			if a == "mknod" {
				return ocsfActivityCreate, "Create"
			}
		}
		return ocsfActivityOpen, "Open"
	case ocsfClassAppError:
		return ocsfActivityError, "General Error"
	}
	switch r.Event {
	case EventAgentStart:
		return ocsfActivityStart, "Start"
	case EventAgentStop:
		return ocsfActivityStop, "Stop"
	}
	// OCSF's convention for Other: the name is the source's own.
	return ocsfActivityOther, string(r.Event)
}

// typeActivity is the activity's part of type_name: the schema's caption,
// "Other" for 99 whatever activity_name says.
func typeActivity(id int, name string) string {
	if id == ocsfActivityOther {
		return "Other"
	}
	return name
}

func ocsfSeverity(s Severity) (int, string) {
	switch s {
	case SeverityInfo:
		return 1, "Informational"
	case SeverityNotice:
		return 2, "Low"
	case SeverityWarning:
		return 3, "Medium"
	case SeverityError:
		return 4, "High"
	}
	return 0, "Unknown"
}

// ocsfMapped are the record's members an OCSF attribute carries (in every
// class); whatever else the record holds goes to unmapped. The hash
// chain's members belong to the JSON Lines file, not to the event.
var ocsfMapped = []string{"seq", "run_id", "boot_id", "time", "access_time", "event", "severity", "node", "host",
	"agent_version", "message", "error", "prev_hash", "hash"}

// ocsfFileMapped are those File System Activity maps besides.
var ocsfFileMapped = []string{"decision", "user", "uid", "pid", "comm", "device", "suppressed"}

type obj = map[string]any

// OCSF turns one audit record into one OCSF event (OCSFVersion): a JSON
// object on one line, without a newline. It works on a record as the
// pipeline made it and on one decoded from a line of the JSON Lines file.
func OCSF(r *Record) ([]byte, error) {
	c, ok := ocsfClassOf[r.Event]
	if !ok {
		return nil, fmt.Errorf("ocsf: record %d: event %q has no OCSF mapping", r.Seq, Printable(string(r.Event)))
	}
	if r.Time.IsZero() {
		return nil, fmt.Errorf("ocsf: record %d (%s) has no time", r.Seq, r.Event)
	}
	rest, err := recordMembers(r)
	if err != nil {
		return nil, fmt.Errorf("ocsf: record %d: %w", r.Seq, err)
	}
	for _, k := range ocsfMapped {
		delete(rest, k)
	}

	activity, activityName := ocsfActivity(c, r)
	sev, sevName := ocsfSeverity(r.Severity)
	product := obj{"name": "gpufence", "vendor_name": "gpufence"}
	if r.AgentVersion != "" {
		product["version"] = r.AgentVersion
	}
	meta := obj{
		"version":     OCSFVersion,
		"product":     product,
		"event_code":  string(r.Event),
		"logged_time": ms(r.Time),
		"profiles":    []string{"host"},
	}
	if r.RunID != "" {
		meta["uid"] = r.RunID + ":" + strconv.FormatUint(r.Seq, 10)
	}
	if r.Seq > 0 && r.Seq <= math.MaxInt32 {
		meta["sequence"] = r.Seq
	}
	ev := obj{
		"class_uid":     c.uid,
		"class_name":    c.name,
		"category_uid":  c.category,
		"category_name": c.catName,
		"activity_id":   activity,
		"activity_name": activityName,
		"type_uid":      c.uid*100 + activity,
		"type_name":     c.name + ": " + typeActivity(activity, activityName),
		"severity_id":   sev,
		"severity":      sevName,
		"time":          ms(r.Time),
		"metadata":      meta,
		"device":        ocsfDevice(r),
	}
	if r.Message != "" {
		ev["message"] = r.Message
	}
	if r.Error != "" {
		ev["status_detail"] = r.Error
	}
	if r.Host != nil && r.Host.EC2InstanceID != "" {
		ev["cloud"] = obj{"provider": "AWS"}
		meta["profiles"] = append(meta["profiles"].([]string), "cloud")
	}

	switch c.uid {
	case ocsfClassFileActivity:
		for _, k := range ocsfFileMapped {
			delete(rest, k)
		}
		ocsfFileEvent(ev, r, rest)
		meta["profiles"] = append(meta["profiles"].([]string), "security_control")
	case ocsfClassAppLifecycle:
		ev["app"] = product
		ocsfStatus(ev, r)
	case ocsfClassAppError:
		ev["status_id"], ev["status"] = 2, "Failure"
	}
	if len(rest) > 0 {
		ev["unmapped"] = rest
	}
	return json.Marshal(ev)
}

// ocsfStatus: a lifecycle record of severity error (a failed self-test,
// a refused adoption) is a failure; the others succeeded.
func ocsfStatus(ev obj, r *Record) {
	if r.Severity == SeverityError {
		ev["status_id"], ev["status"] = 2, "Failure"
	} else {
		ev["status_id"], ev["status"] = 1, "Success"
	}
}

func ocsfFileEvent(ev obj, r *Record, rest obj) {
	if !r.AccessTime.IsZero() {
		ev["time"] = ms(r.AccessTime)
	}
	switch r.Decision {
	case DecisionAllowed:
		ev["disposition_id"], ev["disposition"] = 1, "Allowed"
		ev["action_id"], ev["action"] = 1, "Allowed"
		ev["status_id"], ev["status"] = 1, "Success"
	case DecisionDenied:
		ev["disposition_id"], ev["disposition"] = 2, "Blocked"
		ev["action_id"], ev["action"] = 2, "Denied"
		ev["status_id"], ev["status"] = 2, "Failure"
	case DecisionWouldDeny:
		// Audit-only: the open went ahead; the policy would have refused it.
		ev["disposition_id"], ev["disposition"] = 15, "Detected"
		ev["action_id"], ev["action"] = 1, "Allowed"
		ev["status_id"], ev["status"] = 1, "Success"
	}
	if r.Decision != "" {
		ev["status_detail"] = r.Decision
	}
	if r.Error != "" {
		rest["error"] = r.Error
	}
	switch r.Event {
	case EventGPUAccess:
		ev["count"] = clampInt32(r.Suppressed + 1)
	case EventAccessSuppressed:
		ev["count"] = clampInt32(r.Suppressed)
	}

	actor := obj{}
	user := obj{}
	if r.User != "" {
		user["name"] = r.User
	}
	if r.UID != nil {
		user["uid"] = strconv.FormatUint(uint64(*r.UID), 10)
	}
	if len(user) > 0 {
		actor["user"] = user
	}
	if r.PID != 0 {
		proc := obj{"pid": r.PID}
		if r.Comm != "" {
			proc["name"] = r.Comm
		}
		// Only a verified exe is the program of the access; exe_now and
		// exe_namespace_path stay in unmapped (docs/audit.md).
		if r.Exe != "" {
			f := obj{"path": r.Exe, "name": path.Base(r.Exe), "type_id": 8, "type": "Executable File"}
			if r.ExeDev != "" && r.ExeIno != 0 {
				f["uid"] = r.ExeDev + ":" + strconv.FormatUint(r.ExeIno, 10)
				delete(rest, "exe_dev")
				delete(rest, "exe_ino")
			}
			proc["file"] = f
			delete(rest, "exe")
		}
		actor["process"] = proc
	}
	if len(actor) == 0 {
		// A summary of accesses in a cgroup of no known job names no
		// process or user, and OCSF requires an actor: the agent that
		// counted them.
		actor["app_name"] = "gpufence"
	}
	ev["actor"] = actor

	if d := r.Device; d != nil {
		f := obj{"type_id": 3, "type": "Character Device", "uid": fmt.Sprintf("%d:%d", d.Major, d.Minor)}
		if d.Path != "" {
			f["path"] = d.Path
			f["name"] = path.Base(d.Path)
		} else {
			f["name"] = fmt.Sprintf("char %d:%d", d.Major, d.Minor)
		}
		ev["file"] = f
		if d.Kind != "" {
			rest["device_kind"] = d.Kind
		}
	}
}

func ocsfDevice(r *Record) obj {
	d := obj{"type_id": 1, "type": "Server"}
	if r.Node != "" {
		d["name"] = r.Node
		d["hostname"] = r.Node
	}
	if r.BootID != "" {
		d["boot_uid"] = r.BootID
	}
	if h := r.Host; h != nil {
		if h.FQDN != "" {
			d["hostname"] = h.FQDN
		}
		if h.MachineID != "" {
			d["uid"] = h.MachineID
		}
		if h.EC2InstanceID != "" {
			d["instance_uid"] = h.EC2InstanceID
		}
	}
	if d["name"] == nil && d["hostname"] == nil && d["uid"] == nil && d["instance_uid"] == nil {
		// OCSF's device needs a name or an id; a record that names
		// neither node nor host (an older agent's) still comes from one.
		d["name"] = "unknown"
	}
	return d
}

// recordMembers is r as the JSON Lines file holds it, as a map whose
// numbers keep their exact value.
func recordMembers(r *Record) (obj, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m obj
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func clampInt32(n uint64) uint64 { return min(n, math.MaxInt32) }
