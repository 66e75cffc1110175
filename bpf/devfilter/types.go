// SPDX-License-Identifier: Apache-2.0

// Package devfilter loads gpufence's cgroup device filter into the kernel,
// attaches it, writes per-cgroup GPU policies (GPU minors of the NVIDIA
// major, MIG capability minors of the nvidia-caps major) into its maps and
// reads the events it reports. The NVSwitch and NVLink management majors,
// when given, are denied to every cgroup the filter narrows that has no
// allow-all policy. It decides nothing about jobs: which cgroup may use
// which GPU is decided by the caller.
package devfilter

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"strings"
	"time"
)

// Mode is the way the filter is attached.
type Mode string

const (
	// ModeAuto picks ModeScope when the kernel supports it, else ModePerCgroup.
	ModeAuto Mode = ""
	// ModeScope attaches one program on the Slurm scope cgroup and looks up
	// the policy of each access by the step (or job) cgroup of the task.
	// Needs bpf_get_current_ancestor_cgroup_id for cgroup device programs
	// (Linux >= 6.1).
	ModeScope Mode = "scope"
	// ModePerCgroup attaches the program to each cgroup that gets a policy,
	// with the policy in the attachment's cgroup storage. Cgroups that never
	// got a policy are not narrowed.
	ModePerCgroup Mode = "per-cgroup"
)

// DefaultNvidiaMajor is the char major of /dev/nvidia[0-9]*, nvidiactl and
// nvidia-modeset.
const DefaultNvidiaMajor = 195

// MaxGPUMinor is the highest minor of the NVIDIA major that is a GPU; 254 is
// nvidia-modeset and 255 nvidiactl, which are never narrowed.
const MaxGPUMinor = 253

// MaxCapsMinor is the highest nvidia-caps minor a policy can grant. The
// driver numbers its capabilities 0 (nvlink fabric-mgmt), 1 (MIG config), 2
// (MIG monitor), then 135 per GPU for gpu0..gpu31 (15 GPU instances, each an
// access minor and 8 compute instance minors): at most 4322. The program's
// bitmap holds 68 words (0..4351); a larger minor is refused.
const MaxCapsMinor = capsWords*64 - 1

// FirstCapsAccessMinor is the lowest nvidia-caps minor a policy can grant:
// below it are fabric-mgmt, MIG config and MIG monitor, which are node
// administration (create and destroy MIG instances, watch every instance)
// and only allow-all entries open.
const FirstCapsAccessMinor = 3

// capsWords is the length of the program's caps bitmap (CAPS_WORDS);
// TestGeneratedLayout checks it against the generated struct.
const capsWords = 68

// maxMajor is the largest major a Linux dev_t can hold (12 bits).
const maxMajor = 1<<12 - 1

// ErrClosed is returned by ReadEvent once the filter is closed.
var ErrClosed = errors.New("device filter closed")

// Options configure New.
type Options struct {
	Mode Mode
	// ScopeDir is the absolute path of the slurmstepd scope cgroup directory
	// inside the cgroup2 mount. Required unless Mode is ModePerCgroup.
	ScopeDir string
	// NvidiaMajor is the char major of the GPU devices; 0 means 195.
	NvidiaMajor uint32
	// CapsMajor is the char major of /dev/nvidia-caps/nvidia-cap* (dynamic:
	// "nvidia-caps" in /proc/devices). 0 leaves that major unnarrowed, for
	// nodes whose driver has not registered it.
	CapsMajor uint32
	// NVSwitchMajor is the char major of /dev/nvidia-nvswitchctl and
	// /dev/nvidia-nvswitchN ("nvidia-nvswitch" in /proc/devices), NVLinkMajor
	// that of /dev/nvidia-nvlink ("nvidia-nvlink"). Every minor of each is
	// denied to what the filter narrows (job steps), and allowed only to
	// allow-all policies (Slurm's own cgroups). 0 leaves that major alone:
	// the driver has none, or the caller allows these nodes.
	NVSwitchMajor, NVLinkMajor uint32
	// IMEXMajor is the char major of the IMEX channel nodes
	// (/dev/nvidia-caps-imex-channels/channelN, dynamic:
	// "nvidia-caps-imex-channels" in /proc/devices); the minor is the
	// channel id. 0 leaves that major unnarrowed.
	IMEXMajor uint32
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
	// BeforeAttach, when set, is called with the loaded, configured and
	// pinned filter before its program is attached to the scope, so that
	// what it sets (the entries of running jobs the agent adopts, Slurm's
	// exempt cgroups) is in the map from the program's first run. In
	// ModePerCgroup, where every Set attaches, it is called after pinned
	// links are taken over. An error fails New.
	BeforeAttach func(*Filter) error
	// AuditOnly allows every access and reports each one the policy would
	// have denied as DecisionWouldDeny (for rollouts).
	AuditOnly bool
	// AuditAllowed says which allowed accesses are reported; "" means
	// AuditAllowedFirst.
	AuditAllowed AuditAllowed
	// RateWindow is the rate limit window of the reports; 0 means 1s.
	RateWindow time.Duration
	// RateBurst is how many reports per cgroup, device and decision one
	// window may carry, the others being counted as suppressed; 0 means 5.
	RateBurst uint32
	// PinDir is a directory on bpffs (e.g. /sys/fs/bpf/gpufence) where the
	// filter pins its maps and links so that enforcement outlives the
	// process, and where New adopts what a previous filter pinned. ""
	// pins nothing: Close then detaches.
	PinDir string
}

// AuditAllowed says which allowed GPU accesses the program reports.
type AuditAllowed string

const (
	// AuditAllowedNone reports no allowed access.
	AuditAllowedNone AuditAllowed = "none"
	// AuditAllowedFirst reports the first allowed access per cgroup and
	// device; the later ones are only counted (Filter.Suppressed).
	AuditAllowedFirst AuditAllowed = "first"
	// AuditAllowedAll reports every allowed access, rate-limited like
	// denials.
	AuditAllowedAll AuditAllowed = "all"
)

// Defaults of the rate limit of reports.
const (
	DefaultRateWindow = time.Second
	DefaultRateBurst  = 5
)

// validate checks the fields that need no kernel and fills defaults.
func (o Options) validate() (Options, error) {
	switch o.Mode {
	case ModeAuto, ModeScope, ModePerCgroup:
	default:
		return o, fmt.Errorf("devfilter options: Mode %q: want %q, %q or %q", o.Mode, ModeAuto, ModeScope, ModePerCgroup)
	}
	if o.ScopeDir == "" {
		if o.Mode != ModePerCgroup {
			return o, fmt.Errorf("devfilter options: ScopeDir is required in mode %q", o.Mode)
		}
	} else if !strings.HasPrefix(o.ScopeDir, "/") {
		return o, fmt.Errorf("devfilter options: ScopeDir %q: not an absolute path", o.ScopeDir)
	}
	if o.PinDir != "" && !strings.HasPrefix(o.PinDir, "/") {
		return o, fmt.Errorf("devfilter options: PinDir %q: not an absolute path", o.PinDir)
	}
	if o.NvidiaMajor == 0 {
		o.NvidiaMajor = DefaultNvidiaMajor
	}
	if o.NvidiaMajor > maxMajor {
		return o, fmt.Errorf("devfilter options: NvidiaMajor %d: larger than %d", o.NvidiaMajor, maxMajor)
	}
	if o.CapsMajor > maxMajor {
		return o, fmt.Errorf("devfilter options: CapsMajor %d: larger than %d", o.CapsMajor, maxMajor)
	}
	if o.CapsMajor != 0 && o.CapsMajor == o.NvidiaMajor {
		return o, fmt.Errorf("devfilter options: CapsMajor %d: the same as NvidiaMajor", o.CapsMajor)
	}
	for _, m := range []struct {
		name  string
		major uint32
	}{{"NVSwitchMajor", o.NVSwitchMajor}, {"NVLinkMajor", o.NVLinkMajor}, {"IMEXMajor", o.IMEXMajor}} {
		switch {
		case m.major == 0:
		case m.major > maxMajor:
			return o, fmt.Errorf("devfilter options: %s %d: larger than %d", m.name, m.major, maxMajor)
		case m.major == o.NvidiaMajor:
			return o, fmt.Errorf("devfilter options: %s %d: the same as NvidiaMajor", m.name, m.major)
		case m.major == o.CapsMajor:
			return o, fmt.Errorf("devfilter options: %s %d: the same as CapsMajor", m.name, m.major)
		}
	}
	if o.NVSwitchMajor != 0 && o.NVSwitchMajor == o.NVLinkMajor {
		return o, fmt.Errorf("devfilter options: NVLinkMajor %d: the same as NVSwitchMajor", o.NVLinkMajor)
	}
	if o.IMEXMajor != 0 && (o.IMEXMajor == o.NVSwitchMajor || o.IMEXMajor == o.NVLinkMajor) {
		return o, fmt.Errorf("devfilter options: IMEXMajor %d: the same as NVSwitchMajor or NVLinkMajor", o.IMEXMajor)
	}
	switch o.AuditAllowed {
	case "":
		o.AuditAllowed = AuditAllowedFirst
	case AuditAllowedNone, AuditAllowedFirst, AuditAllowedAll:
	default:
		return o, fmt.Errorf("devfilter options: AuditAllowed %q: want %q, %q or %q", o.AuditAllowed, AuditAllowedNone, AuditAllowedFirst, AuditAllowedAll)
	}
	if o.RateWindow < 0 {
		return o, fmt.Errorf("devfilter options: RateWindow %s: negative", o.RateWindow)
	}
	if o.RateWindow == 0 {
		o.RateWindow = DefaultRateWindow
	}
	if o.RateBurst == 0 {
		o.RateBurst = DefaultRateBurst
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Logger = o.Logger.With("component", "devfilter")
	return o, nil
}

// Policy says which GPU devices a cgroup may open.
type Policy struct {
	AllowAll bool
	// RootOnly narrows AllowAll to tasks whose real and effective uids are
	// both 0; any other task of the cgroup gets what the minors grant. For
	// Slurm's own cgroups, where only root has business with a GPU (NVML)
	// and a user's process (slurmd's sbcast child) has none. A program of
	// an older layout ignores it (allow-all to every task).
	RootOnly bool
	// AuditOnly allows what the policy does not and reports it as
	// would-deny, for this cgroup alone (a job adopted without slurmctld's
	// confirmation, adopt_unconfirmed: audit-only).
	AuditOnly bool
	// GPUMinors are minors of the NVIDIA major, 0..253; sorted when returned.
	GPUMinors []uint32
	// CapsMinors are minors of the nvidia-caps major (MIG GPU and compute
	// instance access), FirstCapsAccessMinor..MaxCapsMinor; sorted when
	// returned.
	CapsMinors []uint32
	// IMEXChannels are the IMEX channels (minors of the IMEX major) the
	// cgroup may open: none or one, as Slurm gives a job one channel per
	// node. Creating a channel node is always allowed (only root can).
	IMEXChannels []uint32
}

// MaxIMEXChannel is the highest IMEX channel a policy can grant: the
// largest minor a dev_t holds.
const MaxIMEXChannel = 1<<20 - 1

const (
	policyAllowAll  = 1 << 0
	policyAuditOnly = 1 << 1
	policyRootOnly  = 1 << 2
)

// bitmaps encodes the minors as the program reads them: bit n of word n/64.
func (p Policy) bitmaps() (gpus [4]uint64, caps [capsWords]uint64, err error) {
	for _, m := range p.GPUMinors {
		if m > MaxGPUMinor {
			return gpus, caps, fmt.Errorf("GPU minor %d: larger than %d", m, MaxGPUMinor)
		}
		gpus[m/64] |= 1 << (m % 64)
	}
	for _, m := range p.CapsMinors {
		if m < FirstCapsAccessMinor {
			return gpus, caps, fmt.Errorf("nvidia-caps minor %d: fabric-mgmt, MIG config and MIG monitor (0-%d) are never granted by a policy", m, FirstCapsAccessMinor-1)
		}
		if m > MaxCapsMinor {
			return gpus, caps, fmt.Errorf("nvidia-caps minor %d: larger than %d, the most the filter's bitmap holds", m, MaxCapsMinor)
		}
		caps[m/64] |= 1 << (m % 64)
	}
	return gpus, caps, nil
}

func (p Policy) flags() uint32 {
	var f uint32
	if p.AllowAll {
		f |= policyAllowAll
	}
	if p.AuditOnly {
		f |= policyAuditOnly
	}
	if p.RootOnly {
		f |= policyRootOnly
	}
	return f
}

// imexWord encodes the policy's IMEX channel as the program reads it: the
// channel plus one, 0 for none.
func (p Policy) imexWord() (uint32, error) {
	switch {
	case len(p.IMEXChannels) == 0:
		return 0, nil
	case len(p.IMEXChannels) > 1:
		return 0, fmt.Errorf("IMEX channels %v: a policy holds at most one", p.IMEXChannels)
	case p.IMEXChannels[0] > MaxIMEXChannel:
		return 0, fmt.Errorf("IMEX channel %d: larger than %d", p.IMEXChannels[0], MaxIMEXChannel)
	}
	return p.IMEXChannels[0] + 1, nil
}

func policyFromBitmaps(flags uint32, gpus []uint64, caps []uint64, imex uint32) Policy {
	p := Policy{AllowAll: flags&policyAllowAll != 0, AuditOnly: flags&policyAuditOnly != 0, RootOnly: flags&policyRootOnly != 0, GPUMinors: bitsOf(gpus), CapsMinors: bitsOf(caps)}
	if imex != 0 {
		p.IMEXChannels = []uint32{imex - 1}
	}
	return p
}

func bitsOf(words []uint64) []uint32 {
	var out []uint32
	for w, word := range words {
		for word != 0 {
			bit := bits.TrailingZeros64(word)
			out = append(out, uint32(w*64+bit))
			word &^= 1 << bit
		}
	}
	return out
}

// Access is the kernel's BPF_DEVCG_ACC_* bit set.
type Access uint16

// Access bits, as the kernel defines them.
const (
	AccessMknod Access = 1 << 0
	AccessRead  Access = 1 << 1
	AccessWrite Access = 1 << 2
)

// String lists the bits, like "read,write".
func (a Access) String() string {
	if a == 0 {
		return "none"
	}
	var parts []string
	for _, n := range []struct {
		bit  Access
		name string
	}{{AccessMknod, "mknod"}, {AccessRead, "read"}, {AccessWrite, "write"}} {
		if a&n.bit != 0 {
			parts = append(parts, n.name)
			a &^= n.bit
		}
	}
	if a != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint16(a)))
	}
	return strings.Join(parts, ",")
}

// Decision is what the program decided for an access.
type Decision uint8

// Decisions, as the program reports them.
const (
	DecisionDenied  Decision = 1
	DecisionAllowed Decision = 2
	// DecisionWouldDeny is an access allowed in audit-only mode that the
	// policy denies.
	DecisionWouldDeny Decision = 3
)

func (d Decision) String() string {
	switch d {
	case DecisionDenied:
		return "denied"
	case DecisionAllowed:
		return "allowed"
	case DecisionWouldDeny:
		return "would-deny"
	}
	return fmt.Sprintf("Decision(%d)", uint8(d))
}

// Event is one access reported by the program.
type Event struct {
	// CgroupID is the cgroup whose policy decided, or the step (else job)
	// cgroup of the task when none matched.
	CgroupID uint64
	// Time is CLOCK_MONOTONIC (bpf_ktime_get_ns) at the access.
	Time time.Duration
	// PID is the thread id, TGID the process id.
	PID, TGID, UID, GID uint32
	Major, Minor        uint32
	Access              Access
	Decision            Decision
	Comm                string
	// Suppressed is the suppressed total of the event's RateKey when it was
	// emitted: how many accesses of that key were not reported since the
	// key's entry was created. It only grows (but events from different
	// CPUs can arrive out of order), so differences give exact counts.
	Suppressed uint64
	// Exe is the file the process executed, as the kernel saw it at the
	// access (zero: unknown). /proc/<TGID>/exe, read later, may name
	// another program if the process has exec'd since.
	Exe ExeID
	// Start is when the process (thread group leader) started, on
	// CLOCK_BOOTTIME; 0 if unknown. A pid reused by another process has
	// another start.
	Start time.Duration
}

// ExeID identifies an executable file: its inode number and the device of
// its file system's superblock. The zero value means unknown.
type ExeID struct {
	Ino          uint64
	Major, Minor uint32
}

// Known says whether the kernel identified the file.
func (x ExeID) Known() bool { return x.Ino != 0 }

// RateKey is what reports are rate-limited by.
type RateKey struct {
	CgroupID     uint64
	Major, Minor uint32
	Decision     Decision
}
