// SPDX-License-Identifier: Apache-2.0

package status

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/statefile"
)

// TestStatusGPUTable: the GPU table's source is shown, and a table the
// agent refuses to give GPUs from is a problem.
func TestStatusGPUTable(t *testing.T) {
	in := consistentInput(t)
	in.State.GPUTable = &statefile.GPUTable{Source: "slurmd -G", Detail: "slurmd's 2 GPU(s): gres.conf sets AutoDetect=nvml, so slurmd's table (what it found, in its order) is the authority; gres.conf names 0",
		Slurmd: "/usr/sbin/slurmd -G -f /etc/slurm/slurm.conf -N n1", GresConf: "/etc/slurm/gres.conf", AutoDetect: "nvml",
		GPUs: []statefile.TableGPU{{Index: 0, Type: "t4", Files: []string{"/dev/nvidia1"}}, {Index: 1, Type: "t4", Files: []string{"/dev/nvidia0"}}}}
	r := Build(in)
	if !r.OK || r.GPUTable == nil || r.GPUTable.Source != "slurmd -G" {
		t.Fatalf("ok %v, problems %q, table %+v", r.OK, r.Problems, r.GPUTable)
	}
	var out bytes.Buffer
	Write(&out, r)
	text := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"GPU table source slurmd -G 2 GPU(s): slurmd's 2 GPU(s)", "slurmd /usr/sbin/slurmd -G -f /etc/slurm/slurm.conf -N n1",
		"gres.conf /etc/slurm/gres.conf AutoDetect=nvml", "gpu 0 /dev/nvidia1 t4 gpu 1 /dev/nvidia0 t4"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	in.State.GPUTable.Untrusted = "slurmd -G and gres.conf disagree on which device a GPU index is (GPU index 0 is /dev/nvidia1 for slurmd -G, /dev/nvidia0 in gres.conf)"
	r = Build(in)
	if r.OK || len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "gpu table: the agent gives no GPU to any step: slurmd -G and gres.conf disagree") {
		t.Fatalf("problems %q", r.Problems)
	}
	out.Reset()
	Write(&out, r)
	if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), "refusing every GPU step: slurmd -G and gres.conf disagree") {
		t.Errorf("output:\n%s", out.String())
	}
}
