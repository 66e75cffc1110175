// SPDX-License-Identifier: Apache-2.0

package pkgtest

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// entry is one path of a package: its type and permission bits, and for
// RPM whether it is %config.
type entry struct {
	mode   fs.FileMode
	config bool
}

// want is the installed layout both packages share (docs/packaging.md and
// the agreed layout), without the parts that differ per format.
var want = map[string]fs.FileMode{
	"/usr/sbin/gpufence":                                          0o755,
	"/usr/lib/gpufence":                                           fs.ModeDir | 0o755,
	"/usr/lib/gpufence/link-plugin":                               0o755,
	"/etc/gpufence/agent.yaml":                                    0o644,
	"/etc/slurm/plugstack.conf.d/gpufence.conf":                   0o644,
	"/usr/share/gpufence/plugstack.conf":                          0o644,
	"/usr/share/gpufence/grafana/gpufence-dashboard.json":         0o644,
	"/usr/share/gpufence/cloudwatch/amazon-cloudwatch-agent.json": 0o644,
	"/usr/share/gpufence/cloudwatch/prometheus.yaml":              0o644,
	"/usr/share/gpufence/cloudwatch/idle-gpu-alarm.json":          0o644,
	"/usr/share/gpufence/cloudwatch/gpufence-dashboard.json":      0o644,
	"/etc/logrotate.d/gpufence":                                   0o644,
	"/usr/lib/tmpfiles.d/gpufence.conf":                           0o644,
	"/usr/share/man/man8/gpufence.8.gz":                           0o644,
	"/usr/share/doc/gpufence/copyright":                           0o644,
	"/usr/share/doc/gpufence/README.md":                           0o644,
}

var conffiles = []string{"/etc/gpufence/agent.yaml", "/etc/logrotate.d/gpufence", "/etc/slurm/plugstack.conf.d/gpufence.conf"}

// TestPackageContents checks both packages' file lists, modes and config
// files against the layout, and every SPANK entry they carry against the
// Slurm release its folder names.
func TestPackageContents(t *testing.T) {
	p := packages(t)
	need(t, "dpkg-deb", "rpm")
	deb, debFiles := debContents(t, p.deb)
	rpm := rpmContents(t, p.rpm)

	unitDir := map[string]string{"deb": "/lib/systemd/system", "rpm": "/usr/lib/systemd/system"}
	for format, got := range map[string]map[string]entry{"deb": deb, "rpm": rpm} {
		t.Run(format, func(t *testing.T) {
			w := map[string]fs.FileMode{}
			for k, v := range want {
				w[k] = v
			}
			w[unitDir[format]+"/gpufence.service"] = 0o644
			w[unitDir[format]+"/gpufence.socket"] = 0o644
			for path, mode := range w {
				e, ok := got[path]
				switch {
				case !ok:
					t.Errorf("%s is missing", path)
				case e.mode != mode:
					t.Errorf("%s has mode %v, want %v", path, e.mode, mode)
				}
			}
			// The link is made by link-plugin, never packaged.
			if _, ok := got["/usr/lib/gpufence/spank_gpufence.so"]; ok {
				t.Error("/usr/lib/gpufence/spank_gpufence.so is in the package; link-plugin makes it")
			}
			var plugins []string
			for path, e := range got {
				if m := regexp.MustCompile(`^/usr/lib/gpufence/slurm-(\d+\.\d\d)/spank_gpufence\.so$`).FindStringSubmatch(path); m != nil {
					plugins = append(plugins, m[1])
					if e.mode != 0o644 {
						t.Errorf("%s has mode %v, want 0644", path, e.mode)
					}
				}
			}
			sort.Strings(plugins)
			t.Logf("plugins for Slurm %v", plugins)
			// One build per release of packaging/slurm-releases (or of
			// SLURM_RELEASES, when the build was asked for some only).
			if rel := wantReleases(t); strings.Join(plugins, " ") != strings.Join(rel, " ") {
				t.Errorf("plugin builds for %v, want one for each of %v", plugins, rel)
			}
			if host := hostSlurm(t); !slices.Contains(plugins, host) {
				t.Errorf("no plugin for this host's Slurm %s (headers in /usr/include/slurm), only %v", host, plugins)
			}
			if format == "rpm" {
				for _, c := range conffiles {
					if !got[c].config {
						t.Errorf("%s is not %%config", c)
					}
				}
			}
		})
	}

	// The license: rpm's header and %license file, the deb's copyright.
	// The BPF object is GPL-2.0-only OR BSD-2-Clause (its SPDX header and
	// license string), the Go modules linked in BSD-3-Clause or MIT.
	const rpmLicense = "Apache-2.0 AND (GPL-2.0-only OR BSD-2-Clause) AND BSD-3-Clause AND MIT"
	if out, err := exec.Command("rpm", "-qp", "--qf", "%{LICENSE}", p.rpm).Output(); err != nil || string(out) != rpmLicense {
		t.Errorf("rpm License %q (%v), want %s", out, err, rpmLicense)
	}
	if src, err := os.ReadFile(filepath.Join(repoRoot(t), "bpf/devfilter/devfilter.bpf.c")); err != nil ||
		!strings.Contains(string(src), "SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)") ||
		!strings.Contains(string(src), `SEC("license") = "Dual BSD/GPL"`) {
		t.Errorf("devfilter.bpf.c's license is no longer (GPL-2.0-only OR BSD-2-Clause) / \"Dual BSD/GPL\" (%v): update the rpm License", err)
	}
	if e, ok := rpm["/usr/share/licenses/gpufence/LICENSE"]; !ok || e.mode != 0o644 {
		t.Errorf("rpm: /usr/share/licenses/gpufence/LICENSE missing or not 0644 (%v)", e.mode)
	}
	if c := string(debFiles["/usr/share/doc/gpufence/copyright"]); !strings.Contains(c, "Files: *\nCopyright: 2026 the gpufence authors\nLicense: Apache-2.0\n") {
		t.Errorf("deb copyright does not license Files: * under Apache-2.0:\n%.400s", c)
	}

	if dc := debControlFile(t, p.deb, "conffiles"); strings.Join(strings.Fields(dc), " ") != strings.Join(conffiles, " ") {
		t.Errorf("deb conffiles %q, want %q", dc, conffiles)
	}

	// Each SPANK entry carries the plugin_version Slurm checks: the
	// major.minor its folder names. And no ELF file needs a newer glibc
	// than the packages declare (libc6 >= 2.34, GLIBC_2.34).
	rpmFiles := rpmPayload(t, p.rpm)
	for format, files := range map[string]map[string][]byte{"deb": debFiles, "rpm": rpmFiles} {
		checked := 0
		for path, data := range files {
			f, err := elf.NewFile(bytes.NewReader(data))
			if err != nil {
				continue
			}
			if m := regexp.MustCompile(`/slurm-(\d+)\.(\d+)/spank_gpufence\.so$`).FindStringSubmatch(path); m != nil {
				checked++
				v, err := pluginVersion(f)
				if err != nil {
					t.Errorf("%s %s: %v", format, path, err)
				} else if major, _ := strconv.Atoi(m[1]); v>>16 != uint32(major) {
					t.Errorf("%s %s: plugin_version %#x is not Slurm %s.%s", format, path, v, m[1], m[2])
				} else if minor, _ := strconv.Atoi(m[2]); v>>8&0xff != uint32(minor) {
					t.Errorf("%s %s: plugin_version %#x is not Slurm %s.%s", format, path, v, m[1], m[2])
				} else {
					t.Logf("%s %s: plugin_version %#06x", format, path, v)
				}
			}
			// No Go runs in slurmstepd: the only shared objects are
			// the SPANK entries, and none carries a Go runtime.
			if f.Type == elf.ET_DYN && path != "/usr/sbin/gpufence" && !regexp.MustCompile(`^/usr/lib/gpufence/slurm-\d+\.\d\d/spank_gpufence\.so$`).MatchString(path) {
				t.Errorf("%s: shared object %s is not a SPANK entry of one Slurm release", format, path)
			}
			if strings.HasSuffix(path, ".so") && (f.Section(".go.buildinfo") != nil || f.Section(".gopclntab") != nil || bytes.Contains(data, []byte("runtime.goexit"))) {
				t.Errorf("%s: %s carries a Go runtime", format, path)
			}
			if g := maxGlibc(f); g != "" && versionLess("2.34", g) {
				t.Errorf("%s %s needs GLIBC_%s, the packages declare 2.34", format, path, g)
			}
		}
		if want := len(wantReleases(t)); checked != want {
			t.Errorf("%s: %d plugin builds checked, want %d", format, checked, want)
		}
	}
}

// rpmPayload unpacks the .rpm's files (rpm2cpio | cpio) and returns the
// content of each regular file, by installed path.
func rpmPayload(t *testing.T, rpm string) map[string][]byte {
	t.Helper()
	need(t, "rpm2cpio", "cpio")
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", `rpm2cpio "$1" | cpio -idm --quiet --no-absolute-filenames`, "sh", rpm)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("rpm2cpio | cpio: %v\n%s", err, out)
	}
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[strings.TrimPrefix(p, dir)] = data
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// wantReleases are the Slurm releases the packages must carry a plugin
// build for: the lines of packaging/slurm-releases, or SLURM_RELEASES.
func wantReleases(t *testing.T) []string {
	t.Helper()
	if env := strings.Fields(os.Getenv("SLURM_RELEASES")); len(env) > 0 {
		sort.Strings(env)
		return env
	}
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging/slurm-releases"))
	if err != nil {
		t.Fatal(err)
	}
	var rel []string
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && !strings.HasPrefix(f[0], "#") {
			if !regexp.MustCompile(`^\d+\.\d\d$`).MatchString(f[0]) {
				t.Fatalf("packaging/slurm-releases: %q is not a major.minor like 24.11", f[0])
			}
			rel = append(rel, f[0])
		}
	}
	if len(rel) == 0 {
		t.Fatal("packaging/slurm-releases lists no release")
	}
	sort.Strings(rel)
	return rel
}

// hostSlurm is the major.minor of /usr/include/slurm, which the package
// build compiles the host's plugin against.
func hostSlurm(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/usr/include/slurm/slurm_version.h")
	if err != nil {
		t.Skipf("no host Slurm headers: %v", err)
	}
	m := regexp.MustCompile(`(?m)^#define SLURM_VERSION_NUMBER (0x[0-9a-fA-F]+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("no SLURM_VERSION_NUMBER in /usr/include/slurm/slurm_version.h")
	}
	v, _ := strconv.ParseUint(string(m[1]), 0, 32)
	return fmt.Sprintf("%d.%02d", v>>16, v>>8&0xff)
}

// pluginVersion reads the plugin_version symbol's value from the file, as
// Slurm's loader would after dlopen.
func pluginVersion(f *elf.File) (uint32, error) {
	syms, err := f.DynamicSymbols()
	if err != nil {
		return 0, err
	}
	for _, s := range syms {
		if s.Name != "plugin_version" {
			continue
		}
		if int(s.Section) >= len(f.Sections) {
			return 0, fmt.Errorf("plugin_version in section %d", s.Section)
		}
		sec := f.Sections[s.Section]
		data, err := sec.Data()
		if err != nil {
			return 0, err
		}
		off := s.Value - sec.Addr
		if off+4 > uint64(len(data)) {
			return 0, fmt.Errorf("plugin_version outside its section")
		}
		return binary.LittleEndian.Uint32(data[off:]), nil
	}
	return 0, fmt.Errorf("no plugin_version symbol")
}

// maxGlibc is the newest GLIBC_x.y symbol version the file imports.
func maxGlibc(f *elf.File) string {
	syms, err := f.ImportedSymbols()
	if err != nil {
		return ""
	}
	max := ""
	for _, s := range syms {
		if v, ok := strings.CutPrefix(s.Version, "GLIBC_"); ok && (max == "" || versionLess(max, v)) {
			max = v
		}
	}
	return max
}

func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// debContents lists the .deb's data archive, and returns the content of its
// regular files.
func debContents(t *testing.T, deb string) (map[string]entry, map[string][]byte) {
	t.Helper()
	out, err := exec.Command("dpkg-deb", "--fsys-tarfile", deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb --fsys-tarfile: %v", err)
	}
	entries, files := map[string]entry{}, map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Clean("/" + h.Name)
		entries[path] = entry{mode: h.FileInfo().Mode()}
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[path] = data
		}
	}
	return entries, files
}

// debControlFile is one file of the .deb's control archive.
func debControlFile(t *testing.T, deb, name string) string {
	t.Helper()
	out, err := exec.Command("dpkg-deb", "--info", deb, name).Output()
	if err != nil {
		t.Fatalf("dpkg-deb --info %s: %v", name, err)
	}
	return string(out)
}

// rpmContents lists the .rpm's files (rpm -qp, as rpm -qlp with modes and
// flags).
func rpmContents(t *testing.T, rpm string) map[string]entry {
	t.Helper()
	out, err := exec.Command("rpm", "-qp", "--qf", `[%{FILEMODES} %{FILEFLAGS:fflags} %{FILENAMES}\n]`, rpm).Output()
	if err != nil {
		t.Fatalf("rpm -qp: %v", err)
	}
	entries := map[string]entry{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 { // no flags
			f = []string{f[0], "", f[1]}
		}
		if len(f) != 3 {
			t.Fatalf("rpm -qp line %q", l)
		}
		raw, _ := strconv.ParseUint(f[0], 10, 32)
		mode := fs.FileMode(raw & 0o777)
		switch raw & 0o170000 {
		case 0o040000:
			mode |= fs.ModeDir
		case 0o120000:
			mode |= fs.ModeSymlink
		}
		entries[f[2]] = entry{mode: mode, config: strings.Contains(f[1], "c")}
	}
	return entries
}
