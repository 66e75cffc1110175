// SPDX-License-Identifier: Apache-2.0

// Package devices maps Slurm's GPU table to device numbers: which char majors
// the NVIDIA driver uses (GPUs, nvidia-caps) and which minors each GPU or MIG
// slice's device files have.
package devices

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
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
	m, err := procMajors()
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

// CapsMajor returns the major of /dev/nvidia-caps/nvidia-cap* from
// /proc/devices ("nvidia-caps"), or found=false when the driver has not
// registered it. It has no standard value: the kernel hands it out.
func CapsMajor() (major uint32, found bool, err error) {
	m, err := procMajors()
	if err != nil {
		return 0, false, err
	}
	v, ok := m["nvidia-caps"]
	return v, ok, nil
}

// IMEXMajor returns the major of the IMEX channel devices
// (/dev/nvidia-caps-imex-channels/channelN) from /proc/devices
// ("nvidia-caps-imex-channels"), or found=false when the driver has not
// registered it.
func IMEXMajor() (major uint32, found bool, err error) {
	m, err := procMajors()
	if err != nil {
		return 0, false, err
	}
	v, ok := m["nvidia-caps-imex-channels"]
	return v, ok, nil
}

func procMajors() (map[string]uint32, error) {
	f, err := os.Open("/proc/devices")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return CharMajors(f)
}

// The nvidia-caps minors the driver hands out (its table is
// /proc/driver/nvidia-caps/mig-minors): 0 nvlink fabric-mgmt, 1 MIG config,
// 2 MIG monitor, then for gpu0..gpu31 15 GPU instances each, an access minor
// followed by its 8 compute instances' access minors: 3..4322.
const (
	// FirstCapsAccessMinor is the lowest minor that grants one MIG
	// instance; the ones below administer the node and never go to a job.
	FirstCapsAccessMinor = 3
	// MaxCapsMinor is the highest minor gpufence's filter can grant (its
	// bitmap, devfilter.MaxCapsMinor); above the driver's 4322.
	MaxCapsMinor = 4351
)

var capsNames = map[uint32]string{0: "nvlink fabric-mgmt", 1: "MIG config", 2: "MIG monitor"}

// GPU is a Slurm GPU with its device numbers: a whole GPU, or a MIG slice
// (its parent GPU and its capability devices).
type GPU struct {
	slurm.GPU
	// Major and Minor are the GPU device, /dev/nvidiaN; for a MIG slice its
	// parent GPU, shared with the other slices of that GPU.
	Major, Minor uint32
	// Caps are the nvidia-caps devices of a MIG slice (access to its GPU
	// instance and compute instance), ascending by minor; none for a whole
	// GPU.
	Caps []Cap
}

// Cap is one nvidia-caps device node.
type Cap struct {
	Minor uint32
	Path  string
}

// CapsMinors returns the minors of g.Caps.
func (g GPU) CapsMinors() []uint32 {
	out := make([]uint32, 0, len(g.Caps))
	for _, c := range g.Caps {
		out = append(out, c.Minor)
	}
	return out
}

var (
	nvidiaName = regexp.MustCompile(`/nvidia([0-9]+)$`)
	capsName   = regexp.MustCompile(`/nvidia-cap([0-9]+)$`)
)

// Resolve gives each GPU its device numbers from its device files. A file
// that does not exist yet (the driver and nvidia-modprobe create them
// lazily) falls back to NVIDIA's naming: /dev/nvidiaN is major:N and
// /dev/nvidia-caps/nvidia-capN is capsMajor:N. capsMajor 0 means unknown:
// then a gres.conf that names caps files is refused, since they could not be
// told apart from other devices nor narrowed.
//
// Each record must hold exactly one GPU device; the other files of a
// MultipleFiles= record (MIG slice) must be caps devices, of which Slurm's
// at-least-two-files rule leaves at least one. Errors name the gres.conf
// line.
func Resolve(gpus []slurm.GPU, major, capsMajor uint32) ([]GPU, error) {
	out := make([]GPU, 0, len(gpus))
	whole := map[uint32]int{}
	parentOf := map[uint32]uint32{}
	parents := map[uint32]int{}
	sliceByCaps := map[string]int{}
	for _, g := range gpus {
		d := GPU{GPU: g}
		where := fmt.Sprintf("gpu %d (%s)", g.Index, g.Source)
		if g.Source == "" {
			where = fmt.Sprintf("gpu %d", g.Index)
		}
		files := g.Files
		if len(files) == 0 {
			files = []string{g.Path}
		}
		haveGPU := false
		for _, f := range files {
			kind, maj, mnr, err := classify(f, major, capsMajor)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			switch kind {
			case kindGPU:
				if haveGPU {
					return nil, fmt.Errorf("%s: %s is a second GPU device in one record (device %d:%d); a gres record is one GPU or one MIG slice", where, f, maj, mnr)
				}
				haveGPU = true
				d.Major, d.Minor, d.Path = maj, mnr, f
			case kindCaps:
				if !g.MIG {
					return nil, fmt.Errorf("%s: File=%s is an nvidia-caps device (MIG capability %d:%d), which Slurm would count as a GPU of its own; a MIG slice is one MultipleFiles= record with its parent GPU and its caps files", where, f, maj, mnr)
				}
				if name, admin := capsNames[mnr]; admin {
					return nil, fmt.Errorf("%s: %s is the %s capability (minor %d), which administers every MIG instance of the node; give jobs only gpuN/giG/access and gpuN/giG/ciC/access minors (/proc/driver/nvidia-caps/mig-minors)", where, f, name, mnr)
				}
				if mnr > MaxCapsMinor {
					return nil, fmt.Errorf("%s: %s has nvidia-caps minor %d, above %d, the highest gpufence's filter can grant (the driver's own table ends at 4322)", where, f, mnr, MaxCapsMinor)
				}
				d.Caps = append(d.Caps, Cap{Minor: mnr, Path: f})
			}
		}
		if !haveGPU {
			return nil, fmt.Errorf("%s: no GPU device (/dev/nvidiaN) among %s", where, strings.Join(files, ","))
		}
		sort.Slice(d.Caps, func(i, j int) bool { return d.Caps[i].Minor < d.Caps[j].Minor })
		if g.MIG {
			if prev, dup := whole[d.Minor]; dup {
				return nil, fmt.Errorf("%s: its parent GPU %d:%d is given out whole as gpu %d", where, d.Major, d.Minor, prev)
			}
			parents[d.Minor] = g.Index
			key := fmt.Sprint(d.CapsMinors())
			if prev, dup := sliceByCaps[key]; dup {
				return nil, fmt.Errorf("%s: the same MIG slice (caps %s) as gpu %d", where, key, prev)
			}
			sliceByCaps[key] = g.Index
			for _, c := range d.Caps {
				// A GPU instance's access minor may be shared by the
				// slices of its compute instances, never across GPUs.
				if p, ok := parentOf[c.Minor]; ok && p != d.Minor {
					return nil, fmt.Errorf("%s: %s is also a capability of a slice of GPU %d:%d, not of its parent %d:%d", where, c.Path, major, p, d.Major, d.Minor)
				}
				parentOf[c.Minor] = d.Minor
			}
		} else {
			if prev, dup := whole[d.Minor]; dup {
				return nil, fmt.Errorf("gpu %d and gpu %d are the same device %d:%d", prev, g.Index, d.Major, d.Minor)
			}
			if prev, split := parents[d.Minor]; split {
				return nil, fmt.Errorf("%s: device %d:%d is the parent GPU of MIG slice gpu %d; a GPU is either given out whole or split", where, d.Major, d.Minor, prev)
			}
			whole[d.Minor] = g.Index
		}
		out = append(out, d)
	}
	return out, nil
}

type deviceKind int

const (
	kindGPU deviceKind = iota + 1
	kindCaps
)

// classify tells what a gres.conf file is: a GPU of the NVIDIA major or a
// capability of the nvidia-caps major, with its numbers.
func classify(path string, major, capsMajor uint32) (deviceKind, uint32, uint32, error) {
	var st unix.Stat_t
	err := unix.Stat(path, &st)
	switch {
	case err == nil:
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return 0, 0, 0, fmt.Errorf("%s is not a character device", path)
		}
		maj, mnr := unix.Major(st.Rdev), unix.Minor(st.Rdev)
		switch {
		case maj == major && mnr <= MaxGPUMinor:
			return kindGPU, maj, mnr, nil
		case maj == major:
			return 0, 0, 0, fmt.Errorf("%s has minor %d, above the GPU range 0-%d", path, mnr, MaxGPUMinor)
		case capsMajor != 0 && maj == capsMajor:
			return kindCaps, maj, mnr, nil
		case capsMajor == 0 && capsName.MatchString(path):
			return 0, 0, 0, fmt.Errorf("%s is device %d:%d, named like an nvidia-caps device, but the nvidia-caps major is unknown (no \"nvidia-caps\" in /proc/devices): load the NVIDIA driver first or set nvidia_caps_major", path, maj, mnr)
		case capsMajor != 0:
			return 0, 0, 0, fmt.Errorf("%s is device %d:%d, not the NVIDIA major %d nor the nvidia-caps major %d", path, maj, mnr, major, capsMajor)
		}
		return 0, 0, 0, fmt.Errorf("%s is device %d:%d, not the NVIDIA major %d", path, maj, mnr, major)
	case os.IsNotExist(err):
		if m := nvidiaName.FindStringSubmatch(path); m != nil {
			n, _ := strconv.ParseUint(m[1], 10, 32)
			if n > MaxGPUMinor {
				return 0, 0, 0, fmt.Errorf("%s has minor %d, above the GPU range 0-%d", path, n, MaxGPUMinor)
			}
			return kindGPU, major, uint32(n), nil
		}
		if m := capsName.FindStringSubmatch(path); m != nil {
			if capsMajor == 0 {
				return 0, 0, 0, fmt.Errorf("%s does not exist and the nvidia-caps major is unknown (no \"nvidia-caps\" in /proc/devices): load the NVIDIA driver first or set nvidia_caps_major", path)
			}
			n, err := strconv.ParseUint(m[1], 10, 32)
			if err != nil {
				return 0, 0, 0, fmt.Errorf("%s: minor in its name: %w", path, err)
			}
			return kindCaps, capsMajor, uint32(n), nil
		}
		return 0, 0, 0, fmt.Errorf("%s does not exist and its name does not give a minor", path)
	default:
		return 0, 0, 0, fmt.Errorf("stat %s: %w", path, err)
	}
}
