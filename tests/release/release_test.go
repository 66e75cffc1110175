// SPDX-License-Identifier: Apache-2.0

// Package releasetest checks what a release tag publishes: the package
// version made from git tags (packaging/pkg-version.sh) and how dpkg and
// rpm order it, the pinned Slurm sources (packaging/slurm-sources), and
// `make release` run for real in a throw-away clone tagged v9.8.7 and
// signed with a throw-away GPG key: four packages for amd64 and arm64,
// their binaries' ELF machine, SHA256SUMS and its signature, the apt and
// yum metadata, and no path of the build machine in any of it.
package releasetest

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/tests/slurmrel"
)

// repoRoot is the repository root (this file is tests/release/release_test.go).
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the test's own source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// run runs a command in dir with env added and returns its combined output.
func run(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

func must(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	out, err := run(dir, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
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

// TestPkgVersion checks the tag to package version mapping, that dpkg and
// rpm both order the results as the versions mean, and that a v* tag that
// is not semantic versioning is refused with a message naming it.
func TestPkgVersion(t *testing.T) {
	need(t, "dpkg", "rpm")
	script := filepath.Join(repoRoot(t), "packaging", "pkg-version.sh")
	const epoch = "1796206396" // 2026-12-02
	for in, want := range map[string]string{
		"v1.2.3":                 "1.2.3",
		"v1.2.3-rc.1":            "1.2.3~rc.1",
		"v1.2.3-4-gabc1234":      "1.2.3+git4.abc1234",
		"v1.2.3-rc.1-4-gabc1234": "1.2.3~rc.1+git4.abc1234",
		"v10.0.0-dirty":          "10.0.0+dirty",
		"abc1234":                "0.0.0~git20261202.abc1234",
		"abc1234-dirty":          "0.0.0~git20261202.abc1234.dirty",
	} {
		out, err := run("", nil, script, in, epoch)
		if got := strings.TrimSpace(out); err != nil || got != want {
			t.Errorf("pkg-version.sh %s = %q (%v), want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"v1.2", "v1.2.3.4", "v01.2.3", "vnext", "v1.2.3+build.5", "v1.2.3-rc-1", "v1.2.3-rc.1_x-2-gabc1234"} {
		out, err := run("", nil, script, bad, epoch)
		if err == nil || !strings.Contains(out, "is not a release tag vMAJOR.MINOR.PATCH") || !strings.Contains(out, bad) {
			t.Errorf("pkg-version.sh %s: want a refusal naming it, got err=%v: %s", bad, err, out)
		}
	}

	// Each version below the next, in both formats (with nfpm's release 1).
	order := []string{
		"0.0.0~git20261201.aaaaaaa",
		"0.0.0~git20261202.0000000",
		"0.9.0",
		"0.9.0+git3.abc1234",
		"1.0.0~rc.1",
		"1.0.0~rc.1+git2.abc1234",
		"1.0.0~rc.2",
		"1.0.0",
		"1.0.0+dirty",
		"1.0.0+git1.abc1234",
		"1.0.1",
		"1.10.0",
	}
	for i := 0; i+1 < len(order); i++ {
		lo, hi := order[i]+"-1", order[i+1]+"-1"
		if out, err := run("", nil, "dpkg", "--compare-versions", lo, "lt", hi); err != nil {
			t.Errorf("dpkg: %s is not below %s: %v %s", lo, hi, err, out)
		}
		out, err := run("", nil, "rpm", "--eval", fmt.Sprintf(`%%{lua: print(rpm.vercmp(%q, %q))}`, lo, hi))
		if err != nil || strings.TrimSpace(out) != "-1" {
			t.Errorf("rpm: vercmp(%s, %s) = %q (%v), want -1", lo, hi, strings.TrimSpace(out), err)
		}
	}
}

// TestRelease runs `make release` in a clone of this tree (its uncommitted
// changes included) tagged v9.8.7, with a throw-away signing key, and
// checks everything it published.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the release packages for two arches (a few minutes); skipped with -short")
	}
	need(t, "git", "gpg", "gpgconf", "dpkg-deb", "rpm", "rpm2cpio", "cpio", "sha256sum",
		"apt-ftparchive", "createrepo_c", "aarch64-linux-gnu-gcc", "x86_64-linux-gnu-gcc")
	root := repoRoot(t)
	src, err := slurmrel.SourceDir()
	if err != nil {
		t.Fatal(err)
	}
	if src, err = filepath.Abs(src); err != nil {
		t.Fatal(err)
	}

	clone := filepath.Join(t.TempDir(), "gpufence")
	must(t, "", nil, "git", "clone", "-q", "--no-checkout", root, clone)
	must(t, clone, nil, "git", "checkout", "-q", strings.TrimSpace(must(t, root, nil, "git", "rev-parse", "HEAD")))
	if diff := must(t, root, nil, "git", "diff", "HEAD", "--binary"); diff != "" {
		cmd := exec.Command("git", "apply", "--index")
		cmd.Dir, cmd.Stdin = clone, strings.NewReader(diff)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git apply of the working tree's changes: %v\n%s", err, out)
		}
	}
	for _, f := range strings.Fields(must(t, root, nil, "git", "ls-files", "--others", "--exclude-standard")) {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(filepath.Join(root, f))
		os.MkdirAll(filepath.Dir(filepath.Join(clone, f)), 0o755)
		if err := os.WriteFile(filepath.Join(clone, f), data, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) string {
		return must(t, clone, nil, "git", append([]string{"-c", "user.name=gpufence test", "-c", "user.email=test@invalid"}, args...)...)
	}
	git("add", "-A")
	git("commit", "-q", "--allow-empty", "-m", "the tree under test")

	// A v* tag that is not semver stops the build before anything is built.
	git("tag", "v9.8")
	out, err := run(clone, nil, "make", "--no-print-directory", "release", "RELEASE_DIST="+filepath.Join(clone, "bad"))
	if err == nil || !strings.Contains(out, `tag "v9.8"`) {
		t.Errorf("make release on tag v9.8: want an error naming the tag, got err=%v:\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(clone, "bad")); err == nil {
		t.Error("make release on a non-semver tag made its dist folder anyway")
	}
	git("tag", "-d", "v9.8")
	git("tag", "v9.8.7")

	gnupg, err := os.MkdirTemp("", "gf-gpg-") // short: gpg-agent's socket path is limited
	if err != nil {
		t.Fatal(err)
	}
	genv := []string{"GNUPGHOME=" + gnupg}
	t.Cleanup(func() {
		run("", genv, "gpgconf", "--kill", "all")
		os.RemoveAll(gnupg)
	})
	must(t, "", genv, "gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
		"--quick-gen-key", "gpufence release test <release-test@invalid>", "rsa2048", "sign", "never")
	var fpr string
	for _, l := range strings.Split(must(t, "", genv, "gpg", "--batch", "--with-colons", "--list-secret-keys"), "\n") {
		if f := strings.Split(l, ":"); f[0] == "fpr" && fpr == "" {
			fpr = f[9]
		}
	}
	if fpr == "" {
		t.Fatal("no fingerprint of the generated key")
	}

	start := time.Now()
	out, err = run(clone, append(genv, "SLURM_SRC_DIR="+src), "make", "--no-print-directory", "release", "RELEASE_GPG_KEY="+fpr)
	if err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	t.Logf("make release: %s", time.Since(start).Round(time.Second))
	dist := filepath.Join(clone, "dist", "release")
	// The secret key exported for nfpm is gone, and in no artifact.
	if _, err := os.Stat(filepath.Join(clone, "build", "release", "signing-key.asc")); err == nil {
		t.Error("make release left the exported secret key in build/release/signing-key.asc")
	}
	noBuildPaths(t, "dist/release (secret key)", dist, "PGP PRIVATE KEY")

	// Four packages, named and labelled for their arch.
	pkgs := map[string]string{ // file -> Go arch
		"gpufence_9.8.7-1_amd64.deb":   "amd64",
		"gpufence_9.8.7-1_arm64.deb":   "arm64",
		"gpufence-9.8.7-1.x86_64.rpm":  "amd64",
		"gpufence-9.8.7-1.aarch64.rpm": "arm64",
	}
	var found []string
	for _, pat := range []string{"*.deb", "*.rpm"} {
		m, _ := filepath.Glob(filepath.Join(dist, pat))
		for _, f := range m {
			found = append(found, filepath.Base(f))
		}
	}
	sort.Strings(found)
	var want []string
	for f := range pkgs {
		want = append(want, f)
	}
	sort.Strings(want)
	if strings.Join(found, " ") != strings.Join(want, " ") {
		t.Fatalf("packages in %s: %v, want %v", dist, found, want)
	}
	debArch := map[string]string{"amd64": "amd64", "arm64": "arm64"}
	rpmArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	slurms, err := slurmrel.List()
	if err != nil {
		t.Fatal(err)
	}
	for f, arch := range pkgs {
		p := filepath.Join(dist, f)
		x := t.TempDir()
		if strings.HasSuffix(f, ".deb") {
			if got := strings.TrimSpace(must(t, "", nil, "dpkg-deb", "-f", p, "Architecture")); got != debArch[arch] {
				t.Errorf("%s: Architecture %q, want %q", f, got, debArch[arch])
			}
			must(t, "", nil, "dpkg-deb", "-x", p, x)
		} else {
			if got := must(t, "", nil, "rpm", "-qp", "--nosignature", "--qf", "%{ARCH} %{VERSION}", p); got != rpmArch[arch]+" 9.8.7" {
				t.Errorf("%s: rpm ARCH VERSION %q, want %q", f, got, rpmArch[arch]+" 9.8.7")
			}
			// nfpm writes absolute paths into the payload
			// (goreleaser/nfpm#1122): without --no-absolute-filenames
			// cpio run as root would install the package into /.
			must(t, x, nil, "sh", "-c", `rpm2cpio "$1" | cpio -idm --quiet --no-absolute-filenames`, "sh", p)
		}
		bins := []string{filepath.Join(x, "usr", "sbin", "gpufence")}
		sos, _ := filepath.Glob(filepath.Join(x, "usr", "lib", "gpufence", "slurm-*", "spank_gpufence.so"))
		if len(sos) != len(slurms) {
			t.Errorf("%s: %d SPANK plugin builds, want one per packaging/slurm-releases line (%d)", f, len(sos), len(slurms))
		}
		for _, b := range append(bins, sos...) {
			e, err := elf.Open(b)
			if err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			if e.Machine != machine[arch] {
				t.Errorf("%s: %s is %v, want %v", f, strings.TrimPrefix(b, x), e.Machine, machine[arch])
			}
			e.Close()
		}
		// Payloads are compressed: search the files themselves.
		noBuildPaths(t, f, x, clone, root, gnupg)
	}
	noBuildPaths(t, "dist/release", dist, clone, root, gnupg)

	// SHA256SUMS: sha256sum -c, and it covers every package.
	out = must(t, dist, nil, "sha256sum", "-c", "SHA256SUMS")
	if n := strings.Count(out, ": OK"); n != len(pkgs) {
		t.Errorf("sha256sum -c checked %d files, want %d:\n%s", n, len(pkgs), out)
	}
	// Its signature verifies, and not once one byte changed.
	must(t, dist, genv, "gpg", "--batch", "--verify", "SHA256SUMS.asc", "SHA256SUMS")
	sums, _ := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	flipped := filepath.Join(t.TempDir(), "SHA256SUMS")
	b := append([]byte(nil), sums...)
	b[10] ^= 1
	os.WriteFile(flipped, b, 0o644)
	if out, err := run(dist, genv, "gpg", "--batch", "--verify", "SHA256SUMS.asc", flipped); err == nil {
		t.Errorf("gpg --verify accepted SHA256SUMS with one byte flipped:\n%s", out)
	}
	// The exported key is the one that signed.
	kenv := []string{"GNUPGHOME=" + t.TempDir()}
	must(t, "", kenv, "gpg", "--batch", "--import", filepath.Join(dist, "gpufence-release.asc"))
	must(t, dist, kenv, "gpg", "--batch", "--verify", "SHA256SUMS.asc", "SHA256SUMS")
	must(t, dist, kenv, "gpg", "--batch", "--verify", "InRelease")
	must(t, dist, kenv, "gpg", "--batch", "--verify", "Release.gpg", "Release")
	must(t, dist, kenv, "gpg", "--batch", "--verify", "repodata/repomd.xml.asc", "repodata/repomd.xml")
	// The rpms carry a signature rpm checks with that key.
	rpmdb := t.TempDir()
	must(t, "", nil, "rpmkeys", "--dbpath", rpmdb, "--import", filepath.Join(dist, "gpufence-release.asc"))
	for f := range pkgs {
		if strings.HasSuffix(f, ".rpm") {
			out := must(t, dist, nil, "rpmkeys", "--dbpath", rpmdb, "-Kv", f)
			if !strings.Contains(out, "Header V4 RSA/SHA256 Signature") || strings.Contains(out, "NOKEY") || strings.Contains(out, "BAD") {
				t.Errorf("rpmkeys -Kv %s: want a good V4 RSA signature:\n%s", f, out)
			}
		}
	}

	checkApt(t, dist, pkgs)
	checkYum(t, dist, pkgs)
}

// noBuildPaths fails for each file under dir that names the build
// machine's folders: /work/ (this machine's), the clone, the checkout or
// the key's GNUPGHOME.
func noBuildPaths(t *testing.T, what, dir string, paths ...string) {
	t.Helper()
	needles := [][]byte{[]byte("/work/")}
	for _, p := range paths {
		needles = append(needles, []byte(p))
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Error(err)
			return nil
		}
		for _, n := range needles {
			if bytes.Contains(data, n) {
				t.Errorf("%s: %s holds %q", what, strings.TrimPrefix(p, dir), n)
			}
		}
		return nil
	})
}

func sha256File(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// checkApt: Packages lists each .deb with its SHA256 and size, and
// Release's SHA256 lines match Packages and Packages.gz.
func checkApt(t *testing.T, dist string, pkgs map[string]string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dist, "Packages"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]map[string]string{}
	for _, stanza := range strings.Split(strings.TrimSpace(string(data)), "\n\n") {
		f := map[string]string{}
		for _, l := range strings.Split(stanza, "\n") {
			if k, v, ok := strings.Cut(l, ": "); ok && !strings.HasPrefix(l, " ") {
				f[k] = v
			}
		}
		listed[strings.TrimPrefix(f["Filename"], "./")] = f
	}
	for name, arch := range pkgs {
		if !strings.HasSuffix(name, ".deb") {
			continue
		}
		f, ok := listed[name]
		if !ok {
			t.Errorf("Packages does not list %s (lists %v)", name, listed)
			continue
		}
		if got, want := f["SHA256"], sha256File(t, filepath.Join(dist, name)); got != want {
			t.Errorf("Packages: %s SHA256 %s, the file's is %s", name, got, want)
		}
		if f["Architecture"] != arch || f["Version"] != "9.8.7-1" || f["Package"] != "gpufence" {
			t.Errorf("Packages: %s is %s %s %s", name, f["Package"], f["Version"], f["Architecture"])
		}
	}
	if len(listed) != 2 {
		t.Errorf("Packages has %d entries, want 2", len(listed))
	}
	rel, err := os.ReadFile(filepath.Join(dist, "Release"))
	if err != nil {
		t.Fatal(err)
	}
	hashes := map[string]string{}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(rel))
	for sc.Scan() {
		l := sc.Text()
		switch {
		case l == "SHA256:":
			in = true
		case !strings.HasPrefix(l, " "):
			in = false
		case in:
			if f := strings.Fields(l); len(f) == 3 {
				hashes[f[2]] = f[0]
			}
		}
	}
	for _, f := range []string{"Packages", "Packages.gz"} {
		if got, want := hashes[f], sha256File(t, filepath.Join(dist, f)); got != want {
			t.Errorf("Release: %s SHA256 %q, the file's is %s", f, got, want)
		}
	}
	if !bytes.Contains(append([]byte("\n"), rel...), []byte("\nArchitectures: amd64 arm64\n")) {
		t.Errorf("Release has no \"Architectures: amd64 arm64\":\n%s", rel)
	}
}

// checkYum: repomd.xml names a primary whose packages are the two rpms,
// with their SHA256.
func checkYum(t *testing.T, dist string, pkgs map[string]string) {
	t.Helper()
	var repomd struct {
		Data []struct {
			Type     string `xml:"type,attr"`
			Location struct {
				Href string `xml:"href,attr"`
			} `xml:"location"`
		} `xml:"data"`
	}
	data, err := os.ReadFile(filepath.Join(dist, "repodata", "repomd.xml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(data, &repomd); err != nil {
		t.Fatalf("repomd.xml: %v", err)
	}
	var primary string
	for _, d := range repomd.Data {
		if d.Type == "primary" {
			primary = d.Location.Href
		}
	}
	if !strings.HasSuffix(primary, ".xml.gz") {
		t.Fatalf("repomd.xml: primary is %q, want a .xml.gz", primary)
	}
	fz, err := os.Open(filepath.Join(dist, primary))
	if err != nil {
		t.Fatal(err)
	}
	defer fz.Close()
	zr, err := gzip.NewReader(fz)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	var md struct {
		Packages []struct {
			Arch     string `xml:"arch"`
			Checksum struct {
				Type  string `xml:"type,attr"`
				Value string `xml:",chardata"`
			} `xml:"checksum"`
			Location struct {
				Href string `xml:"href,attr"`
			} `xml:"location"`
		} `xml:"package"`
	}
	if err := xml.Unmarshal(raw, &md); err != nil {
		t.Fatalf("%s: %v", primary, err)
	}
	got := map[string]string{}
	for _, p := range md.Packages {
		if p.Checksum.Type != "sha256" {
			t.Errorf("%s: %s checksum type %q", primary, p.Location.Href, p.Checksum.Type)
		}
		got[p.Location.Href] = p.Checksum.Value
	}
	n := 0
	for name := range pkgs {
		if !strings.HasSuffix(name, ".rpm") {
			continue
		}
		n++
		if sum, ok := got[name]; !ok {
			t.Errorf("%s does not list %s (lists %v)", primary, name, got)
		} else if want := sha256File(t, filepath.Join(dist, name)); sum != want {
			t.Errorf("%s: %s SHA256 %s, the file's is %s", primary, name, sum, want)
		}
	}
	if len(got) != n {
		t.Errorf("%s lists %d packages, want %d", primary, len(got), n)
	}
}
