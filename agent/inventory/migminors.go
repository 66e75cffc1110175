// SPDX-License-Identifier: Apache-2.0

package inventory

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// MIGMinors is the driver's table of nvidia-caps minors
// (/proc/driver/nvidia-caps/mig-minors): opening
// /dev/nvidia-caps/nvidia-cap<minor> grants the capability.
type MIGMinors struct {
	Config  uint32 // mig/config: create and destroy instances
	Monitor uint32 // mig/monitor: read every instance's state
	// GI maps a GPU instance to the minor of its access capability; CI a
	// compute instance.
	GI map[GIKey]uint32
	CI map[CIKey]uint32
}

// GIKey names a GPU instance by its parent GPU's device minor (the N of
// /dev/nvidiaN, which is what "gpuN" in the table means; not the NVML
// index) and its GPU instance id.
type GIKey struct{ GPUMinor, GI uint32 }

// CIKey names a compute instance inside a GPU instance.
type CIKey struct{ GPUMinor, GI, CI uint32 }

// ReadMIGMinors reads and parses the table at path.
func ReadMIGMinors(path string) (MIGMinors, error) {
	f, err := os.Open(path)
	if err != nil {
		return MIGMinors{}, fmt.Errorf("read MIG capability minors: %w", err)
	}
	defer f.Close()
	return ParseMIGMinors(f, path)
}

// ParseMIGMinors parses the driver's mig-minors table strictly: every line
// is "<name> <minor>" with name config, monitor, gpuN/giG/access or
// gpuN/giG/ciC/access, and no name twice. Anything else is an error naming
// file and line, because a minor read wrong would grant the wrong MIG
// instance.
func ParseMIGMinors(r io.Reader, file string) (MIGMinors, error) {
	m := MIGMinors{GI: map[GIKey]uint32{}, CI: map[CIKey]uint32{}}
	seen := map[string]int{}
	haveConfig, haveMonitor := false, false
	sc := bufio.NewScanner(r)
	no := 0
	for sc.Scan() {
		no++
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%s:%d: %s (line %q)", file, no, fmt.Sprintf(format, args...), line)
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return MIGMinors{}, bad("want \"<capability> <minor>\", got %d fields", len(fields))
		}
		name := fields[0]
		minor, err := parseUint(fields[1])
		if err != nil {
			return MIGMinors{}, bad("minor %q is not a decimal number", fields[1])
		}
		if prev, dup := seen[name]; dup {
			return MIGMinors{}, bad("%s listed again (first on line %d)", name, prev)
		}
		seen[name] = no
		switch {
		case name == "config":
			m.Config, haveConfig = minor, true
		case name == "monitor":
			m.Monitor, haveMonitor = minor, true
		default:
			gpu, gi, ci, hasCI, err := parseCapName(name)
			if err != nil {
				return MIGMinors{}, bad("%v", err)
			}
			if hasCI {
				m.CI[CIKey{gpu, gi, ci}] = minor
			} else {
				m.GI[GIKey{gpu, gi}] = minor
			}
		}
	}
	if err := sc.Err(); err != nil {
		return MIGMinors{}, fmt.Errorf("%s: %w", file, err)
	}
	if !haveConfig || !haveMonitor {
		return MIGMinors{}, fmt.Errorf("%s: no config or monitor line; this is not the driver's mig-minors table", file)
	}
	return m, nil
}

// parseCapName splits gpuN/giG/access or gpuN/giG/ciC/access.
func parseCapName(name string) (gpu, gi, ci uint32, hasCI bool, err error) {
	parts := strings.Split(name, "/")
	if (len(parts) != 3 && len(parts) != 4) || parts[len(parts)-1] != "access" {
		return 0, 0, 0, false, fmt.Errorf("capability %q is not config, monitor, gpuN/giG/access or gpuN/giG/ciC/access", name)
	}
	num := func(part, prefix string) (uint32, error) {
		s, ok := strings.CutPrefix(part, prefix)
		if !ok {
			return 0, fmt.Errorf("capability %q: %q does not start with %q", name, part, prefix)
		}
		v, err := parseUint(s)
		if err != nil {
			return 0, fmt.Errorf("capability %q: %q has no number after %q", name, part, prefix)
		}
		return v, nil
	}
	if gpu, err = num(parts[0], "gpu"); err != nil {
		return
	}
	if gi, err = num(parts[1], "gi"); err != nil {
		return
	}
	if len(parts) == 4 {
		hasCI = true
		ci, err = num(parts[2], "ci")
	}
	return
}

// parseUint accepts plain decimal digits only (no sign, no spaces).
func parseUint(s string) (uint32, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("not a decimal number: %q", s)
	}
	v, err := strconv.ParseUint(s, 10, 32)
	return uint32(v), err
}

// InstanceOf is the GPU instance of a MIG slice: the one on the GPU with
// device minor gpuMinor whose access capability is among caps (the
// slice's nvidia-caps minors). False when none or more than one is.
func (m MIGMinors) InstanceOf(gpuMinor uint32, caps []uint32) (uint32, bool) {
	gi, n := uint32(0), 0
	for k, minor := range m.GI {
		if k.GPUMinor == gpuMinor && slices.Contains(caps, minor) {
			gi, n = k.GI, n+1
		}
	}
	return gi, n == 1
}
