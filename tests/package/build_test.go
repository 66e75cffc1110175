// SPDX-License-Identifier: Apache-2.0

package pkgtest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gpufence/gpufence/tests/slurmrel"
)

// repoRoot is the repository root (this file is tests/package/build_test.go).
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the test's own source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// built are the packages under test, made once per test binary.
type built struct {
	dir      string
	deb, rpm string
	err      error
	temp     bool // dir is ours to remove
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pkgs.temp {
		os.RemoveAll(pkgs.dir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	pkgs      built
)

// packages returns the .deb and .rpm: those in GPUFENCE_PACKAGE_DIR, or
// those `make package` builds into a temporary dist folder.
func packages(t *testing.T) built {
	t.Helper()
	if testing.Short() {
		t.Skip("package tests build the .deb and .rpm; skipped with -short")
	}
	buildOnce.Do(func() {
		dir := os.Getenv("GPUFENCE_PACKAGE_DIR")
		if dir == "" {
			var err error
			if dir, err = os.MkdirTemp("", "gpufence-dist-"); err != nil {
				pkgs.err = err
				return
			}
			pkgs.dir, pkgs.temp = dir, true
			start := time.Now()
			args := []string{"package", "DIST=" + dir}
			// The release tarballs from the offline mirror, not the
			// network (packaging/release-headers.sh fetches them when
			// SLURM_SRC_DIR is unset).
			if os.Getenv("SLURM_SRC_DIR") == "" {
				if src, err := slurmrel.SourceDir(); err == nil {
					args = append(args, "SLURM_SRC_DIR="+src)
				}
			}
			out, err := run(repoRoot(t), "make", args...)
			if err != nil {
				pkgs.err = fmt.Errorf("make package: %w\n%s", err, out)
				return
			}
			t.Logf("make package: %s", time.Since(start).Round(time.Millisecond))
		}
		pkgs.dir = dir
		pkgs.deb, pkgs.err = only(dir, "gpufence_*.deb")
		if pkgs.err == nil {
			pkgs.rpm, pkgs.err = only(dir, "gpufence-*.rpm")
		}
	})
	if pkgs.err != nil {
		t.Fatal(pkgs.err)
	}
	return pkgs
}

func only(dir, pattern string) (string, error) {
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil || len(m) != 1 {
		return "", fmt.Errorf("want one %s in %s, found %d", pattern, dir, len(m))
	}
	return m[0], nil
}

// run runs a command in dir and returns its combined output.
func run(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

// need skips the test when a tool is missing; tests/deps.sh installs them.
func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (tests/deps.sh installs it)", tool)
		}
	}
}
