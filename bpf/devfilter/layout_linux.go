// SPDX-License-Identifier: Apache-2.0

package devfilter

// What a filter leaves on bpffs and how its values read, in every layout an
// agent has pinned: shared by the pin lifecycle (pin_linux.go), which
// writes it, and the inspection (inspect_linux.go), which only reads it.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// Pins under Options.PinDir. bpffs holds BPF objects only, so what the pins
// belong to is itself a pinned map (pinStateName).
//
//	state          ARRAY[1] of pinState: layout version, mode, scope cgroup id
//	map_<name>     each map of the program (config, policies|storage, ...)
//	link           the scope link (ModeScope)
//	link_slurmd    the link on slurmd's own cgroup outside the scope
//	               (systemd's slurmd.service; ModeScope)
//	cgroup_<id>    the link on cgroup <id> (ModePerCgroup)
//
// A pin is replaced by pinning the new object as <name>_new and renaming it
// over <name>: the name never points at nothing.
//
// pinVersion is the layout of this directory (the names above), not of the
// maps: a map whose key, value, size or flags changed is found by comparing
// it with the new program's spec and replaced, its entries carried over
// (policies zero-extended, see policyMaps). Bumping pinVersion would make a
// new agent detach and drop everything an older one pinned.
const (
	pinStateName   = "state"
	pinLinkName    = "link"
	pinSlurmdLink  = "link_slurmd"
	pinMapPrefix   = "map_"
	pinCgroupPref  = "cgroup_"
	pinTempSuffix  = "_new" // bpffs refuses names with a dot
	pinVersion     = 1
	pinModeScope   = 1
	pinModePerCgrp = 2
)

// pinState is the value of the state map.
type pinState struct {
	Version uint32
	Mode    uint32
	// ScopeID is the cgroup id of the scope (ModeScope), else 0.
	ScopeID uint64
}

var stateSpec = &ebpf.MapSpec{Name: "gpufence_state", Type: ebpf.Array, KeySize: 4, ValueSize: 16, MaxEntries: 1}

func pinModeCode(m Mode) uint32 {
	if m == ModeScope {
		return pinModeScope
	}
	return pinModePerCgrp
}

// mapNames are the maps of a mode, as named in the collection.
func mapNames(m Mode) []string {
	if m == ModeScope {
		return []string{"config", "policies", "events", "lost", "rate", "rate_full"}
	}
	return []string{"config", "storage", "events", "lost", "rate", "rate_full"}
}

// pinNames lists the names under dir that are gpufence pins.
func pinNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list device filter pins: %w", err)
	}
	var out []string
	for _, e := range ents {
		n := strings.TrimSuffix(e.Name(), pinTempSuffix)
		if n == pinStateName || n == pinLinkName || n == pinSlurmdLink || strings.HasPrefix(n, pinMapPrefix) || strings.HasPrefix(n, pinCgroupPref) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func isLinkPin(name string) bool {
	name = strings.TrimSuffix(name, pinTempSuffix)
	return name == pinLinkName || name == pinSlurmdLink || strings.HasPrefix(name, pinCgroupPref)
}

func cgroupPinName(id uint64) string { return pinCgroupPref + strconv.FormatUint(id, 10) }

// policyMaps are the maps whose value is struct policy. That struct only
// grows at its end, and a zero tail grants nothing (the caps bitmap came
// after the GPU bitmap), so an entry of an older layout is carried over
// zero-extended: a step keeps its GPUs across the upgrade and gets no
// capability it did not have.
var policyMaps = map[string]bool{"policies": true, "storage": true}

// policyLayout1Size is the size of struct policy in the first layout
// (cgroup id, flags, GPU bitmap); no older value exists.
const policyLayout1Size = 48

// decodePolicyValue reads a struct policy of this layout or an older one,
// zero-extended (see policyMaps).
func decodePolicyValue(b []byte) (devfilterPolicy, error) {
	var v devfilterPolicy
	size := binary.Size(v)
	if len(b) > size || len(b) < policyLayout1Size {
		return v, fmt.Errorf("policy value of %d bytes: not a layout of %d to %d bytes", len(b), policyLayout1Size, size)
	}
	buf := make([]byte, size)
	copy(buf, b)
	if err := binary.Read(bytes.NewReader(buf), binary.NativeEndian, &v); err != nil {
		return v, fmt.Errorf("decode policy value: %w", err)
	}
	return v, nil
}

// lookupPolicy reads the policy of key from m, whose value may have an
// older layout.
func lookupPolicy(m *ebpf.Map, key any) (devfilterPolicy, error) {
	raw := make([]byte, m.ValueSize())
	if err := m.Lookup(key, raw); err != nil {
		return devfilterPolicy{}, err
	}
	return decodePolicyValue(raw)
}

// The sizes of struct filter_config an agent may have pinned, oldest
// first; each is a prefix of the next, which only appends fields whose zero
// narrows nothing. configLayout1Size: before the fabric majors (program
// layouts 1 and 2 of testdata/); configLayout2Size: before the IMEX major
// (program layout 3). A config map of another size is not read.
const (
	configLayout1Size = 32
	configLayout2Size = 40
)

// configLayoutSizes lists every config size putConfig and readConfig
// accept: the older layouts and this one.
var configLayoutSizes = []int{configLayout1Size, configLayout2Size, binary.Size(devfilterFilterConfig{})}

// readConfig reads the config map of this layout or of an older, shorter
// one, zero-extended (no fabric or IMEX major narrowed).
func readConfig(m *ebpf.Map) (devfilterFilterConfig, error) {
	var c devfilterFilterConfig
	size := binary.Size(c)
	if !slices.Contains(configLayoutSizes, int(m.ValueSize())) {
		return c, fmt.Errorf("config value of %d bytes: not a layout of %v bytes", m.ValueSize(), configLayoutSizes)
	}
	raw := make([]byte, m.ValueSize())
	if err := m.Lookup(uint32(0), raw); err != nil {
		return c, err
	}
	raw = append(raw, make([]byte, size-len(raw))...)
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, &c); err != nil {
		return c, err
	}
	return c, nil
}
