// SPDX-License-Identifier: Apache-2.0

package inventory

import (
	"errors"
	"strings"
)

// DefaultMIGMinorsPath is where the NVIDIA driver lists the nvidia-caps
// minors that grant MIG instances.
const DefaultMIGMinorsPath = "/proc/driver/nvidia-caps/mig-minors"

// ErrNoDriver means there is no NVIDIA driver to ask: libnvidia-ml.so.1
// cannot be loaded, the kernel module is not loaded, or this binary was
// built without cgo (go-nvml needs it). Callers then work from Slurm's
// gres.conf table alone.
var ErrNoDriver = errors.New("no NVIDIA driver or NVML library")

// ErrClosed is returned by an Inventory after Close.
var ErrClosed = errors.New("inventory closed")

// Options tune Open.
type Options struct {
	// MIGMinorsPath is the driver's nvidia-caps table; empty means
	// DefaultMIGMinorsPath. It is read only when a GPU has MIG devices.
	MIGMinorsPath string
}

func (o Options) migMinorsPath() string {
	if o.MIGMinorsPath == "" {
		return DefaultMIGMinorsPath
	}
	return o.MIGMinorsPath
}

// migProfile returns the profile part of a MIG device name: NVML names them
// "<GPU name> MIG <profile>", e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb" or
// "NVIDIA A100-SXM4-40GB MIG 1c.2g.10gb". A name without " MIG " is kept
// whole, so nothing is lost when a driver names them differently.
func migProfile(name string) string {
	if i := strings.LastIndex(name, " MIG "); i >= 0 {
		return strings.TrimSpace(name[i+len(" MIG "):])
	}
	return name
}
