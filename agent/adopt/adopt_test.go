// SPDX-License-Identifier: Apache-2.0

package adopt

import (
	"os"
	"path/filepath"
	"testing"
)

// TestStepdJob: the job id comes from a root slurmstepd's title, whether
// its binary is SchedMD's slurmstepd or Debian's slurmstepd-wlm (what
// /proc/PID/exe shows on Debian, where /usr/sbin/slurmstepd is an
// alternatives link); any other process's title is not believed.
func TestStepdJob(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the fake /proc entries must be owned by root, as slurmstepd's are: run as root")
	}
	proc := t.TempDir()
	mk := func(pid, exe, title string) {
		dir := filepath.Join(proc, pid)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(exe, filepath.Join(dir, "exe")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(title+"\x00"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("10", "/opt/slurm/sbin/slurmstepd", "slurmstepd: [104.batch]")
	mk("11", "/usr/sbin/slurmstepd-wlm", "slurmstepd: [105.extern]")
	mk("12", "/usr/bin/python3", "slurmstepd: [106.batch]")
	mk("13", "/usr/sbin/slurmstepd-wlm", "slurmstepd: [sACXM8RT831V00.batch]")
	a := &Adopter{Proc: proc}
	for _, tc := range []struct {
		pid  int
		want uint32
		ok   bool
	}{{10, 104, true}, {11, 105, true}, {12, 0, false}, {13, 0, false}, {14, 0, false}} {
		got, ok := a.stepdJob(tc.pid)
		if got != tc.want || ok != tc.ok {
			t.Errorf("pid %d: stepdJob = %d, %v; want %d, %v", tc.pid, got, ok, tc.want, tc.ok)
		}
	}
}
