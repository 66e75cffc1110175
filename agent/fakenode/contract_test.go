// SPDX-License-Identifier: Apache-2.0

package fakenode

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// kernelMap is the part of the device filter TestContract holds the fake
// to: the entries (Set, Remove, Policies) and what a closed filter says.
type kernelMap interface {
	Mode() devfilter.Mode
	Set(cg cgroup.Cgroup, p devfilter.Policy) error
	Remove(cg cgroup.Cgroup) error
	Policies() (map[uint64]devfilter.Policy, error)
	Close() error
}

// contract is the cases both maps must answer alike. cgs are live cgroups
// (needed by the kernel in per-cgroup mode).
func contract(t *testing.T, f kernelMap, cgs [3]cgroup.Cgroup) {
	a, b, c := cgs[0], cgs[1], cgs[2]
	want := map[uint64]devfilter.Policy{}
	check := func(step string) {
		t.Helper()
		got, err := f.Policies()
		if err != nil {
			t.Fatalf("%s: Policies: %v", step, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: entries\n got  %+v\n want %+v", step, got, want)
		}
	}
	mustSet := func(cg cgroup.Cgroup, p, stored devfilter.Policy) {
		t.Helper()
		if err := f.Set(cg, p); err != nil {
			t.Fatalf("Set(%d, %+v): %v", cg.ID, p, err)
		}
		want[cg.ID] = stored
	}
	refuse := func(what string, cg cgroup.Cgroup, p devfilter.Policy) {
		t.Helper()
		if err := f.Set(cg, p); err == nil {
			t.Errorf("Set %s (%+v): no error", what, p)
		}
	}
	check("empty")
	// Minors come back sorted, without duplicates; none is nil.
	mustSet(a, devfilter.Policy{GPUMinors: []uint32{3, 1, 3}}, devfilter.Policy{GPUMinors: []uint32{1, 3}})
	mustSet(b, devfilter.Policy{}, devfilter.Policy{})
	check("two entries")
	// A second Set replaces, never merges.
	mustSet(a, devfilter.Policy{GPUMinors: []uint32{2}, CapsMinors: []uint32{4322, 3}, IMEXChannels: []uint32{7}, AuditOnly: true},
		devfilter.Policy{GPUMinors: []uint32{2}, CapsMinors: []uint32{3, 4322}, IMEXChannels: []uint32{7}, AuditOnly: true})
	mustSet(c, devfilter.Policy{AllowAll: true, RootOnly: true}, devfilter.Policy{AllowAll: true, RootOnly: true})
	check("replaced")
	// What the program cannot hold is refused, and changes nothing.
	refuse("cgroup id 0", cgroup.Cgroup{Path: a.Path}, devfilter.Policy{})
	refuse("GPU minor 254 (nvidia-modeset)", a, devfilter.Policy{GPUMinors: []uint32{254}})
	refuse("caps minor 2 (MIG monitor)", a, devfilter.Policy{CapsMinors: []uint32{2}})
	refuse("caps minor beyond the bitmap", a, devfilter.Policy{CapsMinors: []uint32{devfilter.MaxCapsMinor + 1}})
	refuse("two IMEX channels", a, devfilter.Policy{IMEXChannels: []uint32{1, 2}})
	refuse("IMEX channel beyond a dev_t", a, devfilter.Policy{IMEXChannels: []uint32{devfilter.MaxIMEXChannel + 1}})
	check("after refusals")
	// Remove takes the entry; removing one that is not there is no error.
	if err := f.Remove(a); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	delete(want, a.ID)
	if err := f.Remove(a); err != nil {
		t.Errorf("Remove of an absent entry: %v", err)
	}
	check("removed")
	mustSet(a, devfilter.Policy{GPUMinors: []uint32{0}}, devfilter.Policy{GPUMinors: []uint32{0}})
	check("set again")
	// An entry by id alone: the scope program looks it up by id; in
	// per-cgroup mode a cgroup not attached yet needs its path.
	if err := f.Remove(c); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	delete(want, c.ID)
	byID := cgroup.Cgroup{ID: c.ID}
	if f.Mode() == devfilter.ModeScope {
		mustSet(byID, devfilter.Policy{GPUMinors: []uint32{5}}, devfilter.Policy{GPUMinors: []uint32{5}})
	} else {
		refuse("by id alone on a cgroup not attached", byID, devfilter.Policy{})
	}
	check("by id")
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for what, err := range map[string]error{
		"Set":    f.Set(b, devfilter.Policy{}),
		"Remove": f.Remove(b),
		"Policies": func() error {
			_, err := f.Policies()
			return err
		}(),
	} {
		if !errors.Is(err, devfilter.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", what, err)
		}
	}
}

// TestContract runs the cases against the fake map, and against the
// kernel's in both modes where it can be loaded (root, cgroup2, BPF).
func TestContract(t *testing.T) {
	for _, mode := range []devfilter.Mode{devfilter.ModeScope, devfilter.ModePerCgroup} {
		t.Run("fake/"+string(mode), func(t *testing.T) {
			n := New("/sys/fs/cgroup")
			scope := "/sys/fs/cgroup/system.slice/slurmstepd.scope"
			var cgs [3]cgroup.Cgroup
			for i, d := range []string{"job_1/step_0", "job_1/step_1", "system"} {
				p := filepath.Join(scope, d)
				cgs[i] = cgroup.Cgroup{ID: n.Mkdir(p), Path: p}
			}
			contract(t, NewFilter(mode, n, scope), cgs)
		})
		t.Run("kernel/"+string(mode), func(t *testing.T) {
			f, cgs := kernelFilter(t, mode)
			contract(t, f, cgs)
		})
	}
}

func kernelFilter(t *testing.T, mode devfilter.Mode) (*devfilter.Filter, [3]cgroup.Cgroup) {
	if os.Geteuid() != 0 {
		t.Skip("skipping the kernel's half: loading a BPF program and making cgroups needs root; the fake's half ran")
	}
	mount, err := jobcgroup.Mountpoint()
	if err != nil {
		t.Skipf("skipping the kernel's half: %v", err)
	}
	best, err := devfilter.Probe()
	if err != nil {
		t.Skipf("skipping the kernel's half: kernel lacks a device filter feature: %v", err)
	}
	if mode == devfilter.ModeScope && best != devfilter.ModeScope {
		t.Skipf("skipping the kernel's half: kernel supports only %s mode", best)
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	root := filepath.Join(mount, "gpufence-contract-"+hex.EncodeToString(rnd[:]))
	scope := filepath.Join(root, "test_slurmstepd.scope")
	var cgs [3]cgroup.Cgroup
	var dirs []string
	for i, d := range []string{"job_1/step_0", "job_1/step_1", "system"} {
		p := filepath.Join(scope, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		id, err := jobcgroup.ID(p)
		if err != nil {
			t.Fatal(err)
		}
		cgs[i] = cgroup.Cgroup{ID: id, Path: p}
		dirs = append(dirs, p)
	}
	t.Cleanup(func() {
		for _, d := range append(dirs, filepath.Join(scope, "job_1"), scope, root) {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("remove test cgroup %s: %v", d, err)
			}
		}
	})
	o := devfilter.Options{Mode: mode}
	if mode == devfilter.ModeScope {
		o.ScopeDir = scope
	}
	f, err := devfilter.New(o)
	if err != nil {
		t.Fatalf("devfilter.New(%+v): %v", o, err)
	}
	t.Cleanup(func() { f.Close() })
	return f, cgs
}
