// SPDX-License-Identifier: Apache-2.0

package releasetest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/tests/slurmrel"
)

// TestPinnedSources checks packaging/slurm-sources: every source that
// packaging/slurm-releases names is pinned, the src pins are the offline
// mirror's files, and the fetch path (no SLURM_SRC_DIR) takes an archive of
// the pinned commit and tree and refuses one with a byte of a file changed.
func TestPinnedSources(t *testing.T) {
	root := repoRoot(t)
	pins, err := os.ReadFile(filepath.Join(root, "packaging", "slurm-sources"))
	if err != nil {
		t.Fatal(err)
	}
	type srcPin struct{ sha, commit, tree, url string }
	src := map[string]srcPin{}
	deb := map[string]string{}
	hex := func(n int) *regexp.Regexp { return regexp.MustCompile(fmt.Sprintf("^[0-9a-f]{%d}$", n)) }
	for i, l := range strings.Split(string(pins), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch {
		case f[0] == "src" && len(f) == 6 && hex(64).MatchString(f[2]) && hex(40).MatchString(f[3]) &&
			hex(40).MatchString(f[4]) && strings.HasPrefix(f[5], "https://"):
			src[f[1]] = srcPin{f[2], f[3], f[4], f[5]}
		case f[0] == "deb" && len(f) == 4 && strings.HasPrefix(f[2], "pool/") && hex(64).MatchString(f[3]):
			deb[f[1]] = f[2]
		default:
			t.Errorf("packaging/slurm-sources:%d: not a src or deb pin: %q", i+1, l)
		}
	}
	rels, err := slurmrel.List()
	if err != nil {
		t.Fatal(err)
	}
	lines, _ := os.ReadFile(filepath.Join(root, "packaging", "slurm-releases"))
	for _, l := range strings.Split(string(lines), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if s, ok := strings.CutPrefix(f[1], "debian:"); ok {
			if _, ok := deb[s]; !ok {
				t.Errorf("packaging/slurm-releases: %s (debian:%s) has no deb pin", f[0], s)
			}
		}
	}
	var first slurmrel.Release
	for _, r := range rels {
		if r.Tarball() == "" {
			continue
		}
		if _, ok := src[r.Tarball()]; !ok {
			t.Errorf("packaging/slurm-releases: %s (src:%s) has no src pin", r.Version, r.Tarball())
		}
		if first.Version == "" {
			first = r
		}
	}

	dir, err := slurmrel.SourceDir()
	if err != nil {
		t.Skipf("no offline mirror to check the src pins against: %v", err)
	}
	for name, p := range src {
		if got := sha256File(t, filepath.Join(dir, name)); got != p.sha {
			t.Errorf("%s in %s: SHA256 %s, pinned %s", name, dir, got, p.sha)
		}
	}
	if testing.Short() {
		return
	}

	// The fetch path: GitHub's archive is the same tar, gzip-compressed;
	// served here from file:// URLs.
	tarball := first.Tarball()
	p := src[tarball]
	raw, err := exec.Command("xz", "-dc", filepath.Join(dir, tarball)).Output()
	if err != nil {
		t.Fatalf("xz -dc %s: %v", tarball, err)
	}
	serve := t.TempDir()
	writeGz := func(name string, data []byte) string {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write(data)
		zw.Close()
		path := filepath.Join(serve, name)
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return "file://" + path
	}
	// One byte of one file's contents (the first file after META's
	// header: data follows its 512-byte header), headers left as they are.
	bad := append([]byte(nil), raw...)
	top := strings.TrimSuffix(tarball, ".tar.xz")
	hdr := bytes.Index(bad, []byte(top+"/META\x00"))
	if hdr < 0 || hdr%512 != 0 {
		t.Fatalf("%s: no tar header of %s/META", tarball, top)
	}
	bad[hdr+512] ^= 0x20
	script := filepath.Join(root, "packaging", "slurm-src-headers.sh")
	for _, c := range []struct {
		name string
		data []byte
		ok   bool
		msg  string
	}{
		{"good.tar.gz", raw, true, ""},
		{"bad.tar.gz", bad, false, "holds git tree "},
	} {
		url := writeGz(c.name, c.data)
		pinFile := filepath.Join(serve, c.name+".pins")
		line := fmt.Sprintf("src %s %s %s %s %s\n", tarball, p.sha, p.commit, p.tree, url)
		if err := os.WriteFile(pinFile, []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := run("", []string{"SLURM_SOURCES_FILE=" + pinFile}, script, "--fetch", t.TempDir(), tarball)
		if c.ok {
			if err != nil || !strings.Contains(out, "/src-"+strings.TrimPrefix(top, "slurm-")+"/include") {
				t.Errorf("--fetch %s: %v\n%s", c.name, err, out)
			}
			continue
		}
		if err == nil || !strings.Contains(out, c.msg) || !strings.Contains(out, "expected "+p.tree) {
			t.Errorf("--fetch %s: want a refusal saying %q and the pinned tree, got err=%v:\n%s", c.name, c.msg, err, out)
		}
	}
}
