// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/inventory"
)

// checkNVML compares gres.conf with the GPUs the NVIDIA driver reports, as
// the agent does at start: an error-level mismatch makes the agent give no
// GPU to any step.
func (r *run) checkNVML() Check {
	c := newCheck("nvml", "gres.conf against the NVIDIA driver (NVML)")
	mode := r.env.Config.NVML
	if mode == config.NVMLOff {
		c.info("nvml: off in the configuration: the agent trusts gres.conf alone")
		return c
	}
	if r.env.Inventory == nil {
		c.skip("NVML not probed")
		return c
	}
	gpus, err := r.env.Inventory()
	switch {
	case errors.Is(err, inventory.ErrNoDriver) && mode == config.NVMLRequired:
		c.fail("Install or load the NVIDIA driver, or set nvml: auto.", "nvml: required, but %v: the agent does not start", err)
		return c
	case errors.Is(err, inventory.ErrNoDriver):
		c.info("%v: the agent uses gres.conf alone", err)
		return c
	case err != nil:
		c.fail("Check the driver (nvidia-smi), or set nvml: off to run from gres.conf alone.", "NVML is loaded but listing the GPUs failed: %v: the agent does not start", err)
		return c
	}
	for _, g := range gpus {
		mig := ""
		if g.MIGEnabled {
			mig = fmt.Sprintf(", MIG on with %d devices", len(g.MIG))
		}
		c.add("NVML GPU %d: /dev/nvidia%d %s %s bus %s%s", g.Index, g.Minor, g.Name, g.UUID, g.PCIBusID, mig)
	}
	if r.gresTable == nil {
		c.skip("the gres.conf table is not usable (see gres): nothing to compare the %d NVML GPUs with", len(gpus))
		return c
	}
	ms := inventory.Check(gpus, r.gresTable)
	var errs, warns []string
	for _, m := range ms {
		if m.Severity == inventory.SeverityError {
			errs = append(errs, m.Message)
		} else {
			warns = append(warns, m.Message)
		}
	}
	for _, w := range warns {
		c.warn("Make gres.conf describe the GPUs as the driver has them.", "%s", w)
	}
	if len(errs) > 0 {
		c.fail("Make gres.conf name the GPUs the driver has (or set nvml: off to trust gres.conf alone).",
			"%d mismatch(es): the agent gives no GPU to any step until they are fixed: %s", len(errs), strings.Join(errs, "; "))
		return c
	}
	if c.Verdict == "" {
		c.ok("the %d GPU(s) of gres.conf are the ones the driver reports", len(gpus))
	}
	return c
}
