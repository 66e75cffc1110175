// SPDX-License-Identifier: Apache-2.0

// Package slurmrel gives the tests the Slurm release they run against: the
// releases gpufence ships a plugin build for (packaging/slurm-releases, one
// line each), and, for one of them, its real daemons on this machine:
//   - this machine's own Debian packages (/usr) when they are that release;
//   - a release source tarball (SLURM_SRC_DIR, checked against SHA256SUMS)
//     built once per machine into CacheDir()/<key>/opt/slurm, AWS
//     ParallelCluster's layout (build-source.sh);
//   - a Debian suite's packages in a debootstrap root (tests/debroot), which
//     the cluster harness runs chrooted against this host's kernel and
//     cgroup tree.
package slurmrel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"

	"github.com/gpufence/gpufence/tests/debroot"
)

// CacheDir holds the source builds, one folder per tarball checksum and
// recipe, under the tests' cache (debroot.CacheBase: GPUFENCE_TEST_CACHE,
// else /var/cache/gpufence-test).
func CacheDir() string { return filepath.Join(debroot.CacheBase(), "slurm") }

// Release is one line of packaging/slurm-releases.
type Release struct {
	Version string // major.minor, e.g. 25.11
	Source  string // debian:SUITE or src:TARBALL
	// MultiSlurmd builds a src: release with --enable-multiple-slurmd
	// (several slurmd on one host, `slurmd -N`, for the multi-node test
	// cluster), a build of its own beside the plain one. The plain build
	// is SchedMD's default and ParallelCluster's: its scope is
	// slurmstepd.scope, without the node name.
	MultiSlurmd bool
}

// buildFlavour is build-source.sh's third argument for the release.
func (r Release) buildFlavour() string {
	if r.MultiSlurmd {
		return "multislurmd"
	}
	return "plain"
}

// Suite is the Debian suite of a debian: release, else "".
func (r Release) Suite() string {
	if s, ok := strings.CutPrefix(r.Source, "debian:"); ok {
		return s
	}
	return ""
}

// Tarball is the tarball name of a src: release, else "".
func (r Release) Tarball() string {
	if s, ok := strings.CutPrefix(r.Source, "src:"); ok {
		return s
	}
	return ""
}

// Number is the release as Slurm's version number without the micro
// (major<<16 | minor<<8), for comparisons.
func (r Release) Number() int { return Number(r.Version) }

// Number parses "25.11" or "25.11.7" into major<<16 | minor<<8 (the micro
// is dropped); -1 when it is not a version.
func Number(v string) int {
	m := regexp.MustCompile(`^(\d+)\.(\d+)`).FindStringSubmatch(v)
	if m == nil {
		return -1
	}
	a, _ := strconv.Atoi(m[1])
	b, _ := strconv.Atoi(m[2])
	return a<<16 | b<<8
}

// AtLeast reports whether the release is v (major.minor) or newer.
func (r Release) AtLeast(v string) bool { return r.Number() >= Number(v) }

// ModuleRoot is the gpufence repository: up from the working directory,
// else from this source file.
func ModuleRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, d := range starts {
		for ; ; d = filepath.Dir(d) {
			b, err := os.ReadFile(filepath.Join(d, "go.mod"))
			if err == nil && bytes.Contains(b, []byte("module github.com/gpufence/gpufence\n")) {
				return d, nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return "", errors.New("gpufence module root not found (run from inside the repository)")
}

// List reads packaging/slurm-releases.
func List() ([]Release, error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(root, "packaging", "slurm-releases")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, string(b))
}

// Parse parses the text of a releases file (name is for errors).
func Parse(name, text string) ([]Release, error) {
	var out []Release
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Fields(l)
		if len(f) != 2 {
			return nil, fmt.Errorf("%s:%d: want \"MAJOR.MINOR SOURCE\", got %q", name, n, l)
		}
		if !regexp.MustCompile(`^\d+\.\d\d$`).MatchString(f[0]) {
			return nil, fmt.Errorf("%s:%d: %q is not a major.minor like 24.11", name, n, f[0])
		}
		r := Release{Version: f[0], Source: f[1]}
		if r.Suite() == "" && r.Tarball() == "" {
			return nil, fmt.Errorf("%s:%d: source %q is not debian:SUITE or src:TARBALL", name, n, f[1])
		}
		for _, o := range out {
			if o.Version == r.Version {
				return nil, fmt.Errorf("%s:%d: %s listed twice", name, n, r.Version)
			}
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s lists no release", name)
	}
	return out, nil
}

// Lookup returns the release v (major.minor) of packaging/slurm-releases.
func Lookup(v string) (Release, error) {
	all, err := List()
	if err != nil {
		return Release{}, err
	}
	var known []string
	for _, r := range all {
		if r.Version == v {
			return r, nil
		}
		known = append(known, r.Version)
	}
	return Release{}, fmt.Errorf("Slurm %q is not in packaging/slurm-releases (known: %s)", v, strings.Join(known, " "))
}

// SourceDir is the folder of release tarballs and their SHA256SUMS:
// SLURM_SRC_DIR, else ../shared/slurm-src next to the repository.
func SourceDir() (string, error) {
	if d := os.Getenv("SLURM_SRC_DIR"); d != "" {
		return d, nil
	}
	var cands []string
	if root, err := ModuleRoot(); err == nil {
		cands = append(cands, filepath.Join(root, "..", "shared", "slurm-src"))
	}
	for _, d := range cands {
		if _, err := os.Stat(filepath.Join(d, "SHA256SUMS")); err == nil {
			return filepath.Clean(d), nil
		}
	}
	return "", fmt.Errorf("no Slurm release tarballs: set SLURM_SRC_DIR to a folder with them and their SHA256SUMS (looked in %s)", strings.Join(cands, ", "))
}

// Kind is where a release's daemons come from.
type Kind string

const (
	KindHost   Kind = "host"   // this machine's packages, /usr
	KindSource Kind = "source" // built from the release tarball, ParallelCluster's prefix layout
	KindRoot   Kind = "debroot"
)

// Install is a release's daemons and clients, ready to run.
type Install struct {
	Release
	Kind Kind
	// Full is the release's full version (slurmd -V), e.g. 25.11.7; for
	// KindRoot it is known once a root is unpacked (the cluster fills it).
	Full string
	// Prefix holds bin/ and sbin/: /usr for KindHost and KindRoot (inside
	// the root), CacheDir()/<key>/opt/slurm for KindSource.
	Prefix string
	// Include is the folder holding slurm/spank.h, on this machine's
	// filesystem (KindRoot: relative to the unpacked root).
	Include string
	// Tarball is the debootstrap root to unpack (KindRoot).
	Tarball string
	// BuildSeconds is how long the cached source build took (KindSource).
	BuildSeconds int
	// StandIn is a folder standing in for / with Slurm at opt/slurm
	// (KindSource), for tests of ParallelCluster's layout.
	StandIn string
}

// Bin is the path of a Slurm command (slurmd, srun, ...): sbin/ for the
// daemons, bin/ for the clients, under Prefix.
func (in *Install) Bin(name string) string {
	switch name {
	case "slurmd", "slurmctld", "slurmstepd", "slurmdbd", "slurmrestd":
		return filepath.Join(in.Prefix, "sbin", name)
	}
	return filepath.Join(in.Prefix, "bin", name)
}

// buildPackages are what a source build needs besides gcc and make
// (measured on Debian 12 for 23.11 to 25.11: cgroup_v2, gres_gpu,
// auth_munge and switch_nvidia_imex are built with them).
var buildPackages = []string{"gcc", "make", "libc6-dev", "libmunge-dev", "libdbus-1-dev", "libhwloc-dev", "libjson-c-dev", "libyaml-dev", "pkg-config", "xz-utils"}

// Ensure makes the release's daemons available on this machine: nothing for
// the host's own packages, a source build (minutes, once per machine) or a
// debootstrap root (once per machine).
func Ensure(ctx context.Context, r Release, logf func(string, ...any)) (*Install, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if r.Suite() != "" {
		if v, err := version(ctx, "/usr/sbin/slurmd"); err == nil && Number(v) == r.Number() {
			return &Install{Release: r, Kind: KindHost, Full: v, Prefix: "/usr", Include: "/usr/include"}, nil
		}
		tb, err := debroot.Tarball(ctx, r.Suite(), logf)
		if err != nil {
			return nil, fmt.Errorf("Slurm %s (Debian %s): %w", r.Version, r.Suite(), err)
		}
		return &Install{Release: r, Kind: KindRoot, Prefix: "/usr", Include: "/usr/include", Tarball: tb}, nil
	}
	dir, err := SourceDir()
	if err != nil {
		return nil, fmt.Errorf("Slurm %s: %w", r.Version, err)
	}
	if err := ensurePackages(ctx, logf); err != nil {
		return nil, err
	}
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	logf("Slurm %s: %s source build of %s (cached in %s; minutes when not built yet)", r.Version, r.buildFlavour(), r.Tarball(), CacheDir())
	cmd := exec.CommandContext(ctx, filepath.Join(root, "tests", "slurmrel", "build-source.sh"), filepath.Join(dir, r.Tarball()), CacheDir(), r.buildFlavour())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("Slurm %s: build-source.sh: %v\n%s", r.Version, err, stderr.String())
	}
	prefix := strings.TrimSpace(stdout.String())
	in := &Install{Release: r, Kind: KindSource, Prefix: prefix, Include: filepath.Join(prefix, "include"),
		StandIn: strings.TrimSuffix(prefix, "/opt/slurm")}
	if b, err := os.ReadFile(filepath.Join(in.StandIn, ".built")); err == nil {
		in.BuildSeconds, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if in.Full, err = version(ctx, in.Bin("slurmd")); err != nil {
		return nil, fmt.Errorf("Slurm %s built in %s: %w", r.Version, prefix, err)
	}
	if Number(in.Full) != r.Number() {
		return nil, fmt.Errorf("%s is Slurm %s, not %s", in.Bin("slurmd"), in.Full, r.Version)
	}
	return in, nil
}

// version runs `slurmd -V` ("slurm 25.11.7", "slurm-wlm 22.05.8").
func version(ctx context.Context, slurmd string) (string, error) {
	out, err := exec.CommandContext(ctx, slurmd, "-V").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s -V: %v %s", slurmd, err, out)
	}
	m := regexp.MustCompile(`^slurm[-a-z]* (\d+\.\d+\.\d+)`).FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s -V: %q", slurmd, out)
	}
	return string(m[1]), nil
}

// Version is the release of a slurmd binary, from `slurmd -V`.
func Version(ctx context.Context, slurmd string) (string, error) { return version(ctx, slurmd) }

func ensurePackages(ctx context.Context, logf func(string, ...any)) error {
	return InstallMissing(ctx, "building Slurm", buildPackages, logf)
}

// InstallMissing installs those of pkgs (Debian packages) that are not
// installed, through apt-get as root; without root it names them in an
// error that says what (such as "building Slurm") needs them.
func InstallMissing(ctx context.Context, what string, pkgs []string, logf func(string, ...any)) error {
	var missing []string
	for _, p := range pkgs {
		out, _ := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Status}", p).Output()
		if !strings.Contains(string(out), "install ok installed") {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s needs %s (apt-get install them, or run as root)", what, strings.Join(missing, " "))
	}
	logf("installing %s", strings.Join(missing, " "))
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	for _, args := range [][]string{{"update", "-q"}, append([]string{"install", "-y", "-q", "--no-install-recommends"}, missing...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// EnvVar selects the release the cluster harness and the e2e suite run
// against (`make e2e SLURM=25.11` sets it); empty means Default.
const EnvVar = "GPUFENCE_SLURM"

// Default is the release run when EnvVar is empty: Debian 12's, this
// machine's own packages.
const Default = "22.05"

// TestSlice is the non-default CgroupSlice of the "+slice" variant.
const TestSlice = "gpufence_test.slice"

// Selection is one release to run and the variant of its setup:
//
//	25.11             the release, Slurm's defaults
//	25.11+slice       CgroupSlice=TestSlice (25.11 and newer)
//	26.05+jobidpaths  CgroupJobIdPaths=yes: job_<id> job cgroups, not SLUIDs (26.05 and newer)
//	23.11+pcluster    AWS ParallelCluster's files: plugstack.conf including
//	                  plugstack.conf.d/*, its gres.conf lines, no ConstrainDevices
//	25.11+multislurmd the source build with --enable-multiple-slurmd (a
//	                  multi-node cluster picks it by itself); its scope is
//	                  <node>_slurmstepd.scope
//
// Variants combine: 25.11+pcluster+slice.
type Selection struct {
	Name       string
	Release    Release
	Slice      string
	JobIDPaths bool
	PCluster   bool
}

// Select parses a selection; "" is Default.
func Select(s string) (Selection, error) {
	if s == "" {
		s = Default
	}
	parts := strings.Split(s, "+")
	r, err := Lookup(parts[0])
	if err != nil {
		return Selection{}, err
	}
	sel := Selection{Name: s, Release: r}
	for _, v := range parts[1:] {
		switch v {
		case "slice":
			if !r.AtLeast("25.11") {
				return Selection{}, fmt.Errorf("%s: CgroupSlice exists from Slurm 25.11 on", s)
			}
			sel.Slice = TestSlice
		case "jobidpaths":
			if !r.AtLeast("26.05") {
				return Selection{}, fmt.Errorf("%s: CgroupJobIdPaths exists from Slurm 26.05 on (before, job cgroups are job_<id> anyway)", s)
			}
			sel.JobIDPaths = true
		case "pcluster":
			sel.PCluster = true
		case "multislurmd":
			if r.Tarball() == "" {
				return Selection{}, fmt.Errorf("%s: multislurmd is a source build's variant; Debian's packages are built with multiple-slurmd already", s)
			}
			sel.Release.MultiSlurmd = true
		default:
			return Selection{}, fmt.Errorf("%s: unknown variant %q (known: slice, jobidpaths, pcluster, multislurmd)", s, v)
		}
	}
	return sel, nil
}

// FromEnv is Select(os.Getenv(EnvVar)).
func FromEnv() (Selection, error) { return Select(os.Getenv(EnvVar)) }

// SLUIDJobDirs reports whether job cgroups are named by SLUID (26.05 and
// newer unless CgroupJobIdPaths=yes) rather than job_<id>.
func (s Selection) SLUIDJobDirs() bool { return s.Release.AtLeast("26.05") && !s.JobIDPaths }

// Cached returns a src: release's source build when this machine has
// built it already (it never builds).
func Cached(r Release) (*Install, bool) {
	if r.Tarball() == "" {
		return nil, false
	}
	dir, err := SourceDir()
	if err != nil {
		return nil, false
	}
	root, err := ModuleRoot()
	if err != nil {
		return nil, false
	}
	script, err := os.ReadFile(filepath.Join(root, "tests", "slurmrel", "build-source.sh"))
	if err != nil {
		return nil, false
	}
	m := regexp.MustCompile(`(?m)^recipe=(\S+)$`).FindSubmatch(script)
	if m == nil {
		return nil, false
	}
	f, err := os.Open(filepath.Join(dir, r.Tarball()))
	if err != nil {
		return nil, false
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, false
	}
	name := strings.TrimSuffix(r.Tarball(), filepath.Ext(r.Tarball()))
	name = strings.TrimSuffix(name, ".tar")
	key := fmt.Sprintf("%s-%x-%s", name, h.Sum(nil)[:8], m[1])
	if r.MultiSlurmd {
		key += "-multislurmd"
	}
	standIn := filepath.Join(CacheDir(), key)
	b, err := os.ReadFile(filepath.Join(standIn, ".built"))
	if err != nil {
		return nil, false
	}
	in := &Install{Release: r, Kind: KindSource, Prefix: filepath.Join(standIn, "opt", "slurm"), StandIn: standIn}
	in.Include = filepath.Join(in.Prefix, "include")
	in.BuildSeconds, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	return in, true
}
