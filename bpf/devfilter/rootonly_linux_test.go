// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gpufence/gpufence/agent/cgroup"
	"golang.org/x/sys/unix"
)

// resuidEnv makes the child of openAllEnv set its real, effective and saved
// uids ("r,e,s") before it opens the nodes, as Slurm's children do: slurmd's
// sbcast child calls setresuid(uid, uid, -1), keeping a root saved uid.
const resuidEnv = "GPUFENCE_DEVFILTER_TEST_CHILD_RESUID"

func init() {
	spec := os.Getenv(resuidEnv)
	if spec == "" {
		return
	}
	var ids [3]int
	parts := strings.Split(spec, ",")
	for i := range ids {
		var err error
		if len(parts) != 3 {
			err = fmt.Errorf("want three uids")
		} else {
			ids[i], err = strconv.Atoi(parts[i])
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bad %s %q: %v\n", resuidEnv, spec, err)
			os.Exit(2)
		}
	}
	// The opens (TestMain's childOpenAll) come after, in this process.
	if err := unix.Setresuid(ids[0], ids[1], ids[2]); err != nil {
		fmt.Fprintf(os.Stderr, "setresuid(%v): %v\n", ids, err)
		os.Exit(2)
	}
}

// nobody is the uid the tests' non-root children take.
const nobody = 65534

// openableByAll lets a child that is not root reach and open (read and
// write, as the nodes of the NVIDIA driver are 0666) every fake node: only
// the filter may then refuse it. mknod's mode went through the umask, and
// t.TempDir's folders are 0700.
func (fx *fixture) openableByAll(t *testing.T) {
	t.Helper()
	if err := os.Chmod(filepath.Dir(fx.devDir), 0o755); err != nil {
		t.Fatal(err)
	}
	err := filepath.WalkDir(fx.devDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := os.FileMode(0o666)
		if d.IsDir() {
			mode = 0o755
		}
		return os.Chmod(p, mode)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// expectAs runs a child in rel with the uids r, e, s and checks every
// GPU-class node: with all, each opens (ENXIO); otherwise only the GPU
// minors in gpus open and every MIG capability and management node is
// denied (EPERM). Nodes the filter never narrows open in every case.
func (fx *fixture) expectAs(t *testing.T, rel string, ids [3]int, all bool, gpus ...uint32) {
	t.Helper()
	_, got := fx.openAllEnv(t, rel, fmt.Sprintf("%s=%d,%d,%d", resuidEnv, ids[0], ids[1], ids[2]))
	narrowed := func(open bool) unix.Errno {
		if open || all {
			return unix.ENXIO
		}
		return unix.EPERM
	}
	check := func(name string, want unix.Errno) {
		if got[name] != want {
			t.Errorf("uids %v in %s: open %s: errno %d (%v), want %d (%v)", ids, rel, name, int(got[name]), got[name], int(want), want)
		}
	}
	for _, n := range testNodes {
		if n.gpu {
			check(n.name, narrowed(slices.Contains(gpus, n.minor)))
		} else {
			check(n.name, allowedErrno(n))
		}
	}
	for _, name := range slices.Concat(capsNodeNames(), fabricNodeNames()) {
		check(name, narrowed(false))
	}
}

var rootIDs = [3]int{0, 0, 0}

// nonRootIDs are the ways a process of Slurm's cgroup may not be root: a
// user's process, slurmd's sbcast child (saved uid root), a root process
// that switched its euid alone (seteuid), and one whose euid is root while
// its real uid is a user's.
var nonRootIDs = [][3]int{
	{nobody, nobody, nobody},
	{nobody, nobody, 0},
	{0, nobody, 0},
	{nobody, 0, 0},
}

// TestPrivilegedRootOnlyExempt: an allow-all entry marked RootOnly (Slurm's
// system and slurmd cgroups) lets root open every GPU-class node and denies
// each one to a process there that is not root, in every way a Slurm child
// drops privileges, reporting the denial under that cgroup with the
// process's uid; a plain allow-all entry and the job steps' entries behave
// as before, whoever opens.
func TestPrivilegedRootOnlyExempt(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		fx.openableByAll(t)
		if err := os.MkdirAll(fx.path("slurmd"), 0o755); err != nil {
			t.Fatal(err)
		}
		f := newFilter(t, fx.fabricOptions(mode, Options{}))
		system, slurmd, step := fx.cgroup(t, "system"), fx.cgroup(t, "slurmd"), fx.cgroup(t, "job_1/step_0")
		for cg, p := range map[cgroup.Cgroup]Policy{
			system: {AllowAll: true, RootOnly: true},
			slurmd: {AllowAll: true},
			step:   {GPUMinors: []uint32{2}},
		} {
			if err := f.Set(cg, p); err != nil {
				t.Fatal(err)
			}
		}
		pols, err := f.Policies()
		if err != nil {
			t.Fatal(err)
		}
		if p := pols[system.ID]; !p.AllowAll || !p.RootOnly {
			t.Errorf("Policies()[system] = %+v, want AllowAll and RootOnly", p)
		}
		events := collectEvents(f)

		fx.expectAs(t, "system", rootIDs, true)
		for _, ids := range nonRootIDs {
			fx.expectAs(t, "system", ids, false)
			e := events.wait(t, fmt.Sprintf("denial of nvidia0 to uids %v in system", ids), func(e Event) bool {
				return e.CgroupID == system.ID && e.Minor == 0 && e.Major == DefaultNvidiaMajor && e.Decision == DecisionDenied && e.UID == uint32(ids[0])
			})
			if e.Comm != wantComm() {
				t.Errorf("denial in system: comm %q, want %q", e.Comm, wantComm())
			}
		}
		// Without the flag, allow-all is what it always was: what an
		// entry an older agent wrote still means.
		fx.expectAs(t, "slurmd", [3]int{nobody, nobody, 0}, true)
		// Job steps: their GPUs to root and users alike, nothing more.
		fx.expectAs(t, "job_1/step_0/user/task_0", [3]int{nobody, nobody, nobody}, false, 2)
		fx.expectAs(t, "job_1/step_0/user/task_0", rootIDs, false, 2)
		// An unregistered job gets nothing, root or not (in scope mode:
		// per-cgroup mode narrows only what got an entry).
		if mode == ModeScope {
			fx.expectAs(t, "job_2/step_0/user/task_0", rootIDs, false)
		}
	})
}

// TestPrivilegedPinUpgradeRootOnly: an agent of this program takes over
// what the program before RootOnly (testdata/layout4_bpfel.o, the same
// maps) pinned, while Slurm's system cgroup holds an allow-all entry. That
// program ignores the flag, so an entry with it written before the swap is
// allow-all to every task, as before: no root process loses its devices at
// any point. Once the new program runs, the same entry denies non-root
// processes, root keeps every device and the step keeps its GPU.
func TestPrivilegedPinUpgradeRootOnly(t *testing.T) {
	pinModes(t, func(t *testing.T, mode Mode) {
		fx := newFixture(t)
		requireMode(t, mode)
		fx.openableByAll(t)
		o := pinOpts(fx, mode, newPinDir(t))
		o.CapsMajor, o.NVSwitchMajor, o.NVLinkMajor = fx.capsMajor, fx.nvswitchMajor, fx.nvlinkMajor
		unpinAtEnd(t, o)
		t.Cleanup(func() { testSpecHook = nil })
		old := olderSpec(t, 4, "policies", uint32(binary.Size(devfilterPolicy{})))
		testSpecHook = func(_ Mode, spec *ebpf.CollectionSpec) { *spec = *old.Copy() }
		f := mustNew(t, o)
		step, system := setStepAndSystem(t, fx, f)
		fx.expectAs(t, "system", [3]int{nobody, nobody, 0}, true)
		// The new agent writes Slurm's entries before it swaps the
		// program in: the old program reads them as allow-all.
		if err := f.Set(system, Policy{AllowAll: true, RootOnly: true}); err != nil {
			t.Fatal(err)
		}
		fx.expectAs(t, "system", [3]int{nobody, nobody, 0}, true)
		fx.expectAs(t, "system", rootIDs, true)
		mustClose(t, f)
		testSpecHook = nil

		f = mustNew(t, o)
		if !f.Adopted() {
			t.Error("Adopted() = false after the program before RootOnly")
		}
		pols, err := f.Policies()
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint64]Policy{step.ID: {GPUMinors: []uint32{2}, CapsMinors: []uint32{12}}, system.ID: {AllowAll: true, RootOnly: true}}
		if fmt.Sprint(pols) != fmt.Sprint(want) {
			t.Errorf("Policies() after the upgrade = %v, want %v", pols, want)
		}
		fx.expectAs(t, "system", rootIDs, true)
		for _, ids := range nonRootIDs {
			fx.expectAs(t, "system", ids, false)
		}
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 2)
		fx.expectCaps(t, "job_1/step_0/user/task_0", 12)
		if err := f.Unpin(); err != nil {
			t.Fatal(err)
		}
	})
}
