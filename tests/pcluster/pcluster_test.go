// SPDX-License-Identifier: Apache-2.0

// Package pcluster tests packaging/parallelcluster/gpufence-node.sh, the
// script docs/parallelcluster.md runs on ParallelCluster nodes, on a folder
// standing in for the head node's root.
package pcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const script = "../../packaging/parallelcluster/gpufence-node.sh"

// headPlugstack runs the script's head-node plugstack step with root as /.
func headPlugstack(t *testing.T, root string) string {
	t.Helper()
	cmd := exec.Command("bash", "-c", `GPUFENCE_NODE_LIB=1 source "$0" && head_plugstack`, script)
	cmd.Env = append(os.Environ(), "GPUFENCE_ROOT="+root)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("head_plugstack: %v\n%s", err, out)
	}
	return string(out)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// count returns how many lines of s, trimmed, equal line.
func count(s, line string) int {
	n := 0
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) == line {
			n++
		}
	}
	return n
}

const (
	include = "include /opt/slurm/etc/plugstack.conf.d/*"
	plug    = "required /usr/lib/gpufence/spank_gpufence.so"
)

func TestHeadPlugstack(t *testing.T) {
	for _, tc := range []struct {
		name string
		// existing files relative to the root, before the script runs
		before map[string]string
		// wantInclude and wantPlug: how many times each line is in
		// plugstack.conf and plugstack.conf.d/gpufence.conf afterwards
		wantIncludeLines int
		wantPlugFile     bool
		wantKept         map[string]string
	}{
		{
			name:             "fresh head node: no plugstack.conf",
			before:           map[string]string{"opt/slurm/etc/slurm.conf": "ClusterName=pc\n"},
			wantIncludeLines: 1, wantPlugFile: true,
		},
		{
			name: "plugstack.conf with pyxis's own include already",
			before: map[string]string{
				"opt/slurm/etc/plugstack.conf":              include + "\n",
				"opt/slurm/etc/plugstack.conf.d/pyxis.conf": "required /usr/local/lib/slurm/spank_pyxis.so\n",
			},
			wantIncludeLines: 1, wantPlugFile: true,
			wantKept: map[string]string{"opt/slurm/etc/plugstack.conf.d/pyxis.conf": "required /usr/local/lib/slurm/spank_pyxis.so\n"},
		},
		{
			name:             "plugstack.conf with a plugin line and no include",
			before:           map[string]string{"opt/slurm/etc/plugstack.conf": "optional /usr/lib/other.so\n"},
			wantIncludeLines: 1, wantPlugFile: true,
		},
		{
			name:             "the admin put gpufence's line in plugstack.conf by hand",
			before:           map[string]string{"opt/slurm/etc/plugstack.conf": include + "\n" + plug + " timeout=5\n"},
			wantIncludeLines: 1, wantPlugFile: false,
			wantKept: map[string]string{"opt/slurm/etc/plugstack.conf": include + "\n" + plug + " timeout=5\n"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for p, c := range tc.before {
				write(t, filepath.Join(root, p), c)
			}
			conf := filepath.Join(root, "opt/slurm/etc/plugstack.conf")
			file := filepath.Join(root, "opt/slurm/etc/plugstack.conf.d/gpufence.conf")
			var first string
			// Twice: the second run must change nothing.
			for run := 1; run <= 2; run++ {
				out := headPlugstack(t, root)
				got := read(t, conf)
				if n := count(got, include); n != tc.wantIncludeLines {
					t.Errorf("run %d: plugstack.conf has the include %d times, want %d:\n%s\n%s", run, n, tc.wantIncludeLines, got, out)
				}
				_, err := os.Stat(file)
				if hasFile := err == nil; hasFile != tc.wantPlugFile {
					t.Errorf("run %d: gpufence.conf exists=%v, want %v\n%s", run, hasFile, tc.wantPlugFile, out)
				}
				if tc.wantPlugFile {
					if n := count(read(t, file), plug); n != 1 {
						t.Errorf("run %d: gpufence.conf has the plugin line %d times", run, n)
					}
				}
				for p, c := range tc.wantKept {
					if got := read(t, filepath.Join(root, p)); got != c {
						t.Errorf("run %d: %s changed to %q", run, p, got)
					}
				}
				state := got
				if tc.wantPlugFile {
					state += read(t, file)
				}
				if run == 1 {
					first = state
				} else if state != first {
					t.Errorf("second run changed the files:\nfirst:\n%s\nsecond:\n%s", first, state)
				}
			}
		})
	}
}

func TestHeadPlugstackNotAHeadNode(t *testing.T) {
	cmd := exec.Command("bash", "-c", `GPUFENCE_NODE_LIB=1 source "$0" && head_plugstack`, script)
	cmd.Env = append(os.Environ(), "GPUFENCE_ROOT="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is this a ParallelCluster head node?") {
		t.Fatalf("want a clear error without /opt/slurm/etc, got err=%v:\n%s", err, out)
	}
}

func TestUsage(t *testing.T) {
	out, err := exec.Command("bash", script, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	for _, role := range []string{"image", "compute", "login", "head"} {
		if !strings.Contains(string(out), role) {
			t.Errorf("--help does not explain role %q:\n%s", role, out)
		}
	}
	out, err = exec.Command("bash", script, "bogus").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("unknown role: want exit 2, got %v:\n%s", err, out)
	}
}
