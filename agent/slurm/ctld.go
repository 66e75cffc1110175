package slurm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/gpufence/gpufence/agent/policy"
)

// JobGPUsFromController asks slurmctld, through `scontrol show job -d`,
// which GPU indices job holds on node. It is the agent's second trusted
// source (the first is the job prolog): slurmctld answers over Slurm's
// authenticated RPC, nothing a job user can set. found is false when the job
// has no allocation on node.
func JobGPUsFromController(ctx context.Context, slurmConf string, jobID uint32, node string) (gpus []int, found bool, err error) {
	cmd := exec.CommandContext(ctx, "scontrol", "show", "job", "-d", fmt.Sprint(jobID))
	cmd.Env = append(os.Environ(), "SLURM_CONF="+slurmConf)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, false, fmt.Errorf("scontrol show job -d %d: %v: %s", jobID, err, strings.TrimSpace(string(out)))
	}
	return ParseJobGPUs(string(out), node)
}

// ParseJobGPUs reads the per-node lines of `scontrol show job -d`
// ("Nodes=n[1-2] CPU_IDs=0-1 Mem=0 GRES=gpu:a100:2(IDX:0-1)") for node.
func ParseJobGPUs(out, node string) (gpus []int, found bool, err error) {
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "Nodes=") {
			continue
		}
		match, err := hostMatches(strings.TrimPrefix(fields[0], "Nodes="), node)
		if err != nil {
			return nil, false, fmt.Errorf("scontrol: %v", err)
		}
		if !match {
			continue
		}
		found = true
		gpus = []int{}
		for _, f := range fields {
			gres, ok := strings.CutPrefix(f, "GRES=")
			if !ok {
				continue
			}
			for _, item := range splitGres(gres) {
				if !strings.HasPrefix(item, "gpu") {
					continue
				}
				_, idx, ok := strings.Cut(item, "(IDX:")
				if !ok {
					continue
				}
				list, _, _ := strings.Cut(idx, ")")
				g, err := policy.ParseGresIDX(list)
				if err != nil {
					return nil, false, fmt.Errorf("scontrol GRES %q: %v", item, err)
				}
				gpus = append(gpus, g...)
			}
		}
	}
	return gpus, found, nil
}

// splitGres splits "gpu:2(IDX:0-1),mps:100(0/100)" on commas outside
// parentheses.
func splitGres(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}
