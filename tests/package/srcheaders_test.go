// SPDX-License-Identifier: Apache-2.0

package pkgtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/tests/slurmrel"
)

// TestSrcHeaders checks packaging/slurm-src-headers.sh, which gives the
// plugin build the headers of the releases Debian lacks: it refuses a
// tarball that does not match its pin in packaging/slurm-sources or is not
// pinned there (whatever a SHA256SUMS next to it says), and the
// slurm_version.h it makes without configure is the one configure makes
// (compared with a source build's installed headers where this machine has
// one).
func TestSrcHeaders(t *testing.T) {
	script := filepath.Join(repoRoot(t), "packaging/slurm-src-headers.sh")
	dir, err := slurmrel.SourceDir()
	if err != nil {
		t.Skipf("no release tarballs: %v", err)
	}
	runScript := func(cache string, tarballs ...string) (string, string, error) {
		cmd := exec.Command(script, append([]string{cache}, tarballs...)...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	rels, err := slurmrel.List()
	if err != nil {
		t.Fatal(err)
	}
	var src []slurmrel.Release
	for _, r := range rels {
		if r.Tarball() != "" {
			src = append(src, r)
		}
	}
	if len(src) == 0 {
		t.Fatal("packaging/slurm-releases has no src: release")
	}
	cache := t.TempDir()
	for _, r := range src {
		t.Run(r.Version, func(t *testing.T) {
			out, stderr, err := runScript(cache, filepath.Join(dir, r.Tarball()))
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			inc := strings.TrimSpace(out)
			got, err := os.ReadFile(filepath.Join(inc, "slurm", "slurm_version.h"))
			if err != nil {
				t.Fatal(err)
			}
			m := regexp.MustCompile(`(?m)^#define SLURM_VERSION_NUMBER 0x([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$`).FindSubmatch(got)
			if m == nil {
				t.Fatalf("no SLURM_VERSION_NUMBER in the generated slurm_version.h:\n%s", got)
			}
			major, _ := strconv.ParseUint(string(m[1]), 16, 8)
			minor, _ := strconv.ParseUint(string(m[2]), 16, 8)
			if slurmrel.Number(r.Version) != int(major<<16|minor<<8) {
				t.Errorf("SLURM_VERSION_NUMBER 0x%s%s%s is not Slurm %s", m[1], m[2], m[3], r.Version)
			}
			for _, h := range []string{"spank.h", "slurm.h", "slurm_errno.h"} {
				if _, err := os.Stat(filepath.Join(inc, "slurm", h)); err != nil {
					t.Error(err)
				}
			}
			in, ok := slurmrel.Cached(r)
			if !ok {
				t.Logf("Slurm %s not built here: not compared with configure's headers", r.Version)
				return
			}
			for _, h := range []string{"slurm_version.h", "spank.h", "slurm.h", "slurm_errno.h"} {
				want, err := os.ReadFile(filepath.Join(in.Include, "slurm", h))
				if err != nil {
					t.Fatal(err)
				}
				mine, _ := os.ReadFile(filepath.Join(inc, "slurm", h))
				if dropGenerated(mine) != dropGenerated(want) {
					t.Errorf("%s differs from the one configure and make install put in %s", h, in.Include)
				}
			}
			t.Logf("Slurm %s: headers equal to those of the source build in %s", r.Version, in.Include)
		})
	}

	// A tarball that does not match, or is not listed, is refused.
	data, err := os.ReadFile(filepath.Join(dir, src[0].Tarball()))
	if err != nil {
		t.Fatal(err)
	}
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	bad := t.TempDir()
	writeFile(t, filepath.Join(bad, "SHA256SUMS"), string(sums), 0o644)
	writeFile(t, filepath.Join(bad, src[0].Tarball()), string(data)+"x", 0o644)
	writeFile(t, filepath.Join(bad, "slurm-99.01.1.tar.xz"), string(data), 0o644)
	for tarball, msg := range map[string]string{src[0].Tarball(): "does not match", "slurm-99.01.1.tar.xz": "is not listed"} {
		_, stderr, err := runScript(t.TempDir(), filepath.Join(bad, tarball))
		if err == nil || !strings.Contains(stderr, msg) {
			t.Errorf("%s: want a refusal saying %q, got err=%v:\n%s", tarball, msg, err, stderr)
		}
	}
}

// dropGenerated drops the "Generated from ... by ..." line that names the
// tool that made the header.
func dropGenerated(b []byte) string {
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, "Generated from slurm_version.h.in") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
