// SPDX-License-Identifier: Apache-2.0

package inventory

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/slurm"
)

// nvmlGPUs is an 8-GPU node as NVML reports it; minors follow PCI order.
func nvmlGPUs(n int) []GPU {
	out := make([]GPU, n)
	for i := range out {
		out[i] = GPU{Index: i, Minor: uint32(i), UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i),
			PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x18+i), Name: "NVIDIA H100 80GB HBM3"}
	}
	return out
}

// slurmTable is gres.conf's File=/dev/nvidia[...] for the given minors.
func slurmTable(minors ...uint32) []devices.GPU {
	out := make([]devices.GPU, len(minors))
	for i, m := range minors {
		out[i] = devices.GPU{GPU: slurm.GPU{Index: i, Path: fmt.Sprintf("/dev/nvidia%d", m)}, Major: 195, Minor: m}
	}
	return out
}

func TestCheck(t *testing.T) {
	mig := nvmlGPUs(8)
	mig[5].MIGEnabled = true
	mig[5].MIG = []MIGDevice{{Index: 0, Profile: "3g.40gb", GI: 1, CI: 0}, {Index: 1, Profile: "3g.40gb", GI: 2, CI: 0}}
	reordered := nvmlGPUs(8)
	// NVML numbers by PCI bus, gres.conf lists them in another order: the
	// minors still tie them together.
	for _, tc := range []struct {
		name  string
		gpus  []GPU
		table []devices.GPU
		want  []MismatchKind // in order
		// each message must contain these (both sides of the mismatch)
		says []string
	}{
		{name: "8 and 8 match", gpus: nvmlGPUs(8), table: slurmTable(0, 1, 2, 3, 4, 5, 6, 7)},
		{name: "gres.conf in another order", gpus: reordered, table: slurmTable(7, 6, 5, 4, 3, 2, 1, 0)},
		{name: "Slurm lists 8, NVML has 7", gpus: nvmlGPUs(7), table: slurmTable(0, 1, 2, 3, 4, 5, 6, 7),
			want: []MismatchKind{MismatchCount, MismatchNotInNVML},
			says: []string{"gres.conf names 8 GPU devices for this node but the NVIDIA driver (NVML) sees 7 GPUs", "Slurm GPU 7 (/dev/nvidia7, device 195:7)", "NVML minors: [0 1 2 3 4 5 6]"}},
		{name: "NVML has one Slurm does not list", gpus: nvmlGPUs(8), table: slurmTable(0, 1, 2, 3, 4, 5, 6),
			want: []MismatchKind{MismatchCount, MismatchNotInSlurm},
			says: []string{"names 7 GPU devices", "NVML GPU 7 (NVIDIA H100 80GB HBM3, GPU-00000007-0000-0000-0000-000000000000, bus 00000000:1F:00.0, /dev/nvidia7)"}},
		{name: "a minor differs", gpus: nvmlGPUs(8), table: slurmTable(0, 1, 2, 3, 4, 5, 6, 9),
			want: []MismatchKind{MismatchNotInNVML, MismatchNotInSlurm},
			says: []string{"Slurm GPU 7 (/dev/nvidia9, device 195:9)", "NVML GPU 7 ("}},
		{name: "no GPU in NVML", gpus: nil, table: slurmTable(0),
			want: []MismatchKind{MismatchCount, MismatchNotInNVML},
			says: []string{"NVML sees no GPU"}},
		{name: "MIG-enabled GPU given out whole", gpus: mig, table: slurmTable(0, 1, 2, 3, 4, 5, 6, 7),
			want: []MismatchKind{MismatchMIGWhole},
			says: []string{"Slurm GPU 5 (/dev/nvidia5) is NVML GPU 5", "GPU-00000005", "bus 00000000:1D:00.0", "2 MIG devices", "MultipleFiles="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Check(tc.gpus, tc.table)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d mismatches, want %d: %v", len(got), len(tc.want), got)
			}
			all := ""
			for i, m := range got {
				if m.Kind != tc.want[i] {
					t.Errorf("mismatch %d is %s, want %s: %s", i, m.Kind, tc.want[i], m)
				}
				wantSev := SeverityError
				if m.Kind == MismatchMIGWhole {
					wantSev = SeverityWarning
				}
				if m.Severity != wantSev {
					t.Errorf("%s: severity %s, want %s", m.Kind, m.Severity, wantSev)
				}
				switch m.Kind {
				case MismatchNotInNVML:
					if m.Slurm == nil || m.NVML != nil {
						t.Errorf("%s: sides %v / %v", m.Kind, m.Slurm, m.NVML)
					}
				case MismatchNotInSlurm:
					if m.Slurm != nil || m.NVML == nil {
						t.Errorf("%s: sides %v / %v", m.Kind, m.Slurm, m.NVML)
					}
				case MismatchMIGWhole:
					if m.Slurm == nil || m.NVML == nil {
						t.Errorf("%s: sides %v / %v", m.Kind, m.Slurm, m.NVML)
					}
				}
				all += m.String() + "\n"
			}
			for _, s := range tc.says {
				if !strings.Contains(all, s) {
					t.Errorf("messages lack %q:\n%s", s, all)
				}
			}
			if n := len(Errors(got)); (n > 0) != (len(tc.want) > 0 && tc.want[0] != MismatchMIGWhole) {
				t.Errorf("Errors() = %d of %v", n, got)
			}
		})
	}
}

// migNode is 8 GPUs; GPU 5 has MIG on with two GPU instances, the first
// holding two compute instances (caps as the driver numbers them).
func migNode() []GPU {
	g := nvmlGPUs(8)
	g[5].MIGEnabled = true
	g[5].MIG = []MIGDevice{
		{Index: 0, UUID: "MIG-a", Profile: "1c.3g.40gb", GI: 1, CI: 0, GICapMinor: 687, CICapMinor: 688},
		{Index: 1, UUID: "MIG-b", Profile: "1c.3g.40gb", GI: 1, CI: 1, GICapMinor: 687, CICapMinor: 689},
		{Index: 2, UUID: "MIG-c", Profile: "3g.40gb", GI: 2, CI: 0, GICapMinor: 696, CICapMinor: 697},
	}
	return g
}

// slicedTable lists GPUs 0-4, 6, 7 whole and the given slices of GPU 5.
func slicedTable(slices ...[]uint32) []devices.GPU {
	t := slurmTable(0, 1, 2, 3, 4, 6, 7)
	for _, caps := range slices {
		g := devices.GPU{GPU: slurm.GPU{Index: len(t), Path: "/dev/nvidia5", MIG: true, Source: fmt.Sprintf("gres.conf:%d", len(t)+1)}, Major: 195, Minor: 5}
		for _, c := range caps {
			g.Caps = append(g.Caps, devices.Cap{Minor: c, Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", c)})
		}
		t = append(t, g)
	}
	return t
}

func TestCheckMIGSlices(t *testing.T) {
	off := migNode()
	off[5].MIGEnabled, off[5].MIG = false, nil
	for _, tc := range []struct {
		name  string
		gpus  []GPU
		table []devices.GPU
		want  []MismatchKind
		says  string
	}{
		{name: "every slice a MIG device", gpus: migNode(), table: slicedTable([]uint32{687, 688}, []uint32{687, 689}, []uint32{696, 697})},
		{name: "GPU instance alone", gpus: migNode(), table: slicedTable([]uint32{696})},
		{name: "caps of a destroyed instance", gpus: migNode(), table: slicedTable([]uint32{705, 706}),
			want: []MismatchKind{MismatchMIGSlice}, says: "caps minor 705 belongs to no MIG device on this GPU"},
		{name: "caps of another GPU", gpus: migNode(), table: slicedTable([]uint32{687, 12}),
			want: []MismatchKind{MismatchMIGSlice}, says: "caps minor 12 belongs to no MIG device"},
		{name: "compute instance without its GPU instance", gpus: migNode(), table: slicedTable([]uint32{696, 688}),
			want: []MismatchKind{MismatchMIGSlice}, says: "caps minor 688 is a compute instance of GPU instance 1, whose access capability it lacks"},
		{name: "slices of a GPU with MIG off", gpus: off, table: slicedTable([]uint32{687, 688}, []uint32{696, 697}),
			want: []MismatchKind{MismatchMIGOff, MismatchMIGOff}, says: "whose MIG mode is off: every holder of one of its slices could use the whole GPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Check(tc.gpus, tc.table)
			var kinds []MismatchKind
			all := ""
			for _, m := range got {
				kinds = append(kinds, m.Kind)
				all += m.Message + "\n"
				if m.Severity != SeverityError || m.Slurm == nil || m.NVML == nil || m.NVML.Minor != 5 {
					t.Errorf("%s: severity %s, sides %v / %v", m.Kind, m.Severity, m.Slurm, m.NVML)
				}
			}
			if fmt.Sprint(kinds) != fmt.Sprint(tc.want) {
				t.Fatalf("mismatches %v, want %v:\n%s", kinds, tc.want, all)
			}
			if !strings.Contains(all, tc.says) {
				t.Errorf("messages lack %q:\n%s", tc.says, all)
			}
		})
	}
}

func TestMatchSlice(t *testing.T) {
	g := migNode()[5]
	for _, tc := range []struct {
		caps []uint32
		want string // UUID, "" for no unique match
	}{
		{[]uint32{687, 688}, "MIG-a"},
		{[]uint32{687, 689}, "MIG-b"},
		{[]uint32{696, 697}, "MIG-c"},
		{[]uint32{696}, "MIG-c"}, // its GPU instance has one compute instance
		{[]uint32{687}, ""},      // two compute instances: which one?
		{[]uint32{687, 688, 689}, ""},
		{[]uint32{688}, ""},
		{[]uint32{696, 999}, ""},
		{nil, ""},
	} {
		m, ok := MatchSlice(g, tc.caps)
		if ok != (tc.want != "") || m.UUID != tc.want {
			t.Errorf("MatchSlice(%v) = %q, %v; want %q", tc.caps, m.UUID, ok, tc.want)
		}
	}
}
