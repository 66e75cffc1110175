// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/metrics"
)

// exitNoDriver is gpufence inventory's status when there is no NVIDIA
// driver, so scripts can tell it from a failure.
const exitNoDriver = 3

// openInventory opens NVML as cfg.NVML says and lists the GPUs once. It
// returns a nil inventory, and no error, when NVML is off or (auto) there
// is no driver: the agent then works from gres.conf alone and says so once.
func openInventory(cfg config.Config, log *slog.Logger) (*inventory.Inventory, []inventory.GPU, error) {
	if cfg.NVML == config.NVMLOff {
		log.Info("nvml: off; using Slurm's gres.conf table only")
		return nil, nil, nil
	}
	inv, err := inventory.OpenSystem(inventory.Options{})
	switch {
	case errors.Is(err, inventory.ErrNoDriver) && cfg.NVML == config.NVMLAuto:
		log.Info("no NVIDIA driver/NVML; using Slurm's gres.conf table only", "reason", err)
		return nil, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("nvml is %s: %w", cfg.NVML, err)
	}
	gpus, err := inv.GPUs()
	if err != nil {
		inv.Close()
		return nil, nil, fmt.Errorf("NVML is loaded but listing the GPUs failed (nvml: off runs from gres.conf alone): %w", err)
	}
	log.Info("NVIDIA driver found through NVML", "gpus", len(gpus))
	return inv, gpus, nil
}

// inventorySampler is inv as the metrics sampler, or a nil interface
// without one (a nil *Inventory in the interface would not compare nil).
func inventorySampler(inv *inventory.Inventory) metrics.Sampler {
	if inv == nil {
		return nil
	}
	return inv
}

// inventoryJSON is one GPU of gpufence inventory --json.
type inventoryJSON struct {
	Index      int        `json:"index"`
	Minor      uint32     `json:"minor"`
	UUID       string     `json:"uuid"`
	PCIBusID   string     `json:"pci_bus_id"`
	Name       string     `json:"name"`
	MIGEnabled bool       `json:"mig_enabled"`
	MIG        []migJSON  `json:"mig"`
	Usage      *usageJSON `json:"usage,omitempty"`
}

type usageJSON struct {
	UtilizationGPU *uint32 `json:"utilization_gpu_percent"`
	MemoryUsed     uint64  `json:"memory_used_bytes"`
	MemoryTotal    uint64  `json:"memory_total_bytes"`
}

type migJSON struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid"`
	Profile    string `json:"profile"`
	GI         uint32 `json:"gi"`
	CI         uint32 `json:"ci"`
	GICapMinor uint32 `json:"gi_cap_minor"`
	CICapMinor uint32 `json:"ci_cap_minor"`
}

// inventoryReport is gpufence inventory --json, on success and on error
// alike: error is set (and gpus empty) when the GPUs could not be listed.
type inventoryReport struct {
	GPUs  []inventoryJSON `json:"gpus"`
	Error string          `json:"error,omitempty"`
}

func inventoryCommand() *cobra.Command {
	var asJSON, usage bool
	var migMinors string
	cmd := &cobra.Command{
		Use:   "inventory [flags]",
		Short: "list the GPUs as the NVIDIA driver reports them (NVML): minor, UUID, bus id, name, MIG devices",
		Long: "Lists the GPUs as the NVIDIA driver reports them through NVML: index, device minor, UUID, PCI bus id,\n" +
			"name, MIG mode and MIG devices with their nvidia-caps minors.\n\n" +
			"With --json it prints one object on stdout whatever happens: {\"gpus\":[...]} or, when the GPUs\n" +
			"cannot be listed, {\"gpus\":[],\"error\":\"...\"} (the error is on stderr too).\n\n" +
			fmt.Sprintf("Exit status: 0 listed, 1 a failure, 2 usage error, %d no NVIDIA driver.", exitNoDriver),
	}
	fs := cmd.Flags()
	fs.BoolVar(&asJSON, "json", false, `print one JSON object {"gpus":[...]}, with "error" set on failure`)
	fs.BoolVar(&usage, "usage", false, "also read each GPU's utilization and memory")
	fs.StringVar(&migMinors, "mig-minors", inventory.DefaultMIGMinorsPath, "the driver's nvidia-caps table of MIG capability minors")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		gpus, usages, err := listGPUs(migMinors, usage)
		if err != nil {
			code := exitFailure
			if errors.Is(err, inventory.ErrNoDriver) {
				code = exitNoDriver
			}
			if asJSON {
				if jerr := writeInventoryJSON(cmd.OutOrStdout(), inventoryReport{GPUs: []inventoryJSON{}, Error: err.Error()}); jerr != nil {
					err = errors.Join(err, jerr)
				}
			}
			return &cliError{code: code, err: err}
		}
		if asJSON {
			return writeInventoryJSON(cmd.OutOrStdout(), inventoryReport{GPUs: inventoryJSONOf(gpus, usages)})
		}
		writeInventoryText(cmd.OutOrStdout(), gpus, usages, usage)
		return nil
	}
	return cmd
}

// listGPUs is listInventory; tests replace it to see the command fail.
var listGPUs = listInventory

// listInventory opens NVML and lists the GPUs, with their usage when
// withUsage.
func listInventory(migMinors string, withUsage bool) ([]inventory.GPU, map[int]inventory.Usage, error) {
	inv, err := inventory.OpenSystem(inventory.Options{MIGMinorsPath: migMinors})
	if err != nil {
		return nil, nil, err
	}
	defer inv.Close()
	gpus, err := inv.GPUs()
	if err != nil {
		return nil, nil, err
	}
	if !withUsage {
		return gpus, nil, nil
	}
	us, err := inv.Sample()
	if err != nil {
		return nil, nil, err
	}
	usages := map[int]inventory.Usage{}
	for _, u := range us {
		usages[u.Index] = u
	}
	return gpus, usages, nil
}

func inventoryJSONOf(gpus []inventory.GPU, usages map[int]inventory.Usage) []inventoryJSON {
	out := make([]inventoryJSON, 0, len(gpus))
	for _, g := range gpus {
		j := inventoryJSON{Index: g.Index, Minor: g.Minor, UUID: g.UUID, PCIBusID: g.PCIBusID, Name: g.Name, MIGEnabled: g.MIGEnabled, MIG: []migJSON{}}
		for _, m := range g.MIG {
			j.MIG = append(j.MIG, migJSON(m))
		}
		if u, ok := usages[g.Index]; ok {
			j.Usage = &usageJSON{MemoryUsed: u.MemoryUsed, MemoryTotal: u.MemoryTotal}
			if u.UtilizationKnown {
				j.Usage.UtilizationGPU = &u.UtilizationGPU
			}
		}
		out = append(out, j)
	}
	return out
}

func writeInventoryJSON(w io.Writer, r inventoryReport) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func writeInventoryText(w io.Writer, gpus []inventory.GPU, usages map[int]inventory.Usage, withUsage bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "INDEX\tMINOR\tUUID\tBUS ID\tNAME\tMIG"
	if withUsage {
		head += "\tUTIL\tMEMORY USED/TOTAL"
	}
	fmt.Fprintln(tw, head)
	for _, g := range gpus {
		mig := "off"
		if g.MIGEnabled {
			mig = fmt.Sprintf("on (%d)", len(g.MIG))
		}
		line := fmt.Sprintf("%d\t%d\t%s\t%s\t%s\t%s", g.Index, g.Minor, g.UUID, g.PCIBusID, g.Name, mig)
		if u, ok := usages[g.Index]; ok {
			util := "n/a"
			if u.UtilizationKnown {
				util = fmt.Sprintf("%d%%", u.UtilizationGPU)
			}
			line += fmt.Sprintf("\t%s\t%d/%d MiB", util, u.MemoryUsed>>20, u.MemoryTotal>>20)
		}
		fmt.Fprintln(tw, line)
		for _, m := range g.MIG {
			fmt.Fprintf(tw, "  mig %d\t\t%s\t\t%s gi%d ci%d\tcaps %d,%d\n", m.Index, m.UUID, m.Profile, m.GI, m.CI, m.GICapMinor, m.CICapMinor)
		}
	}
	tw.Flush()
}
