// SPDX-License-Identifier: Apache-2.0

package devices

import (
	"fmt"
	"io"
	"os"
)

// Names the NVIDIA driver registers the management majors under in
// /proc/devices (nvidia-modprobe's NV_NVSWITCH_MODULE_NAME and
// NV_NVLINK_MODULE_NAME).
const (
	NVSwitchModule = "nvidia-nvswitch"
	NVLinkModule   = "nvidia-nvlink"
)

// NVSwitchCtlMinor is the minor of /dev/nvidia-nvswitchctl; /dev/nvidia-nvswitchN
// is minor N.
const NVSwitchCtlMinor = 255

// Fabric holds the char majors of the NVSwitch and NVLink management nodes:
// /dev/nvidia-nvswitchctl and /dev/nvidia-nvswitchN (NVSwitchMajor), and
// /dev/nvidia-nvlink (NVLinkMajor). Only the fabric manager uses them. 0: the
// driver registered none.
type Fabric struct {
	NVSwitchMajor uint32
	NVLinkMajor   uint32
}

// FabricMajors reads both majors from a /proc/devices text; a missing one
// is 0 (no NVSwitch driver, or a driver without the NVLink node).
func FabricMajors(procDevices io.Reader) (Fabric, error) {
	m, err := CharMajors(procDevices)
	if err != nil {
		return Fabric{}, err
	}
	return Fabric{NVSwitchMajor: m[NVSwitchModule], NVLinkMajor: m[NVLinkModule]}, nil
}

// ProcFabric is FabricMajors of this host's /proc/devices.
func ProcFabric() (Fabric, error) {
	f, err := os.Open("/proc/devices")
	if err != nil {
		return Fabric{}, err
	}
	defer f.Close()
	return FabricMajors(f)
}

// FabricKind tells the two management majors apart.
type FabricKind int

// Kinds of management nodes.
const (
	NotFabric FabricKind = iota
	NVSwitch
	NVLink
)

// Of says which management node major:minor is, and its path as the driver
// names it (nvidia-modprobe: nvidia-nvswitchctl for minor 255,
// nvidia-nvswitchN, nvidia-nvlink for minor 0). The node a process opened
// may have another name (any path with that device number opens it); ""
// where the driver makes no node of that minor.
func (f Fabric) Of(major, minor uint32) (FabricKind, string) {
	switch {
	case major == 0:
		return NotFabric, ""
	case major == f.NVSwitchMajor && minor == NVSwitchCtlMinor:
		return NVSwitch, "/dev/nvidia-nvswitchctl"
	case major == f.NVSwitchMajor:
		return NVSwitch, fmt.Sprintf("/dev/nvidia-nvswitch%d", minor)
	case major == f.NVLinkMajor && minor == 0:
		return NVLink, "/dev/nvidia-nvlink"
	case major == f.NVLinkMajor:
		return NVLink, ""
	}
	return NotFabric, ""
}
