// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"os"
	"testing"
)

// recreateScope removes the fixture's scope (it must be empty of
// processes) and makes it again at the same path, as systemd does when the
// scope unit is stopped and slurmd starts again.
func (fx *fixture) recreateScope(t *testing.T, dirs ...string) {
	t.Helper()
	removeTree(t, fx.scope)
	for _, d := range append([]string{""}, dirs...) {
		if err := os.MkdirAll(fx.path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// A scope made again at the same path is a new cgroup: the old link is
// defunct, new jobs below it run unfiltered until Reattach, which puts the
// program on the new scope, pinned, with the pinned state naming it.
func TestPrivilegedReattachRecreatedScope(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModeScope)
	pin := newPinDir(t)
	o := Options{Mode: ModeScope, ScopeDir: fx.scope, PinDir: pin}
	unpinAtEnd(t, o)
	f := mustNew(t, o)
	defer mustClose(t, f)
	const task = "job_1/step_0/user/task_0"
	if err := f.Set(fx.cgroup(t, "job_1/step_0"), Policy{GPUMinors: []uint32{0}}); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, task, 0)
	oldID := fx.cgroup(t, "").ID
	if got, err := f.ScopeCgroupID(); err != nil || got != oldID {
		t.Fatalf("ScopeCgroupID() = %d, %v; want the scope's %d", got, err, oldID)
	}

	fx.recreateScope(t, "job_1/step_0/user/task_0", "system")
	newID := fx.cgroup(t, "").ID
	if newID == oldID {
		t.Fatal("the recreated scope kept its cgroup id")
	}
	// The kernel lets go of a removed cgroup asynchronously: until then the
	// link still names the old id, after it 0. Never the new scope's.
	if got, err := f.ScopeCgroupID(); err != nil || (got != 0 && got != oldID) {
		t.Errorf("ScopeCgroupID() after the scope was removed = %d, %v; want 0 or the old %d (defunct)", got, err, oldID)
	}
	// The hole Reattach closes: no program on the new scope.
	fx.expectGPUs(t, task, 0, 1, 2, 3)

	if err := f.Reattach(fx.scope); err != nil {
		t.Fatal(err)
	}
	if got, err := f.ScopeCgroupID(); err != nil || got != newID {
		t.Errorf("ScopeCgroupID() after Reattach = %d, %v; want %d", got, err, newID)
	}
	fx.expectGPUs(t, task)
	if err := f.Set(fx.cgroup(t, "job_1/step_0"), Policy{GPUMinors: []uint32{2}}); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, task, 2)
	_, st, err := loadState(pin)
	if err != nil || st.ScopeID != newID {
		t.Errorf("pinned state after Reattach: %+v, %v; want scope %d", st, err, newID)
	}
	if got := pinList(t, pin); len(got) == 0 || !contains(got, pinLinkName) || contains(got, pinLinkName+pinTempSuffix) {
		t.Errorf("pins after Reattach: %v", got)
	}

	// A restarted agent adopts the re-attached pins: the policy stays.
	mustClose(t, f)
	f = mustNew(t, o)
	if !f.Adopted() {
		t.Error("the pins of the re-attached scope were not adopted")
	}
	fx.expectGPUs(t, task, 2)
}

// Reattach onto a scope at another depth updates the level the program
// counts job and step cgroups from.
func TestPrivilegedReattachOtherDepth(t *testing.T) {
	fx := newFixture(t)
	requireMode(t, ModeScope)
	f := newFilter(t, Options{Mode: ModeScope, ScopeDir: fx.scope})
	deeper := fx.path("system/inner_slurmstepd.scope")
	for _, d := range []string{"job_9/step_0/user/task_0"} {
		if err := os.MkdirAll(deeper+"/"+d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Reattach(deeper); err != nil {
		t.Fatal(err)
	}
	step := fx.cgroup(t, "system/inner_slurmstepd.scope/job_9/step_0")
	if err := f.Set(step, Policy{GPUMinors: []uint32{3}}); err != nil {
		t.Fatal(err)
	}
	fx.expectGPUs(t, "system/inner_slurmstepd.scope/job_9/step_0/user/task_0", 3)
	// The old scope has no program now.
	fx.expectGPUs(t, "job_2/step_0/user/task_0", 0, 1, 2, 3)
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
