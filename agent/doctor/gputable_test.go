// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/slurm"
)

// slurmdPrints makes the node's slurmd -G report these minors in order
// (err, when set, makes it fail).
func (n *node) slurmdPrints(err error, minors ...int) *[]string {
	var asked []string
	n.env.SlurmdG = func(binDir, slurmConf, node string) (slurm.SlurmdView, error) {
		asked = append(asked, fmt.Sprintf("%s %s %s", binDir, slurmConf, node))
		v := slurm.SlurmdView{Command: "/usr/sbin/slurmd -G -f " + slurmConf + " -N " + node}
		if err != nil {
			return v, err
		}
		for i, m := range minors {
			p := fmt.Sprintf("/dev/nvidia%d", m)
			v.GPUs = append(v.GPUs, slurm.GPU{Index: i, Path: p, Files: []string{p}, Type: "h100"})
		}
		return v, nil
	}
	return &asked
}

func TestGresCheckSlurmdTable(t *testing.T) {
	failed := errors.New("exit status 1: fatal: Unable to process configuration file")
	for _, tc := range []struct {
		name    string
		gres    string // "" keeps newNode's
		err     error
		minors  []int
		mode    string
		verdict Verdict
		summary string
		fix     string
		detail  string
		root    bool // needs the device nodes
	}{
		{name: "agree", minors: []int{0, 1}, verdict: OK, detail: "the agent's GPU table: slurmd -G: slurmd's 2 GPU(s), the same as gres.conf's", root: true},
		{name: "AutoDetect only, slurmd's order", gres: "AutoDetect=nvml\n", minors: []int{1, 0}, verdict: OK,
			detail: "GPU 0: /dev/nvidia1 (type h100)", root: true},
		{name: "static, slurmd swaps", minors: []int{1, 0}, verdict: Fail, summary: "slurmd -G and gres.conf disagree on which device a GPU index is", fix: "File= lines", root: true},
		{name: "slurmd has GPUs gres.conf does not", gres: "NodeName=gpu2 Name=gpu File=/dev/nvidia[0-1]\n", minors: []int{0}, verdict: Fail, summary: "absent in gres.conf"},
		{name: "slurmd fails, static", err: failed, verdict: Warn, summary: "slurmd -G failed, so gres.conf's 2 GPU(s) are used without slurmd's cross-check", fix: "by hand", root: true},
		{name: "slurmd fails, AutoDetect", gres: "AutoDetect=nvml\nNodeName=gpu1 Name=gpu File=/dev/nvidia[0-1]\n", err: failed, verdict: Fail, summary: "only slurmd knows which device each GPU index is", fix: "by hand", root: true},
		{name: "required, slurmd fails", err: failed, mode: config.SlurmdGPUTableRequired, verdict: Fail, summary: "slurmd_gpu_table is required and slurmd -G failed", root: true},
		{name: "off", minors: []int{1, 0}, mode: config.SlurmdGPUTableOff, verdict: OK, detail: "slurmd_gpu_table is off", root: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root: the fixture's device nodes")
			}
			n := newNode(t)
			if tc.gres != "" {
				n.write("/etc/slurm/gres.conf", tc.gres)
			}
			if tc.mode != "" {
				n.env.Config.SlurmdGPUTable = tc.mode
			}
			n.env.Config.SlurmBinDir = "/opt/slurm/bin"
			asked := n.slurmdPrints(tc.err, tc.minors...)
			r := n.run()
			c := find(t, r, "gres")
			detail := strings.Join(c.Detail, "\n")
			if c.Verdict != tc.verdict || !strings.Contains(c.Summary, tc.summary) || !strings.Contains(c.Fix, tc.fix) || !strings.Contains(detail, tc.detail) {
				t.Fatalf("gres: %s %q fix %q detail:\n%s\nwant %s %q fix %q detail %q", c.Verdict, c.Summary, c.Fix, detail, tc.verdict, tc.summary, tc.fix, tc.detail)
			}
			if tc.mode == config.SlurmdGPUTableOff {
				if len(*asked) != 0 {
					t.Errorf("slurmd -G run with slurmd_gpu_table off: %q", *asked)
				}
			} else if len(*asked) != 1 || (*asked)[0] != "/opt/slurm/bin /etc/slurm/slurm.conf gpu1" {
				t.Errorf("slurmd -G asked %q", *asked)
			}
		})
	}
}
