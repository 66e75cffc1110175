// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/gpufence/gpufence/agent/cgroup"
	"golang.org/x/sys/unix"
)

// TestPrivilegedSlurmdOutsideScope is production's slurmd under systemd:
// slurmd.service beside the scope, not below it, where slurmd's sbcast
// child drops to the job's user and opens the destination. The scope
// program attached there too, with a root-only allow-all entry for that
// cgroup, keeps every device for root (NVML) and denies every GPU-class
// node to a process there that is not root, reported under that cgroup. A
// cgroup beside it that is not slurmd's is not narrowed, and a task in the
// scope cgroup itself is as denied as before. The link is pinned as
// link_slurmd, adopted by the next filter, and when systemd makes the unit's
// cgroup again (a restart) the old link is defunct until the program is
// attached to the new cgroup, after which it is narrowed again. Unpin
// removes the link and its pin.
func TestPrivilegedSlurmdOutsideScope(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModeScope)
	fx.openableByAll(t)
	const rel, other = "../slurmd.service", "../other.service"
	for _, r := range []string{rel, other} {
		if err := os.Mkdir(fx.path(r), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Every denial reported: the same keys are denied again within a window.
	o := fx.fabricOptions(ModeScope, Options{PinDir: newPinDir(t), RateBurst: 1000})
	unpinAtEnd(t, o)
	f := mustNew(t, o)
	step := fx.cgroup(t, "job_1/step_0")
	if err := f.Set(step, Policy{GPUMinors: []uint32{2}}); err != nil {
		t.Fatal(err)
	}
	attachSlurmd := func(f *Filter) cgroup.Cgroup {
		t.Helper()
		cg := fx.cgroup(t, rel)
		// The entry first: root's NVML never meets a missing one.
		if err := f.Set(cg, Policy{AllowAll: true, RootOnly: true}); err != nil {
			t.Fatal(err)
		}
		if err := f.AttachSlurmd(cg.Path, cg.ID); err != nil {
			t.Fatal(err)
		}
		if on, err := f.SlurmdCgroupID(); err != nil || on != cg.ID {
			t.Fatalf("SlurmdCgroupID() = %d, %v; want %d", on, err, cg.ID)
		}
		return cg
	}
	narrowed := func(events *eventCollector, slurmd cgroup.Cgroup) {
		t.Helper()
		fx.expectAs(t, rel, rootIDs, true)
		for _, ids := range nonRootIDs {
			fx.expectAs(t, rel, ids, false)
			events.wait(t, fmt.Sprintf("denial of nvidia0 to uids %v in slurmd.service", ids), func(e Event) bool {
				return e.CgroupID == slurmd.ID && e.Minor == 0 && e.Major == DefaultNvidiaMajor && e.Decision == DecisionDenied && e.UID == uint32(ids[0])
			})
		}
	}

	// Before the program is on slurmd's cgroup nothing narrows it: what
	// production had.
	fx.expectAs(t, rel, [3]int{nobody, nobody, 0}, true)
	slurmd := attachSlurmd(f)
	narrowed(collectEvents(f), slurmd)
	fx.expectAs(t, other, [3]int{nobody, nobody, nobody}, true)
	fx.expectAs(t, ".", rootIDs, false)
	fx.expectAs(t, "job_1/step_0/user/task_0", [3]int{nobody, nobody, nobody}, false, 2)
	if names := pinList(t, o.PinDir); !slices.Contains(names, pinSlurmdLink) {
		t.Fatalf("pins %v: no %s", names, pinSlurmdLink)
	}

	// A restarted agent adopts the pinned link: still narrowed, no re-attach.
	mustClose(t, f)
	fx.expectAs(t, rel, [3]int{nobody, nobody, 0}, false)
	f = mustNew(t, o)
	if on, err := f.SlurmdCgroupID(); err != nil || on != slurmd.ID {
		t.Fatalf("SlurmdCgroupID() after adoption = %d, %v; want %d", on, err, slurmd.ID)
	}
	events := collectEvents(f)
	narrowed(events, slurmd)

	// systemd makes the unit's cgroup again at a restart.
	if err := unix.Rmdir(fx.path(rel)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(fx.path(rel), 0o755); err != nil {
		t.Fatal(err)
	}
	// The kernel lets go of the old cgroup's programs when it frees it,
	// a little later: the link reports 0 then, its old id until.
	if on, err := f.SlurmdCgroupID(); err != nil || on == fx.cgroup(t, rel).ID {
		t.Fatalf("SlurmdCgroupID() after the cgroup was made again = %d, %v; want the old id or 0", on, err)
	}
	fx.expectAs(t, rel, [3]int{nobody, nobody, 0}, true)
	again := attachSlurmd(f)
	if again.ID == slurmd.ID {
		t.Fatalf("the cgroup made again kept id %d", again.ID)
	}
	narrowed(events, again)
	if err := f.Remove(slurmd); err != nil {
		t.Fatal(err)
	}

	if err := f.Unpin(); err != nil {
		t.Fatal(err)
	}
	if names := pinList(t, o.PinDir); len(names) != 0 {
		t.Errorf("pins after Unpin: %v", names)
	}
	fx.expectAs(t, rel, [3]int{nobody, nobody, 0}, true)
}
