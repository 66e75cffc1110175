// SPDX-License-Identifier: Apache-2.0

package pkgtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/tests/slurmrel"
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

// TestLinkPluginParallelCluster: on ParallelCluster nodes Slurm is in
// /opt/slurm, often outside root's PATH. link-plugin, run with a folder
// standing in for / (GPUFENCE_ROOT), finds <root>/opt/slurm/sbin/slurmd and
// links the build of each ParallelCluster release: first a slurmd printing
// what ParallelCluster's print, then, where this machine has built that
// release from source (tests/slurmrel, ParallelCluster's prefix layout), the
// real slurmd of that build.
func TestLinkPluginParallelCluster(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging/link-plugin"))
	if err != nil {
		t.Fatal(err)
	}
	lib := t.TempDir()
	for _, v := range wantReleases(t) {
		writeFile(t, filepath.Join(lib, "slurm-"+v, "spank_gpufence.so"), "plugin "+v, 0o644)
	}
	writeFile(t, filepath.Join(lib, "link-plugin"), string(script), 0o755)
	link := filepath.Join(lib, "spank_gpufence.so")
	linkWith := func(t *testing.T, root string) string {
		t.Helper()
		c := exec.Command(filepath.Join(lib, "link-plugin"))
		// No Slurm in PATH, as for a postinst on a ParallelCluster node.
		c.Env = []string{"PATH=/usr/bin:/bin", "GPUFENCE_ROOT=" + root}
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("link-plugin with GPUFENCE_ROOT=%s: %v\n%s", root, err, out)
		}
		return string(out)
	}
	// The releases ParallelCluster 3.9-3.12, 3.13 and 3.16 ship (their
	// changelogs).
	for _, tc := range []struct{ pc, version, want string }{
		{"3.9-3.12", "23.11.4", "23.11"}, {"3.9-3.12", "23.11.7", "23.11"}, {"3.9-3.12", "23.11.10", "23.11"},
		{"3.13", "24.05.7", "24.05"}, {"3.13", "24.05.8", "24.05"},
		{"3.16", "25.11.6", "25.11"}, {"3.16", "25.11.8", "25.11"},
	} {
		t.Run("ParallelCluster "+tc.pc+" slurm "+tc.version, func(t *testing.T) {
			root := t.TempDir()
			writeFile(t, filepath.Join(root, "opt/slurm/sbin/slurmd"), "#!/bin/sh\n[ \"$1\" = -V ] && echo 'slurm "+tc.version+"'\n", 0o755)
			out := linkWith(t, root)
			if got, _ := os.Readlink(link); got != "slurm-"+tc.want+"/spank_gpufence.so" {
				t.Errorf("link -> %q, want slurm-%s/spank_gpufence.so\n%s", got, tc.want, out)
			}
			if !strings.Contains(out, root+"/opt/slurm/sbin/slurmd -V") {
				t.Errorf("link-plugin did not say it asked %s/opt/slurm/sbin/slurmd:\n%s", root, out)
			}
		})
	}
	for _, v := range []string{"23.11", "24.05", "25.11"} {
		t.Run("built "+v, func(t *testing.T) {
			r, err := slurmrel.Lookup(v)
			if err != nil {
				t.Fatal(err)
			}
			in, ok := slurmrel.Cached(r)
			if !ok {
				t.Skipf("Slurm %s is not built on this machine (make e2e SLURM=%s builds it); the ParallelCluster version strings above cover link-plugin", v, v)
			}
			out := linkWith(t, in.StandIn)
			if got, _ := os.Readlink(link); got != "slurm-"+v+"/spank_gpufence.so" {
				t.Errorf("real slurmd of %s: link -> %q\n%s", in.Prefix, got, out)
			}
			t.Logf("%s", strings.TrimSpace(out))
		})
	}
}
