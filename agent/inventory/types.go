// SPDX-License-Identifier: Apache-2.0

// Package inventory reads the node's GPUs as the NVIDIA driver knows them
// (through NVML) and checks them against Slurm's GPU table.
package inventory

// GPU is one physical GPU as NVML reports it.
type GPU struct {
	Index      int    // NVML index (PCI bus order, as nvidia-smi prints it)
	Minor      uint32 // /dev/nvidia<Minor>
	UUID       string // GPU-xxxxxxxx-...
	PCIBusID   string // 00000000:18:00.0
	Name       string // NVIDIA H100 80GB HBM3
	MIGEnabled bool   // current MIG mode
	MIG        []MIGDevice
}

// MIGDevice is one MIG slice of a GPU with the nvidia-caps minors that grant
// access to it (from /proc/driver/nvidia-caps/mig-minors).
type MIGDevice struct {
	Index      int    // MIG device index on its parent GPU
	UUID       string // MIG-xxxxxxxx-...
	Profile    string // e.g. 1g.10gb, from the device name
	GI, CI     uint32 // GPU instance and compute instance ids
	GICapMinor uint32 // minor of /dev/nvidia-caps/nvidia-cap<N> for gpu<i>/gi<GI>/access
	CICapMinor uint32 // minor for gpu<i>/gi<GI>/ci<CI>/access
}

// Usage is one GPU's utilization sample.
type Usage struct {
	Index          int    // NVML index
	Minor          uint32 // /dev/nvidia<Minor>
	UUID           string
	PCIBusID       string // 00000000:18:00.0
	Name           string // NVIDIA H100 80GB HBM3
	UtilizationGPU uint32 // percent of time a kernel ran over the last sample period
	// UtilizationKnown is false where NVML does not report utilization
	// (MIG-enabled GPUs); UtilizationGPU is 0 then.
	UtilizationKnown bool
	MemoryUsed       uint64 // bytes
	MemoryTotal      uint64 // bytes
}
