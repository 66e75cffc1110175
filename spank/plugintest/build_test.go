// SPDX-License-Identifier: Apache-2.0

package plugintest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

const repoRoot = "../.."

// binDir holds spank_gpufence.so, built once with the Makefile's own rule.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gfbin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	cmd := exec.Command("make", "-C", repoRoot, "BIN="+dir,
		filepath.Join(dir, "spank_gpufence.so"))
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "make: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

var trackOnce sync.Once

// trackSources reads every file the builds use, from inside a test, so that
// Go's test cache (which sees only files this process opens, not what make
// and gcc read) reruns the tests when C code or the header changes.
func trackSources(t *testing.T) {
	trackOnce.Do(func() {
		for _, dir := range []string{"spank/plugin", "spank/plugintest/testdata"} {
			entries, err := os.ReadDir(filepath.Join(repoRoot, dir))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if !e.IsDir() {
					if _, err := os.ReadFile(filepath.Join(repoRoot, dir, e.Name())); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		if _, err := os.ReadFile(filepath.Join(repoRoot, "Makefile")); err != nil {
			t.Fatal(err)
		}
	})
}

// compile builds a test program from C sources with the plugin's warnings.
func compile(t *testing.T, out string, args ...string) string {
	t.Helper()
	trackSources(t)
	exe := filepath.Join(t.TempDir(), out)
	cmdArgs := append([]string{"-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror",
		"-I" + filepath.Join(repoRoot, "spank/plugin"), "-o", exe}, args...)
	if out, err := exec.Command("gcc", cmdArgs...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(cmdArgs, " "), err, out)
	}
	return exe
}
