// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/asm"
	"github.com/gpufence/gpufence/agent/mountinfo"
)

// The fallback program must load where a CGROUP_DEVICE program gets only
// cgroup_base_func_proto and, for a CAP_PERFMON loader, bpf_base_func_proto:
// the kernels before 6.1 (5.12 and later have the ring buffer and atomics
// the program needs). These are those helpers.
var preLinux61CgroupDeviceHelpers = map[asm.BuiltinFunc]bool{
	asm.FnMapLookupElem:       true,
	asm.FnMapUpdateElem:       true,
	asm.FnMapDeleteElem:       true,
	asm.FnKtimeGetNs:          true,
	asm.FnGetCurrentUidGid:    true,
	asm.FnGetLocalStorage:     true,
	asm.FnGetCurrentTask:      true,
	asm.FnProbeReadKernel:     true,
	asm.FnProbeReadKernelStr:  true,
	asm.FnRingbufReserve:      true,
	asm.FnRingbufSubmit:       true,
	asm.FnRingbufDiscard:      true,
	asm.FnRingbufOutput:       true,
	asm.FnGetSmpProcessorId:   true,
	asm.FnGetPrandomU32:       true,
	asm.FnKtimeGetBootNs:      true,
	asm.FnKtimeGetCoarseNs:    true,
	asm.FnGetNumaNodeId:       true,
	asm.FnMapLookupPercpuElem: true,
}

// Linux 6.1 adds cgroup_current_func_proto to CGROUP_DEVICE programs; of
// it, measured on Debian 12's 6.1.0-50 (TestPrivilegedProbeFindsAncestorHelper
// logs the list): get_current_ancestor_cgroup_id, get_current_cgroup_id,
// get_current_pid_tgid, get_current_comm. The scope program must load there
// (Amazon Linux 2023 runs 6.1).
var linux61CgroupDeviceHelpers = func() map[asm.BuiltinFunc]bool {
	m := map[asm.BuiltinFunc]bool{
		asm.FnGetCurrentAncestorCgroupId: true, asm.FnGetCurrentCgroupId: true,
		asm.FnGetCurrentPidTgid: true, asm.FnGetCurrentComm: true,
	}
	for h := range preLinux61CgroupDeviceHelpers {
		m[h] = true
	}
	return m
}()

func programHelpers(t *testing.T, name string) []asm.BuiltinFunc {
	t.Helper()
	spec, err := loadDevfilter()
	if err != nil {
		t.Fatal(err)
	}
	prog := spec.Programs[name]
	if prog == nil {
		t.Fatalf("program %s not in the object", name)
	}
	var helpers []asm.BuiltinFunc
	for _, ins := range prog.Instructions {
		if ins.IsBuiltinCall() {
			helpers = append(helpers, asm.BuiltinFunc(ins.Constant))
		}
	}
	if len(helpers) == 0 {
		t.Fatalf("program %s calls no helper; instructions not read?", name)
	}
	return helpers
}

func TestProgramHelpersExistOnOlderKernels(t *testing.T) {
	for _, tc := range []struct {
		prog, kernel string
		offered      map[asm.BuiltinFunc]bool
	}{
		{"devfilter_cgroup", "Linux before 6.1", preLinux61CgroupDeviceHelpers},
		{"devfilter_scope", "Linux 6.1", linux61CgroupDeviceHelpers},
	} {
		for _, h := range programHelpers(t, tc.prog) {
			if !tc.offered[h] {
				t.Errorf("%s calls %s, which %s does not offer to CGROUP_DEVICE programs", tc.prog, h, tc.kernel)
			}
		}
	}
}

// unprobedHelpers are offered to CGROUP_DEVICE programs by every kernel with
// ring buffers (which Probe checks): map, time and uid helpers since the
// program type exists, ring buffer helpers with the map type.
var unprobedHelpers = map[asm.BuiltinFunc]bool{
	asm.FnMapLookupElem: true, asm.FnMapUpdateElem: true, asm.FnMapDeleteElem: true,
	asm.FnKtimeGetNs: true, asm.FnGetCurrentUidGid: true,
	asm.FnRingbufReserve: true, asm.FnRingbufSubmit: true, asm.FnRingbufDiscard: true, asm.FnRingbufOutput: true,
}

func TestProbedHelpersCoverPrograms(t *testing.T) {
	// Probe must check every helper a program needs beyond the base set, or
	// it could pick a mode whose program then fails to load; and nothing
	// more, or it could refuse a mode the kernel supports.
	for name, probed := range map[string][]asm.BuiltinFunc{
		"devfilter_scope":  scopeHelpers,
		"devfilter_cgroup": perCgroupHelpers,
	} {
		called := map[asm.BuiltinFunc]bool{}
		for _, h := range programHelpers(t, name) {
			called[h] = true
			if !unprobedHelpers[h] && !slices.Contains(probed, h) {
				t.Errorf("%s calls %s but Probe does not check it", name, h)
			}
		}
		for _, h := range probed {
			if !called[h] {
				t.Errorf("Probe checks %s for %s, which does not call it", h, name)
			}
		}
	}
}

func TestGeneratedLayout(t *testing.T) {
	if got := unsafe.Sizeof(devfilterEvent{}); got != 96 {
		t.Errorf("event is %d bytes, want 96", got)
	}
	// The executable's identity came after the first layout's end.
	if off := unsafe.Offsetof(devfilterEvent{}.ExeIno); off != eventLayout1Size {
		t.Errorf("exe_ino at offset %d, want %d (after the first layout)", off, eventLayout1Size)
	}
	if got := unsafe.Sizeof(devfilterRateKey{}); got != 24 {
		t.Errorf("rate key is %d bytes, want 24", got)
	}
	if got := unsafe.Sizeof(devfilterPolicy{}); got != 592 {
		t.Errorf("policy is %d bytes, want 592", got)
	}
	if got := len(devfilterPolicy{}.Caps); got != capsWords {
		t.Errorf("caps bitmap has %d words, capsWords is %d", got, capsWords)
	}
	// The layout only grew at its end (policyMaps): the first layout's
	// fields keep their offsets.
	if off := unsafe.Offsetof(devfilterPolicy{}.Caps); off != policyLayout1Size {
		t.Errorf("caps bitmap at offset %d, want %d (after the first layout)", off, policyLayout1Size)
	}
	// caps_major took the place of padding; the management majors came
	// after the end of that layout, and the IMEX major (with one padding
	// word) after those: each older config map is a prefix, which an
	// upgrade replaces (readConfig zero-extends it for gpufence status).
	if got := unsafe.Sizeof(devfilterFilterConfig{}); got != 48 {
		t.Errorf("filter config is %d bytes, want 48", got)
	}
	if off := unsafe.Offsetof(devfilterFilterConfig{}.NvswitchMajor); off != configLayout1Size {
		t.Errorf("nvswitch_major at offset %d, want %d (after the first config layout)", off, configLayout1Size)
	}
	if off := unsafe.Offsetof(devfilterFilterConfig{}.ImexMajor); off != configLayout2Size {
		t.Errorf("imex_major at offset %d, want %d (after the second config layout)", off, configLayout2Size)
	}
	if got := configLayoutSizes[len(configLayoutSizes)-1]; got != int(unsafe.Sizeof(devfilterFilterConfig{})) {
		t.Errorf("newest accepted config layout is %d bytes, want this one's %d", got, unsafe.Sizeof(devfilterFilterConfig{}))
	}
	// imex_channel took the place of the policy's padding: an older entry
	// reads as no channel, and the policy keeps its size.
	if off := unsafe.Offsetof(devfilterPolicy{}.ImexChannel); off != 12 {
		t.Errorf("imex_channel at offset %d, want 12 (the old padding)", off)
	}
	if got := unsafe.Sizeof(devfilterBpfCgroupStorageKey{}); got != 16 {
		t.Errorf("cgroup storage key is %d bytes, want 16 (struct bpf_cgroup_storage_key)", got)
	}
	if Decision(devfilterDecisionDECISION_DENIED) != DecisionDenied || Decision(devfilterDecisionDECISION_ALLOWED) != DecisionAllowed ||
		Decision(devfilterDecisionDECISION_WOULD_DENY) != DecisionWouldDeny {
		t.Error("Decision constants differ from the program's enum decision")
	}
	for _, a := range []AuditAllowed{AuditAllowedNone, AuditAllowedFirst, AuditAllowedAll} {
		if _, ok := auditAllowedCodes[a]; !ok {
			t.Errorf("AuditAllowed %q has no code for the program", a)
		}
	}
	if policyAllowAll != 1 {
		t.Error("policyAllowAll differs from the program's POLICY_ALLOW_ALL")
	}
}

func TestDecodeEvent(t *testing.T) {
	in := devfilterEvent{
		CgroupId: 4242, KtimeNs: 1_500_000_000, Pid: 10, Tgid: 11, Uid: 1000, Gid: 100,
		Major: 195, Minor: 3, Access: uint16(AccessRead | AccessWrite), Decision: uint8(DecisionDenied), Suppressed: 77,
		ExeIno: 123456, ExeDev: 254<<20 | 3, StartBoottime: 9_000_000_000,
	}
	for i, c := range "devfilter.test\x00j" {
		in.Comm[i] = int8(c)
	}
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.NativeEndian, &in); err != nil {
		t.Fatal(err)
	}
	got, err := decodeEvent(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	want := Event{CgroupID: 4242, Time: 1500 * 1e6, PID: 10, TGID: 11, UID: 1000, GID: 100,
		Major: 195, Minor: 3, Access: AccessRead | AccessWrite, Decision: DecisionDenied, Comm: "devfilter.test", Suppressed: 77,
		Exe: ExeID{Ino: 123456, Major: 254, Minor: 3}, Start: 9 * time.Second}
	if got != want {
		t.Fatalf("decodeEvent() = %+v, want %+v", got, want)
	}
	// A record of the first layout, still in an adopted ring buffer after
	// an upgrade: decoded, with no executable.
	got, err = decodeEvent(buf.Bytes()[:eventLayout1Size])
	want.Exe, want.Start = ExeID{}, 0
	if err != nil || got != want || got.Exe.Known() {
		t.Fatalf("decodeEvent(layout 1) = %+v, %v; want %+v", got, err, want)
	}
	if _, err := decodeEvent(buf.Bytes()[:20]); err == nil || !strings.Contains(err.Error(), "20 bytes") {
		t.Fatalf("decodeEvent(short) error = %v", err)
	}
}

func TestCgroupLevel(t *testing.T) {
	const text = `22 1 0:20 / / rw - ext4 /dev/root rw
30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 30 0:32 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
41 22 0:37 /system.slice /mnt/with\040space rw shared:9 - cgroup2 cgroup2 rw
`
	all, err := mountinfo.Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	mounts := mountinfo.Cgroup2(all)
	if len(mounts) != 2 || mounts[1].MountPoint != "/mnt/with space" || mounts[1].Root != "/system.slice" ||
		mounts[1].ID != 41 || mounts[1].Major != 0 || mounts[1].Minor != 37 {
		t.Fatalf("cgroup2 mounts = %+v", mounts)
	}
	tests := []struct {
		dir     string
		want    int
		wantErr bool
	}{
		{dir: "/sys/fs/cgroup/unified", want: 0},
		{dir: "/sys/fs/cgroup/unified/system.slice/vm_slurmstepd.scope", want: 2},
		{dir: "/sys/fs/cgroup/unified/system.slice/vm_slurmstepd.scope/", want: 2},
		{dir: "/mnt/with space/x_slurmstepd.scope", want: 2},
		{dir: "/sys/fs/cgroup/devices/a", wantErr: true},
		{dir: "/sys/fs/cgroup/unifiedx/a", wantErr: true},
	}
	for _, tt := range tests {
		got, err := cgroupLevel(mounts, tt.dir)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("cgroupLevel(%q) = %d, %v; want %d, error %v", tt.dir, got, err, tt.want, tt.wantErr)
		}
	}
}
