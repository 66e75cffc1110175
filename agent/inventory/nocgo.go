// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

package inventory

import "fmt"

// Inventory is the NVML inventory; in a binary built without cgo there is
// none, because go-nvml loads libnvidia-ml.so.1 through cgo's dlopen.
type Inventory struct{}

// OpenSystem always fails with ErrNoDriver here: this binary was built with
// CGO_ENABLED=0 and cannot load libnvidia-ml.so.1.
func OpenSystem(Options) (*Inventory, error) {
	return nil, fmt.Errorf("%w: this gpufence was built without cgo (CGO_ENABLED=0), so it cannot load libnvidia-ml.so.1", ErrNoDriver)
}

// Close does nothing.
func (*Inventory) Close() error { return nil }

// GPUs fails: there is no NVML in this build.
func (*Inventory) GPUs() ([]GPU, error) { return nil, ErrNoDriver }

// Sample fails: there is no NVML in this build.
func (*Inventory) Sample() ([]Usage, error) { return nil, ErrNoDriver }
