// SPDX-License-Identifier: Apache-2.0

// Package audit turns access decisions and agent lifecycle events into
// numbered audit records and hands them to sinks (JSON Lines file, journald,
// syslog) without ever blocking the caller.
package audit

import (
	"encoding/json"
	"fmt"
	"time"
)

// SchemaVersion is the value of schema_version in every record; it changes
// only when a field changes meaning or is removed (docs/audit.schema.json).
const SchemaVersion = "1"

// Event names the kind of a record.
type Event string

// Event kinds (docs/audit.md describes each).
const (
	EventGPUAccess          Event = "gpu_access"
	EventAccessSuppressed   Event = "access_suppressed"
	EventAgentStart         Event = "agent_start"
	EventAgentStop          Event = "agent_stop"
	EventPolicyApplied      Event = "policy_applied"
	EventPolicyReleased     Event = "policy_released"
	EventFilterAttachFailed Event = "filter_attach_failed"
	EventLookupFailed       Event = "lookup_failed"
	EventConfigReload       Event = "config_reload"
	EventJobWithoutProlog   Event = "job_without_prolog"
	EventAuditLoss          Event = "audit_loss"
	// EventStaleEntryRemoved: at start, a kernel entry of a cgroup that no
	// longer exists (left by an earlier run) was removed.
	EventStaleEntryRemoved Event = "stale_entry_removed"
	// EventStepUnfiltered: the SPANK plugin let a step run without GPU
	// isolation (failure=open, agent unreachable); recorded from its spool.
	EventStepUnfiltered Event = "step_unfiltered"
	// EventGPUIdle: a job held a GPU below the idle utilization threshold
	// for longer than metrics.idle_audit_after (once per idle spell).
	EventGPUIdle Event = "gpu_idle"
	// EventGPUTableMismatch: Slurm's GPU table could not be confirmed: at
	// start, slurmd -G and gres.conf disagreed or slurmd -G failed (error
	// kinds sources_differ, slurmd_fewer, slurmd_failed, gres_unreadable),
	// or the table disagreed with the GPUs the NVIDIA driver reports; at a
	// reload (SIGHUP), the table had changed (table_changed). Severity
	// error when the agent therefore gives no GPU to any step.
	EventGPUTableMismatch Event = "gpu_table_mismatch"
	// EventFilterReattached: Slurm's scope cgroup was made again (same
	// path, new cgroup), so the filter's link was on a dead cgroup; the
	// program was re-attached to the live scope before any step was
	// answered. reason says which ids differed.
	EventFilterReattached Event = "filter_reattached"
	// EventJobAdopted: at start, a job was running with no record (first
	// install on a busy node, records lost); the agent asked slurmctld and
	// took it over: confirmed (its GPUs), unconfirmed (adopt_unconfirmed's
	// audit-only or deny, policy_mode says which), or refused (no GPU).
	// Also when an unconfirmed job is confirmed later.
	EventJobAdopted Event = "job_adopted"
	// EventVerify: gpufence verify ran its self-test on the node (a
	// throw-away cgroup given one GPU through the filter): passed (info) or
	// failed (error, naming each failed check).
	EventVerify Event = "verify"
)

// Events are every kind the agent writes, in the schema's order.
var Events = []Event{EventGPUAccess, EventAccessSuppressed, EventAgentStart, EventAgentStop, EventPolicyApplied,
	EventPolicyReleased, EventFilterAttachFailed, EventLookupFailed, EventConfigReload, EventJobWithoutProlog,
	EventAuditLoss, EventStaleEntryRemoved, EventStepUnfiltered, EventGPUIdle, EventGPUTableMismatch,
	EventFilterReattached, EventJobAdopted, EventVerify}

func knownEvent(e Event) bool {
	for _, k := range Events {
		if k == e {
			return true
		}
	}
	return false
}

// Severity is the record's importance; it maps to syslog and journald priorities.
type Severity string

// Severities, from least to most important.
const (
	SeverityInfo    Severity = "info"
	SeverityNotice  Severity = "notice"
	SeverityWarning Severity = "warning"
	SeverityError   Severity = "error"
)

// ExeStatus values: how the agent checked /proc/<pid>/exe, which it reads
// after the access, against the executable the kernel saw at the access.
const (
	// ExeVerified: the same file (inode and device), the same process
	// (start time), and the path names that file in the node's mount
	// namespace (PID 1's): Exe names the program of the access.
	ExeVerified = "verified"
	// ExeChanged: the same process runs another file now (it exec'd since
	// the access); ExeNow names the new program, not the one of the access.
	ExeChanged = "changed"
	// ExeExited: the process was gone (or its pid was another process's)
	// when the agent looked.
	ExeExited = "exited"
	// ExeUnverified: the kernel gave no identity to check against (a task
	// without mm, an older program), or the file's device as stat shows it
	// is not its superblock's (btrfs subvolumes, some overlayfs setups),
	// or, in the node's mount namespace, the path no longer names the
	// file (replaced or deleted since the exec): ExeNow is what /proc
	// showed, unconfirmed.
	ExeUnverified = "unverified"
	// ExeOtherNamespace: the same process runs the file of the access, in
	// another mount namespace than the node's (a container, a user's own
	// after unshare), where its path names it; in the node's namespace
	// that path is another file or none. ExeNamespacePath is that path,
	// ExeDev/ExeIno the file, ExeMntNS the namespace.
	ExeOtherNamespace = "other_namespace"
)

// ReasonNonRootInSlurmCgroup is the reason of a gpu_access record denied
// (or would-deny) in one of Slurm's own cgroups (system, slurmd): they keep
// every device for root (slurmd's NVML, slurmstepd's --gpu-freq), not for
// a process there that runs as a user, such as the child slurmd forks to
// open an sbcast destination as the job's user.
const ReasonNonRootInSlurmCgroup = "non-root process in Slurm's own cgroup"

// Decisions and policy modes of a gpu_access record.
const (
	DecisionAllowed   = "allowed"
	DecisionDenied    = "denied"
	DecisionWouldDeny = "would-deny"

	ModeEnforce   = "enforce"
	ModeAuditOnly = "audit-only"
)

// Record is one audit record, written as one JSON object per line. Fields
// without omitempty/omitzero are present in every record.
type Record struct {
	SchemaVersion string `json:"schema_version"`
	Seq           uint64 `json:"seq"`
	// RunID is the agent run's random 128-bit id (32 hex digits), made at
	// its start: (run_id, seq) names one record across restarts and boots.
	RunID        string    `json:"run_id"`
	BootID       string    `json:"boot_id"`
	Time         time.Time `json:"time"`
	Event        Event     `json:"event"`
	Severity     Severity  `json:"severity"`
	Node         string    `json:"node"`
	Cluster      string    `json:"cluster"`
	AgentVersion string    `json:"agent_version"`
	// Host identifies the machine beyond the node name (machine id, FQDN,
	// EC2 instance id), where the agent learnt them at its start.
	Host    *Host  `json:"host,omitempty"`
	Message string `json:"message"`

	// AccessTime (gpu_access) is the kernel's time of the access: the BPF
	// program's CLOCK_MONOTONIC (bpf_ktime_get_ns) converted to wall clock.
	AccessTime time.Time `json:"access_time,omitzero"`

	Decision   string `json:"decision,omitempty"`
	PolicyMode string `json:"policy_mode,omitempty"`
	JobID      uint32 `json:"job_id,omitempty"`
	StepID     string `json:"step_id,omitempty"`
	User       string `json:"user,omitempty"`
	// UID is a pointer because uid 0 (root) is a real value.
	UID *uint32 `json:"uid,omitempty"`
	PID uint32  `json:"pid,omitempty"`
	// Comm is the kernel's name of the process at the access, Escape'd
	// (the process chooses it).
	Comm string `json:"comm,omitempty"`
	// Exe is /proc/<pid>/exe, Escape'd, only when it was checked to be
	// the program the process ran at the access (ExeStatus verified).
	Exe string `json:"exe,omitempty"`
	// ExeStatus says how Exe was checked (ExeVerified, ...).
	ExeStatus string `json:"exe_status,omitempty"`
	// ExeNow is /proc/<pid>/exe, Escape'd, when it could not be checked
	// or names another program than the one of the access: read after
	// the access, it is what the process runs now.
	ExeNow string `json:"exe_now,omitempty"`
	// ExeNamespacePath is /proc/<pid>/exe, Escape'd, when ExeStatus is
	// ExeOtherNamespace: the program of the access, named as the process's
	// mount namespace names it (not a path on the node).
	ExeNamespacePath string `json:"exe_namespace_path,omitempty"`
	// ExeMntNS is the inode of the process's mount namespace (as in
	// /proc/<pid>/ns/mnt) when it is not the node's.
	ExeMntNS uint64 `json:"exe_mnt_ns,omitempty"`
	// ExeDev ("major:minor" of its file system) and ExeIno identify the
	// executable the kernel saw at the access.
	ExeDev     string   `json:"exe_dev,omitempty"`
	ExeIno     uint64   `json:"exe_ino,omitempty"`
	Device     *Device  `json:"device,omitempty"`
	GPU        *GPU     `json:"gpu,omitempty"`
	Access     []string `json:"access,omitempty"`
	Suppressed uint64   `json:"suppressed,omitempty"`
	CgroupID   uint64   `json:"cgroup_id,omitempty"`
	// GPUs is omitted when nil; an empty non-nil list means "no GPU".
	GPUs []int `json:"gpus,omitzero"`
	// Shares are the shared GRES (gres/shard, gres/mps) the record's job
	// holds on the node, as slurmctld allocated them; omitted for a job
	// that holds none or while slurmctld has not said (agent/shares).
	Shares []Share `json:"shares,omitempty"`
	Cgroup string  `json:"cgroup,omitempty"`
	Reason string  `json:"reason,omitempty"`
	Error  string  `json:"error,omitempty"`
	Loss   *Loss   `json:"loss,omitempty"`
	// IdleSeconds and IdleThreshold (percent utilization): gpu_idle only.
	IdleSeconds   uint64 `json:"idle_seconds,omitempty"`
	IdleThreshold uint32 `json:"idle_threshold,omitempty"`

	// PrevHash and Hash chain the records of one run in the JSON Lines
	// file (chain.go); only the file sink sets them. Hash stays the last
	// field: it is the SHA-256 of the line written without it.
	PrevHash string `json:"prev_hash,omitempty"`
	Hash     string `json:"hash,omitempty"`
}

// Share is one shared GRES a job holds on a GPU.
type Share struct {
	// Kind is "shard" or "mps".
	Kind string `json:"kind"`
	// GPU is the GPU's index on the node.
	GPU int `json:"gpu"`
	// Count is how many shards (mps: percent of the GPU) the job holds
	// there; omitted where slurmctld names only a job's total (22.05, a
	// share over several GPUs).
	Count uint64 `json:"count,omitempty"`
}

func (s Share) String() string {
	if s.Count == 0 {
		return fmt.Sprintf("%s on GPU %d", s.Kind, s.GPU)
	}
	return fmt.Sprintf("%s:%d on GPU %d", s.Kind, s.Count, s.GPU)
}

// Device is the device node an access was about.
type Device struct {
	Path  string `json:"path,omitempty"`
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
	// Kind is what the filter narrowed it as (DeviceGPU, ...), where the
	// agent knows it.
	Kind string `json:"kind,omitempty"`
}

// Device kinds: a GPU node of Slurm's table (/dev/nvidiaN), a MIG
// capability node of it (/dev/nvidia-caps/nvidia-capN), an NVSwitch
// management node (/dev/nvidia-nvswitchctl, /dev/nvidia-nvswitchN), the
// NVLink management node (/dev/nvidia-nvlink), an IMEX channel
// (/dev/nvidia-caps-imex-channels/channelN, minor N).
const (
	DeviceGPU           = "gpu"
	DeviceMIGCapability = "mig_capability"
	DeviceNVSwitch      = "nvswitch"
	DeviceNVLink        = "nvlink"
	DeviceIMEXChannel   = "imex_channel"
)

// GPU is the GPU behind a device, where the node's GPU table knows it.
type GPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid,omitempty"`
	// MIG is set when the index is a MIG slice (a MultipleFiles= record).
	MIG *MIG `json:"mig,omitempty"`
}

// MIG describes the MIG slice behind a GPU index.
type MIG struct {
	// Profile is the slice's gres Type (e.g. 1g.10gb), where gres.conf
	// names one.
	Profile string `json:"profile,omitempty"`
}

// Loss counts records that were not written, since the previous audit_loss
// record of the same origin (the pipeline, or the sink named in Sink).
type Loss struct {
	QueueDropped uint64            `json:"queue_dropped"`
	RingbufLost  uint64            `json:"ringbuf_lost"`
	SinkFailed   map[string]uint64 `json:"sink_failed"`
	SinkDropped  map[string]uint64 `json:"sink_dropped,omitempty"`
	// Sink is set when a sink reports its own loss; LostSeqs then lists the
	// seq numbers that sink did not write.
	Sink          string     `json:"sink,omitempty"`
	LostSeqs      []SeqRange `json:"lost_seqs,omitempty"`
	SeqsTruncated bool       `json:"seqs_truncated,omitempty"`
	// RateFull counts, by decision, accesses the kernel counted without a
	// rate key because its rate table was full: they have no record, no
	// job, no device; their decisions stood.
	RateFull map[string]uint64 `json:"rate_full,omitempty"`
}

// SeqRange is an inclusive range of seq numbers.
type SeqRange struct {
	First uint64 `json:"first"`
	Last  uint64 `json:"last"`
}

// UID returns a pointer for Record.UID.
func UID(uid uint32) *uint32 { return &uid }

// MarshalJSON writes time in UTC with nanoseconds, whatever its location.
func (r Record) MarshalJSON() ([]byte, error) {
	type plain Record
	p := plain(r)
	p.Time = p.Time.UTC()
	if !p.AccessTime.IsZero() {
		p.AccessTime = p.AccessTime.UTC()
	}
	return json.Marshal(p)
}
