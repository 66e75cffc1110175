// SPDX-License-Identifier: Apache-2.0

package store

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// pinDir mounts a bpffs of the test's own (never /sys/fs/bpf).
func pinDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts bpffs and creates BPF maps")
	}
	mnt := t.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Skipf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	dir := filepath.Join(mnt, "gpufence")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPrivilegedStoreSurvivesReopen(t *testing.T) {
	dir := pinDir(t)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Created {
		t.Error("first Open did not create")
	}
	jobs := []Job{{ID: 7, UID: 2001, GPUs: []int{0, 2, 1023}, CreatedUnixNano: 42}, {ID: 9, UID: 0, Flags: FlagBroken, GPUs: []int{}}}
	for _, j := range jobs {
		if err := s.PutJob(j); err != nil {
			t.Fatal(err)
		}
	}
	step := Step{CgroupID: 1 << 40, JobID: 7, StepID: 0xfffffffb, UID: 2001, GPUs: []int{2}, Cgroup: "/sys/fs/cgroup/x/job_7/step_batch"}
	if err := s.PutStep(step); err != nil {
		t.Fatal(err)
	}
	if err := s.PutJob(Job{ID: 1, GPUs: []int{1024}}); err == nil {
		t.Error("GPU index 1024 stored")
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Created {
		t.Error("second Open created new maps")
	}
	got, err := s.Jobs()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != 7 || !slices.Equal(got[0].GPUs, []int{0, 2, 1023}) || got[0].CreatedUnixNano != 42 ||
		got[1].ID != 9 || got[1].Flags != FlagBroken || len(got[1].GPUs) != 0 {
		t.Errorf("jobs after reopen: %+v", got)
	}
	steps, err := s.Steps()
	if err != nil || len(steps) != 1 || steps[0].CgroupID != step.CgroupID || steps[0].StepID != step.StepID ||
		!slices.Equal(steps[0].GPUs, []int{2}) || steps[0].Cgroup != step.Cgroup {
		t.Errorf("steps after reopen: %+v, %v", steps, err)
	}
	if err := s.DeleteJob(7); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteJob(7); err != nil {
		t.Errorf("delete of an absent job: %v", err)
	}
	if err := s.DeleteStep(step.CgroupID); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Jobs(); len(got) != 1 {
		t.Errorf("jobs after delete: %+v", got)
	}
	if err := unpin(dir); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("pins left after Unpin: %v", ents)
	}
}

// A store made and filled but not committed (the agent was killed while it
// copied an older agent's state file into it) is not taken for a complete
// one: the next Open makes it again, and Commit gives it its names.
func TestPrivilegedStoreUncommittedIsMadeAgain(t *testing.T) {
	dir := pinDir(t)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutJob(Job{ID: 7, GPUs: []int{1}}); err != nil {
		t.Fatal(err)
	}
	if pins := names(t, dir); !slices.Equal(pins, []string{"store_jobs_new", "store_steps_new"}) {
		t.Errorf("pins before Commit: %v", pins)
	}
	s.Close() // killed here

	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Created {
		t.Error("an uncommitted store was taken for a complete one")
	}
	if got, err := s.Jobs(); err != nil || len(got) != 0 {
		t.Errorf("jobs of the store made again: %+v, %v", got, err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if pins := names(t, dir); !slices.Equal(pins, []string{"store_jobs", "store_steps"}) {
		t.Errorf("pins after Commit: %v", pins)
	}
	if err := unpin(dir); err != nil {
		t.Fatal(err)
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// A pinned map of another layout (another agent version) is replaced.
func TestPrivilegedStoreReplacesOtherLayout(t *testing.T) {
	dir := pinDir(t)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "gf_store_jobs", Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(dir, jobsPin)); err != nil {
		t.Fatal(err)
	}
	old.Close()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Created {
		t.Error("a map of another layout was kept")
	}
	if err := s.PutJob(Job{ID: 1, GPUs: []int{3}}); err != nil {
		t.Fatal(err)
	}
	unpin(dir)
}

func TestIMEXFlags(t *testing.T) {
	for _, ch := range [][]uint32{nil, {0}, {1}, {2047}, {1<<20 - 1}} {
		f, err := IMEXFlags(ch)
		if err != nil {
			t.Fatalf("%v: %v", ch, err)
		}
		// The lower flags stay free for the others.
		if f&(StepFlagAuditOnly|StepFlagAdopted) != 0 {
			t.Errorf("%v: flags %#x touch the other step flags", ch, f)
		}
		if got := IMEXChannels(f | StepFlagAdopted); !slices.Equal(got, ch) {
			t.Errorf("%v: decoded %v", ch, got)
		}
	}
	if IMEXChannels(StepFlagAuditOnly|StepFlagAdopted) != nil {
		t.Error("an older record without the flag decoded a channel")
	}
	for _, ch := range [][]uint32{{1 << 20}, {1, 2}} {
		if _, err := IMEXFlags(ch); err == nil {
			t.Errorf("%v: no error", ch)
		}
	}
}

// unpin removes the pins.
func unpin(dir string) error {
	var errs []error
	for _, n := range []string{jobsPin, stepsPin, jobsPin + newSuffix, stepsPin + newSuffix} {
		if err := unix.Unlink(filepath.Join(dir, n)); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
