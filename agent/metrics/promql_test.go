// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// promLabels writes a label set as PromQL does, name first when given.
func promLabels(name string, l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+strconv.Quote(l[k]))
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

func merged(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// The PromQL joins docs/metrics.md shows work, evaluated by Prometheus's
// own engine (promtool test rules): gpufence's series as the handler
// serves them, dcgm-exporter's as its template writes them from NVML's
// facts of the same GPU (populatedUsage), beside a decoy GPU whose NVML
// index is the job's Slurm index, where a join on Slurm's index would land.
func TestDocumentedPromQLJoins(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool (Debian's prometheus package) on this machine")
	}
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, m := range regexp.MustCompile("(?s)```promql\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		exprs = append(exprs, strings.TrimSpace(m[1]))
	}
	if len(exprs) != 3 {
		t.Fatalf("docs/metrics.md has %d promql blocks, the test knows 3", len(exprs))
	}

	fams := scrapeParsed(t, populated(t).Handler(nil, true))
	if fams[nameAllocated] == nil || len(fams[nameAllocated].GetMetric()) != 1 || fams[nameNodeInfo] == nil {
		t.Fatalf("populated serves no single allocation or node info")
	}
	alloc := labelMap(fams[nameAllocated].GetMetric()[0])
	node := labelMap(fams[nameNodeInfo].GetMetric()[0])
	host := node["Hostname"]
	gf := map[string]string{"instance": host + ":9945", "job": "gpufence"}
	dc := map[string]string{"instance": host + ":9400", "job": "dcgm"}
	u := populatedUsage
	idx := strconv.Itoa(u.Index)
	dcgmGPU := merged(dc, map[string]string{"gpu": idx, "UUID": u.UUID, "pci_bus_id": u.PCIBusID,
		"device": "nvidia" + idx, "modelName": u.Name, "Hostname": host})
	decoy := merged(dc, map[string]string{"gpu": alloc["slurm_gpu"], "UUID": "GPU-decoy", "pci_bus_id": "00000000:9A:00.0",
		"device": "nvidia" + alloc["slurm_gpu"], "modelName": u.Name, "Hostname": host})
	if alloc["slurm_gpu"] == idx {
		t.Fatalf("the fixture's Slurm and NVML indices agree (%s): a mix-up would pass", idx)
	}

	type sample struct {
		Labels string  `json:"labels"`
		Value  float64 `json:"value"`
	}
	type exprTest struct {
		Expr     string   `json:"expr"`
		EvalTime string   `json:"eval_time"`
		Samples  []sample `json:"exp_samples"`
	}
	type series struct {
		Series string `json:"series"`
		Values string `json:"values"`
	}
	job := map[string]string{"job_id": alloc["job_id"], "user": alloc["user"]}
	test := map[string]any{
		"rule_files":          []string{"empty.yml"},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval": "1m",
			"input_series": []series{
				{promLabels("DCGM_FI_DEV_GPU_UTIL", dcgmGPU), "80x10"},
				{promLabels("DCGM_FI_DEV_GPU_UTIL", decoy), "40x10"},
				{promLabels(nameAllocated, merged(gf, alloc)), "1x10"},
				{promLabels(nameNodeInfo, merged(gf, node)), "1x10"},
				{promLabels(nameAccess, merged(gf, map[string]string{"decision": "denied"})), "0+6x10"},
			},
			"promql_expr_test": []exprTest{
				{exprs[0], "5m", []sample{{promLabels("", merged(dcgmGPU, job, map[string]string{"slurm_gpu": alloc["slurm_gpu"]})), 80}}},
				{exprs[1], "5m", []sample{{promLabels("", merged(dcgmGPU, job)), 80}}},
				// 6 denials a minute; the node's GPUs average 60%.
				{exprs[2], "10m", []sample{{promLabels("", map[string]string{"Hostname": host}), 0.1}}},
			},
		}},
	}
	dir := t.TempDir()
	b, _ := json.MarshalIndent(test, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "test.yml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "empty.yml"), []byte("groups: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", "test.yml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules: %v\n%s\ntest file:\n%s", err, out, b)
	}
}
