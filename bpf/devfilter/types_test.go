// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPolicyBitmap(t *testing.T) {
	caps := func(set map[int]uint64) (b [capsWords]uint64) {
		for w, v := range set {
			b[w] = v
		}
		return b
	}
	tests := []struct {
		name     string
		policy   Policy
		want     [4]uint64
		wantCaps [capsWords]uint64
		wantErr  string
	}{
		{name: "none", policy: Policy{}, want: [4]uint64{}},
		{name: "minor 0", policy: Policy{GPUMinors: []uint32{0}}, want: [4]uint64{1}},
		{name: "word edges", policy: Policy{GPUMinors: []uint32{63, 64, 127, 128, 253}},
			want: [4]uint64{1 << 63, 1 | 1<<63, 1, 1 << 61}},
		{name: "duplicates", policy: Policy{GPUMinors: []uint32{3, 3, 1}}, want: [4]uint64{0b1010}},
		{name: "modeset is not a GPU", policy: Policy{GPUMinors: []uint32{254}}, wantErr: "GPU minor 254"},
		{name: "nvidiactl is not a GPU", policy: Policy{GPUMinors: []uint32{1, 255}}, wantErr: "GPU minor 255"},
		{name: "MIG slice: parent GPU and its GI and CI caps", policy: Policy{GPUMinors: []uint32{1}, CapsMinors: []uint32{138, 139}},
			want: [4]uint64{2}, wantCaps: caps(map[int]uint64{2: 1<<10 | 1<<11})},
		{name: "caps word edges", policy: Policy{CapsMinors: []uint32{3, 63, 64, 4322, MaxCapsMinor}},
			wantCaps: caps(map[int]uint64{0: 1<<3 | 1<<63, 1: 1, 67: 1<<34 | 1<<63})},
		{name: "fabric-mgmt never granted", policy: Policy{CapsMinors: []uint32{0}}, wantErr: "nvidia-caps minor 0"},
		{name: "MIG config never granted", policy: Policy{CapsMinors: []uint32{21, 1}}, wantErr: "nvidia-caps minor 1"},
		{name: "MIG monitor never granted", policy: Policy{CapsMinors: []uint32{2}}, wantErr: "nvidia-caps minor 2"},
		{name: "caps minor above the bitmap", policy: Policy{CapsMinors: []uint32{MaxCapsMinor + 1}}, wantErr: "larger than 4351"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, gotCaps, err := tt.policy.bitmaps()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("bitmaps() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("bitmaps(): %v", err)
			}
			if got != tt.want || gotCaps != tt.wantCaps {
				t.Fatalf("bitmaps() = %#x, caps %#x; want %#x, caps %#x", got, gotCaps, tt.want, tt.wantCaps)
			}
			back := policyFromBitmaps(tt.policy.flags(), got[:], gotCaps[:], 0)
			wantMinors := slices.Compact(slices.Sorted(slices.Values(tt.policy.GPUMinors)))
			wantCapsMinors := slices.Compact(slices.Sorted(slices.Values(tt.policy.CapsMinors)))
			if !slices.Equal(back.GPUMinors, wantMinors) || !slices.Equal(back.CapsMinors, wantCapsMinors) || back.AllowAll != tt.policy.AllowAll {
				t.Fatalf("round trip = %+v, want minors %v, caps %v", back, wantMinors, wantCapsMinors)
			}
		})
	}
}

func TestPolicyAllowAllFlag(t *testing.T) {
	p := Policy{AllowAll: true, GPUMinors: []uint32{2}}
	b, c, err := p.bitmaps()
	if err != nil {
		t.Fatal(err)
	}
	back := policyFromBitmaps(p.flags(), b[:], c[:], 0)
	if !back.AllowAll || !slices.Equal(back.GPUMinors, []uint32{2}) {
		t.Fatalf("round trip = %+v, want AllowAll with minor 2", back)
	}
	if (Policy{}).flags() != 0 {
		t.Fatal("flags of an empty policy are not 0")
	}
}

// TestPolicyFlags: each flag is its own bit, as the program defines them
// (POLICY_ALLOW_ALL 1, POLICY_AUDIT_ONLY 2, POLICY_ROOT_ONLY 4), and
// survives the round trip through the map's word.
func TestPolicyFlags(t *testing.T) {
	tests := []struct {
		p    Policy
		want uint32
	}{
		{Policy{AllowAll: true}, 1},
		{Policy{AuditOnly: true}, 2},
		{Policy{RootOnly: true}, 4},
		{Policy{AllowAll: true, RootOnly: true}, 5},
		{Policy{AllowAll: true, AuditOnly: true, RootOnly: true}, 7},
	}
	for _, tt := range tests {
		if got := tt.p.flags(); got != tt.want {
			t.Errorf("flags(%+v) = %#x, want %#x", tt.p, got, tt.want)
		}
		if back := policyFromBitmaps(tt.want, nil, nil, 0); back.AllowAll != tt.p.AllowAll || back.AuditOnly != tt.p.AuditOnly || back.RootOnly != tt.p.RootOnly {
			t.Errorf("policyFromBitmaps(%#x) = %+v, want %+v", tt.want, back, tt.p)
		}
	}
}

func TestAccessString(t *testing.T) {
	tests := []struct {
		a    Access
		want string
	}{
		{0, "none"},
		{AccessMknod, "mknod"},
		{AccessRead | AccessWrite, "read,write"},
		{AccessMknod | AccessRead | AccessWrite, "mknod,read,write"},
		{AccessWrite | 0x10, "write,0x10"},
	}
	for _, tt := range tests {
		if got := tt.a.String(); got != tt.want {
			t.Errorf("Access(%#x).String() = %q, want %q", uint16(tt.a), got, tt.want)
		}
	}
}

func TestDecisionString(t *testing.T) {
	tests := []struct {
		d    Decision
		want string
	}{
		{DecisionDenied, "denied"},
		{DecisionAllowed, "allowed"},
		{DecisionWouldDeny, "would-deny"},
		{0, "Decision(0)"},
		{7, "Decision(7)"},
	}
	for _, tt := range tests {
		if got := tt.d.String(); got != tt.want {
			t.Errorf("Decision(%d).String() = %q, want %q", uint8(tt.d), got, tt.want)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name      string
		opts      Options
		wantMajor uint32
		// Audit fields after defaults; zero: AuditAllowedFirst, 1s, 5.
		wantAudit AuditAllowed
		wantRate  time.Duration
		wantBurst uint32
		wantErr   string
	}{
		{name: "defaults", opts: Options{ScopeDir: "/sys/fs/cgroup/system.slice/x_slurmstepd.scope"}, wantMajor: 195},
		{name: "audit settings kept", opts: Options{Mode: ModePerCgroup, AuditOnly: true, AuditAllowed: AuditAllowedAll, RateWindow: time.Millisecond, RateBurst: 1},
			wantMajor: 195, wantAudit: AuditAllowedAll, wantRate: time.Millisecond, wantBurst: 1},
		{name: "audit allowed none", opts: Options{Mode: ModePerCgroup, AuditAllowed: AuditAllowedNone}, wantMajor: 195, wantAudit: AuditAllowedNone},
		{name: "unknown audit allowed", opts: Options{Mode: ModePerCgroup, AuditAllowed: "some"}, wantErr: `AuditAllowed "some"`},
		{name: "negative rate window", opts: Options{Mode: ModePerCgroup, RateWindow: -time.Second}, wantErr: "RateWindow -1s"},
		{name: "scope", opts: Options{Mode: ModeScope, ScopeDir: "/sys/fs/cgroup/a", NvidiaMajor: 200}, wantMajor: 200},
		{name: "per-cgroup needs no scope", opts: Options{Mode: ModePerCgroup}, wantMajor: 195},
		{name: "unknown mode", opts: Options{Mode: "global", ScopeDir: "/a"}, wantErr: `Mode "global"`},
		{name: "auto needs scope", opts: Options{}, wantErr: "ScopeDir is required"},
		{name: "scope needs scope", opts: Options{Mode: ModeScope}, wantErr: "ScopeDir is required"},
		{name: "relative scope", opts: Options{ScopeDir: "system.slice/x.scope"}, wantErr: "not an absolute path"},
		{name: "major too large", opts: Options{ScopeDir: "/a", NvidiaMajor: 4096}, wantErr: "NvidiaMajor 4096"},
		{name: "caps major", opts: Options{ScopeDir: "/a", CapsMajor: 237}, wantMajor: 195},
		{name: "caps major too large", opts: Options{ScopeDir: "/a", CapsMajor: 4096}, wantErr: "CapsMajor 4096"},
		{name: "caps major is the NVIDIA major", opts: Options{ScopeDir: "/a", CapsMajor: 195}, wantErr: "the same as NvidiaMajor"},
		{name: "fabric majors", opts: Options{ScopeDir: "/a", CapsMajor: 237, NVSwitchMajor: 236, NVLinkMajor: 235}, wantMajor: 195},
		{name: "nvswitch major too large", opts: Options{ScopeDir: "/a", NVSwitchMajor: 4096}, wantErr: "NVSwitchMajor 4096: larger than 4095"},
		{name: "nvlink major too large", opts: Options{ScopeDir: "/a", NVLinkMajor: 5000}, wantErr: "NVLinkMajor 5000: larger than 4095"},
		{name: "nvswitch major is the NVIDIA major", opts: Options{ScopeDir: "/a", NVSwitchMajor: 195}, wantErr: "NVSwitchMajor 195: the same as NvidiaMajor"},
		{name: "nvlink major is the caps major", opts: Options{ScopeDir: "/a", CapsMajor: 237, NVLinkMajor: 237}, wantErr: "NVLinkMajor 237: the same as CapsMajor"},
		{name: "nvlink major is the nvswitch major", opts: Options{ScopeDir: "/a", NVSwitchMajor: 236, NVLinkMajor: 236}, wantErr: "NVLinkMajor 236: the same as NVSwitchMajor"},
		{name: "imex major", opts: Options{ScopeDir: "/a", CapsMajor: 237, NVSwitchMajor: 236, NVLinkMajor: 235, IMEXMajor: 234}, wantMajor: 195},
		{name: "imex major too large", opts: Options{ScopeDir: "/a", IMEXMajor: 4096}, wantErr: "IMEXMajor 4096: larger than 4095"},
		{name: "imex major is the caps major", opts: Options{ScopeDir: "/a", CapsMajor: 237, IMEXMajor: 237}, wantErr: "IMEXMajor 237: the same as CapsMajor"},
		{name: "imex major is the nvswitch major", opts: Options{ScopeDir: "/a", NVSwitchMajor: 236, IMEXMajor: 236}, wantErr: "IMEXMajor 236: the same as NVSwitchMajor or NVLinkMajor"},
		{name: "imex major is the nvlink major", opts: Options{ScopeDir: "/a", NVLinkMajor: 235, IMEXMajor: 235}, wantErr: "IMEXMajor 235: the same as NVSwitchMajor or NVLinkMajor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.opts.validate()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("validate() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("validate(): %v", err)
			}
			if got.NvidiaMajor != tt.wantMajor {
				t.Errorf("NvidiaMajor = %d, want %d", got.NvidiaMajor, tt.wantMajor)
			}
			if got.Logger == nil {
				t.Error("Logger not defaulted")
			}
			wantAudit, wantRate, wantBurst := tt.wantAudit, tt.wantRate, tt.wantBurst
			if wantAudit == "" {
				wantAudit = AuditAllowedFirst
			}
			if wantRate == 0 {
				wantRate = time.Second
			}
			if wantBurst == 0 {
				wantBurst = 5
			}
			if got.AuditAllowed != wantAudit || got.RateWindow != wantRate || got.RateBurst != wantBurst || got.AuditOnly != tt.opts.AuditOnly {
				t.Errorf("audit options = %q, %s, %d, audit-only %v; want %q, %s, %d, %v",
					got.AuditAllowed, got.RateWindow, got.RateBurst, got.AuditOnly, wantAudit, wantRate, wantBurst, tt.opts.AuditOnly)
			}
		})
	}
}
