// Package devices maps Slurm's GPU table to device numbers: which char major
// the NVIDIA driver uses and which minor each GPU's device file has.
package devices

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/slurm"
)

// DefaultNvidiaMajor is the char major NVIDIA registers for /dev/nvidia*
// ("nvidia-frontend" in /proc/devices); it has been 195 on every driver.
const DefaultNvidiaMajor = 195

// MaxGPUMinor is the highest minor that is a GPU: 254 is nvidia-modeset and
// 255 nvidiactl.
const MaxGPUMinor = 253

// CharMajors parses the "Character devices:" part of /proc/devices.
func CharMajors(r io.Reader) (map[string]uint32, error) {
	majors := map[string]uint32{}
	sc := bufio.NewScanner(r)
	inChar := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			inChar = true
			continue
		case strings.HasSuffix(line, "devices:"):
			inChar = false
			continue
		case !inChar || line == "":
			continue
		}
		num, name, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("/proc/devices: bad line %q", line)
		}
		n, err := strconv.ParseUint(num, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("/proc/devices: bad major in %q", line)
		}
		name = strings.TrimSpace(name)
		if _, dup := majors[name]; !dup {
			majors[name] = uint32(n)
		}
	}
	return majors, sc.Err()
}

// NvidiaMajor returns the driver's major from /proc/devices, or
// DefaultNvidiaMajor with found=false when no NVIDIA driver is loaded.
func NvidiaMajor() (major uint32, found bool, err error) {
	f, err := os.Open("/proc/devices")
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	m, err := CharMajors(f)
	if err != nil {
		return 0, false, err
	}
	for _, name := range []string{"nvidia-frontend", "nvidia"} {
		if v, ok := m[name]; ok {
			return v, true, nil
		}
	}
	return DefaultNvidiaMajor, false, nil
}

// GPU is a Slurm GPU with its device number.
type GPU struct {
	slurm.GPU
	Major, Minor uint32
}

var nvidiaName = regexp.MustCompile(`/nvidia([0-9]+)$`)

// Resolve gives each GPU its major:minor from its device file. A file that
// does not exist yet (the driver creates /dev/nvidiaN lazily) falls back to
// NVIDIA's naming rule, /dev/nvidiaN = major:N.
func Resolve(gpus []slurm.GPU, major uint32) ([]GPU, error) {
	out := make([]GPU, 0, len(gpus))
	seen := map[uint32]int{}
	for _, g := range gpus {
		d := GPU{GPU: g}
		var st unix.Stat_t
		err := unix.Stat(g.Path, &st)
		switch {
		case err == nil:
			if st.Mode&unix.S_IFMT != unix.S_IFCHR {
				return nil, fmt.Errorf("gpu %d: %s is not a character device", g.Index, g.Path)
			}
			d.Major, d.Minor = unix.Major(st.Rdev), unix.Minor(st.Rdev)
		case os.IsNotExist(err):
			m := nvidiaName.FindStringSubmatch(g.Path)
			if m == nil {
				return nil, fmt.Errorf("gpu %d: %s does not exist and its name does not give a minor", g.Index, g.Path)
			}
			n, _ := strconv.ParseUint(m[1], 10, 32)
			d.Major, d.Minor = major, uint32(n)
		default:
			return nil, fmt.Errorf("gpu %d: stat %s: %w", g.Index, g.Path, err)
		}
		if d.Major != major {
			return nil, fmt.Errorf("gpu %d: %s is device %d:%d, not the NVIDIA major %d", g.Index, g.Path, d.Major, d.Minor, major)
		}
		if d.Minor > MaxGPUMinor {
			return nil, fmt.Errorf("gpu %d: %s has minor %d, above the GPU range 0-%d", g.Index, g.Path, d.Minor, MaxGPUMinor)
		}
		if prev, dup := seen[d.Minor]; dup {
			return nil, fmt.Errorf("gpu %d and gpu %d are the same device %d:%d", prev, g.Index, d.Major, d.Minor)
		}
		seen[d.Minor] = g.Index
		out = append(out, d)
	}
	return out, nil
}
