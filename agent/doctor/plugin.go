// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// SlurmVersion is a Slurm release, as slurmd -V and plugin_version give it.
type SlurmVersion struct{ Major, Minor, Micro int }

// Release is the major.minor that must match between a plugin and Slurm.
func (v SlurmVersion) Release() string { return fmt.Sprintf("%d.%02d", v.Major, v.Minor) }

func (v SlurmVersion) String() string { return fmt.Sprintf("%d.%02d.%d", v.Major, v.Minor, v.Micro) }

// FromVersionNumber decodes SLURM_VERSION_NUMBER: (major<<16)|(minor<<8)|micro.
func FromVersionNumber(n uint32) SlurmVersion {
	return SlurmVersion{Major: int(n >> 16), Minor: int(n >> 8 & 0xff), Micro: int(n & 0xff)}
}

var versionRE = regexp.MustCompile(`\b(\d+)\.(\d+)(?:\.(\d+))?`)

// ParseSlurmVersion reads "slurm 24.11.1" or "slurm-wlm 22.05.8".
func ParseSlurmVersion(out string) (SlurmVersion, error) {
	m := versionRE.FindStringSubmatch(out)
	if m == nil {
		return SlurmVersion{}, fmt.Errorf("no version in %q", strings.TrimSpace(out))
	}
	var v SlurmVersion
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	v.Micro, _ = strconv.Atoi(m[3])
	return v, nil
}

// PluginVersion reads plugin_version from a SPANK plugin: the symbol in the
// dynamic symbol table, its uint32 from the section that holds it. It is the
// value Slurm checks when it loads the plugin.
func PluginVersion(path string) (uint32, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, fmt.Errorf("read plugin %s: %w", path, err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return 0, fmt.Errorf("read plugin %s: dynamic symbols: %w", path, err)
	}
	for _, s := range syms {
		if s.Name != "plugin_version" {
			continue
		}
		if s.Section == elf.SHN_UNDEF || s.Section >= elf.SHN_LORESERVE || int(s.Section) >= len(f.Sections) || s.Size < 4 {
			return 0, fmt.Errorf("plugin %s: plugin_version is not a defined 4-byte object", path)
		}
		sec := f.Sections[s.Section]
		if sec.Type == elf.SHT_NOBITS {
			return 0, nil
		}
		if s.Value < sec.Addr || s.Value+4 > sec.Addr+sec.Size {
			return 0, fmt.Errorf("plugin %s: plugin_version lies outside its section %s", path, sec.Name)
		}
		b := make([]byte, 4)
		if _, err := sec.ReadAt(b, int64(s.Value-sec.Addr)); err != nil {
			return 0, fmt.Errorf("read plugin %s: plugin_version: %w", path, err)
		}
		return f.ByteOrder.Uint32(b), nil
	}
	return 0, fmt.Errorf("plugin %s: no plugin_version symbol: not a Slurm plugin", path)
}

// findSlurm finds slurmd (a compute node) or else srun (a login node),
// which load the plugin; the path is the node's.
func (e *Env) findSlurm() (string, bool) {
	var dirs []string
	for _, d := range strings.Split(e.SearchPath, ":") {
		if filepath.IsAbs(d) {
			dirs = append(dirs, d)
		}
	}
	dirs = append(dirs, "/usr/sbin", "/usr/local/sbin", "/opt/slurm/sbin", "/usr/bin", "/usr/local/bin", "/opt/slurm/bin")
	for _, prog := range []string{"slurmd", "srun"} {
		for _, d := range dirs {
			p := filepath.Join(d, prog)
			if fi, err := os.Stat(e.path(p)); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				return p, true
			}
		}
	}
	return "", false
}

func runVersion(path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "-V").CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s -V: %w", path, err)
	}
	return string(out), nil
}

// resolve follows symbolic links of the last component of p, inside Root,
// and returns the chain (node paths), p first.
func (e *Env) resolve(p string) ([]string, error) {
	chain := []string{p}
	for range 40 {
		fi, err := os.Lstat(e.path(p))
		if err != nil {
			return chain, err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return chain, nil
		}
		t, err := os.Readlink(e.path(p))
		if err != nil {
			return chain, err
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(p), t)
		}
		p = filepath.Clean(t)
		chain = append(chain, p)
	}
	return chain, fmt.Errorf("%s: too many symbolic links", chain[0])
}

func (r *run) checkPlugin() Check {
	c := newCheck("slurm-plugin", "Slurm version against the installed plugin")
	e := r.env
	plugin := DefaultPluginDir + "/" + PluginName
	if len(r.plug.Lines) > 0 && r.plug.Lines[0].Resolved != "" {
		plugin = r.plug.Lines[0].Resolved
	}

	// The builds the package ships, one per Slurm release.
	builds := map[string]string{}
	dirs, _ := filepath.Glob(e.path(DefaultPluginDir + "/slurm-*"))
	var shipped []string
	for _, d := range dirs {
		rel := strings.TrimPrefix(filepath.Base(d), "slurm-")
		p := filepath.Join(DefaultPluginDir, filepath.Base(d), PluginName)
		n, err := PluginVersion(e.path(p))
		if err != nil {
			shipped = append(shipped, fmt.Sprintf("%s (unreadable: %v)", p, unwrapPath(err, e)))
			continue
		}
		builds[FromVersionNumber(n).Release()] = p
		shipped = append(shipped, fmt.Sprintf("%s (plugin_version %s)", p, FromVersionNumber(n)))
		if FromVersionNumber(n).Release() != rel {
			c.fail("Reinstall the gpufence package: "+p+" is not the build its folder names.", "%s is built for Slurm %s", p, FromVersionNumber(n).Release())
		}
	}
	if len(shipped) > 0 {
		c.add("builds: %s", strings.Join(shipped, ", "))
	}

	prog, found := e.findSlurm()
	var slurmV SlurmVersion
	haveSlurm := false
	if !found {
		c.add("no slurmd or srun in PATH, /usr/sbin, /usr/local/sbin, /opt/slurm/sbin or /opt/slurm/bin")
	} else {
		rv := e.RunVersion
		if rv == nil {
			rv = runVersion
		}
		out, err := rv(e.path(prog))
		if err == nil {
			slurmV, err = ParseSlurmVersion(out)
		}
		if err != nil {
			c.fail("Check the Slurm installation: "+prog+" -V must print its version.", "cannot tell the Slurm version: %v", unwrapPath(err, e))
		} else {
			haveSlurm = true
			r.slurmV, r.haveSlurm = slurmV, true
			c.add("%s -V: %s (release %s)", prog, strings.TrimSpace(out), slurmV.Release())
		}
	}

	chain, err := e.resolve(plugin)
	if len(chain) > 1 {
		c.add("%s", strings.Join(chain, " -> "))
	}
	var fix string
	if haveSlurm {
		if p, ok := builds[slurmV.Release()]; ok {
			fix = fmt.Sprintf("Run %s/link-plugin (it links %s to %s) and restart slurmd.", DefaultPluginDir, DefaultPluginDir+"/"+PluginName, p)
			if !e.exists(DefaultPluginDir + "/link-plugin") {
				fix = fmt.Sprintf("Link the build for Slurm %s: ln -sfn %s %s, then restart slurmd.", slurmV.Release(), p, DefaultPluginDir+"/"+PluginName)
			}
		} else {
			fix = fmt.Sprintf("Build the plugin against Slurm %s's headers (make build SLURM_INCLUDE=<Slurm %[1]s include dir>) and install it as %s.", slurmV.Release(), plugin)
		}
	} else {
		fix = "Install the gpufence plugin built for this node's Slurm release."
	}
	if err != nil {
		c.fail(fix, "no plugin at %s: %v", chain[len(chain)-1], unwrapPath(err, e))
		return c
	}
	n, err := PluginVersion(e.path(chain[len(chain)-1]))
	if err != nil {
		c.fail(fix, "%s", unwrapPath(err, e))
		return c
	}
	pv := FromVersionNumber(n)
	c.add("%s: plugin_version 0x%06x = Slurm %s", chain[len(chain)-1], n, pv)
	switch {
	case !haveSlurm && !found:
		c.skip("plugin built for Slurm %s; no Slurm program here to compare with", pv.Release())
	case !haveSlurm:
	case pv.Release() != slurmV.Release():
		c.fail(fix, "plugin built for Slurm %s but this node runs Slurm %s: Slurm refuses to load it (a required plugin then breaks srun and slurmd)", pv.Release(), slurmV.Release())
	default:
		c.ok("plugin built for Slurm %s, matching %s", pv.Release(), filepath.Base(prog))
	}
	return c
}
