// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"log/slog"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/devices"
)

// resolveFabric fills cfg's NVSwitch and NVLink management majors from
// /proc/devices where the file does not set them (the daemon names the
// nodes in audit records from cfg), and returns the majors the filter
// denies to job steps: both, unless fabric_management is allow; 0 for one
// the driver has not registered.
func resolveFabric(cfg *config.Config, nvidiaMajor uint32, log *slog.Logger) (nvswitch, nvlink uint32, err error) {
	if cfg.NVSwitchMajor == 0 || cfg.NVLinkMajor == 0 {
		f, err := devices.ProcFabric()
		if err != nil {
			return 0, 0, fmt.Errorf("read the NVSwitch and NVLink majors: %w", err)
		}
		if cfg.NVSwitchMajor == 0 {
			cfg.NVSwitchMajor = f.NVSwitchMajor
		}
		if cfg.NVLinkMajor == 0 {
			cfg.NVLinkMajor = f.NVLinkMajor
		}
	}
	for _, m := range []struct {
		name  string
		major uint32
	}{{devices.NVSwitchModule, cfg.NVSwitchMajor}, {devices.NVLinkModule, cfg.NVLinkMajor}} {
		if m.major != 0 && (m.major == nvidiaMajor || m.major == cfg.NvidiaCapsMajor) {
			return 0, 0, fmt.Errorf("%s major %d is the NVIDIA GPU or nvidia-caps major too; set nvswitch_major, nvlink_major, nvidia_major or nvidia_caps_major", m.name, m.major)
		}
	}
	if cfg.NVSwitchMajor != 0 && cfg.NVSwitchMajor == cfg.NVLinkMajor {
		return 0, 0, fmt.Errorf("nvidia-nvswitch and nvidia-nvlink have the same major %d; set nvswitch_major or nvlink_major", cfg.NVSwitchMajor)
	}
	attrs := []any{"nvswitch_major", cfg.NVSwitchMajor, "nvlink_major", cfg.NVLinkMajor}
	switch {
	case cfg.FabricManagement == config.FabricAllow:
		log.Info("NVSwitch and NVLink management nodes are not narrowed (fabric_management: allow)", attrs...)
		return 0, 0, nil
	case cfg.NVSwitchMajor == 0 && cfg.NVLinkMajor == 0:
		log.Info("no nvidia-nvswitch or nvidia-nvlink in /proc/devices: no NVSwitch or NVLink management node to deny")
	default:
		log.Info("NVSwitch and NVLink management nodes denied to job steps (fabric_management: deny); 0: none on this node", attrs...)
	}
	return cfg.NVSwitchMajor, cfg.NVLinkMajor, nil
}
