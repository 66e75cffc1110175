// SPDX-License-Identifier: Apache-2.0

package pkgtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLinkPlugin runs packaging/link-plugin, as the postinst does, in a
// folder laid out like /usr/lib/gpufence, with fake Slurm commands printing
// the -V lines of real releases.
func TestLinkPlugin(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging/link-plugin"))
	if err != nil {
		t.Fatal(err)
	}
	type cmd struct{ name, out string } // a fake command printing out for -V
	for _, tc := range []struct {
		name     string
		cmds     []cmd
		args     []string
		oldLink  string // the link before the run, "" for none
		wantRC   int
		wantLink string // "" for no link after the run
		wantMsg  []string
	}{
		{name: "debian slurmd", cmds: []cmd{{"slurmd", "slurm-wlm 22.05.8"}},
			wantLink: "slurm-22.05/spank_gpufence.so", wantMsg: []string{"linked", "Slurm 22.05.8", "slurmd -V"}},
		{name: "schedmd slurmd", cmds: []cmd{{"slurmd", "slurm 24.11.5"}},
			wantLink: "slurm-24.11/spank_gpufence.so"},
		{name: "slurm upgrade relinks", cmds: []cmd{{"slurmd", "slurm 24.11.1"}}, oldLink: "slurm-22.05/spank_gpufence.so",
			wantLink: "slurm-24.11/spank_gpufence.so"},
		{name: "login node: srun only", cmds: []cmd{{"srun", "slurm 22.05.11"}},
			wantLink: "slurm-22.05/spank_gpufence.so", wantMsg: []string{"srun -V"}},
		{name: "slurmd wins over srun", cmds: []cmd{{"slurmd", "slurm 24.11.0"}, {"srun", "slurm 22.05.8"}},
			wantLink: "slurm-24.11/spank_gpufence.so"},
		{name: "no plugin for this slurm", cmds: []cmd{{"slurmd", "slurm 23.11.10"}}, oldLink: "slurm-22.05/spank_gpufence.so",
			wantRC: 1, wantMsg: []string{"Slurm 23.11.10", "no gpufence plugin", "22.05 24.11", "make plugin", "removed"}},
		{name: "no slurm at all", oldLink: "slurm-22.05/spank_gpufence.so",
			wantRC: 1, wantLink: "slurm-22.05/spank_gpufence.so", wantMsg: []string{"no Slurm found", "22.05 24.11"}},
		{name: "garbage -V", cmds: []cmd{{"slurmd", "slurmd: error: cannot read slurm.conf"}},
			wantRC: 1, wantMsg: []string{"no Slurm found"}},
		{name: "version given", args: []string{"24.11"}, wantLink: "slurm-24.11/spank_gpufence.so", wantMsg: []string{"command line"}},
		{name: "full version given", cmds: []cmd{{"slurmd", "slurm 22.05.8"}}, args: []string{"24.11.5"}, wantLink: "slurm-24.11/spank_gpufence.so"},
		{name: "bad version given", args: []string{"latest"}, wantRC: 2, wantMsg: []string{"not a Slurm version"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			lib := filepath.Join(dir, "lib")
			for _, v := range []string{"22.05", "24.11"} {
				writeFile(t, filepath.Join(lib, "slurm-"+v, "spank_gpufence.so"), "plugin "+v, 0o644)
			}
			writeFile(t, filepath.Join(lib, "link-plugin"), string(script), 0o755)
			link := filepath.Join(lib, "spank_gpufence.so")
			if tc.oldLink != "" {
				if err := os.Symlink(tc.oldLink, link); err != nil {
					t.Fatal(err)
				}
			}
			var paths []string
			for _, c := range tc.cmds {
				p := filepath.Join(dir, "bin", c.name)
				writeFile(t, p, "#!/bin/sh\n[ \"$1\" = -V ] && echo '"+c.out+"'\n", 0o755)
				paths = append(paths, p)
			}
			if len(paths) == 0 {
				paths = []string{filepath.Join(dir, "bin", "nothing")}
			}
			// The real list's order, with this node's commands only.
			c := exec.Command(filepath.Join(lib, "link-plugin"), tc.args...)
			c.Env = append(os.Environ(), "GPUFENCE_SLURM_COMMANDS="+strings.Join(paths, " "))
			out, err := c.CombinedOutput()
			rc := 0
			if ee, ok := err.(*exec.ExitError); ok {
				rc = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			t.Logf("rc=%d\n%s", rc, out)
			if rc != tc.wantRC {
				t.Errorf("exit status %d, want %d", rc, tc.wantRC)
			}
			got, _ := os.Readlink(link)
			if got != tc.wantLink {
				t.Errorf("link %q, want %q", got, tc.wantLink)
			}
			if got != "" {
				if _, err := os.Stat(link); err != nil {
					t.Errorf("link does not resolve: %v", err)
				}
			}
			for _, m := range tc.wantMsg {
				if !strings.Contains(string(out), m) {
					t.Errorf("output lacks %q", m)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(lib, ".spank_gpufence.so.*")); len(left) > 0 {
				t.Errorf("temporary links left: %v", left)
			}
		})
	}
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}
