// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/jobmap"
)

// scrapeParsed gets /metrics from h and parses it with Prometheus's own
// text format parser, as a Prometheus server would read it.
func scrapeParsed(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
	return fams
}

func labelMap(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// An authenticated scrape labels each job's GPU with dcgm-exporter's label
// names and meanings (NVML's index as gpu, where Slurm's, which differs
// here, is slurm_gpu), so a PromQL join on UUID or on gpu and Hostname
// meets dcgm-exporter's series of the same GPU.
func TestExpositionDCGMLabels(t *testing.T) {
	e := populated(t)
	fams := scrapeParsed(t, e.Handler(nil, true))
	want := map[string]string{
		"job_id": "9", "user": "root", "slurm_gpu": "2",
		"gpu": "0", "UUID": "GPU-x", "pci_bus_id": "00000000:18:00.0", "device": "nvidia0",
		"modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-node-07",
	}
	for _, name := range []string{nameAllocated, nameMemUsed, nameMemTotal, nameUtilization, nameIdle} {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 {
			t.Errorf("%s: %v, want one series", name, f)
			continue
		}
		if got := labelMap(f.GetMetric()[0]); !reflect.DeepEqual(got, want) {
			t.Errorf("%s labels\n got %v\nwant %v", name, got, want)
		}
	}
	var names []string
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	sorted := append([]string{}, jobLabels...)
	sort.Strings(sorted)
	if !reflect.DeepEqual(names, sorted) {
		t.Errorf("jobLabels %v, the test checks %v", sorted, names)
	}
}

// The public scrape names the host for joins (gpufence_node_info) and
// nothing of a GPU or job: neither dcgm-exporter's GPU labels nor Slurm's
// index, so the label change adds no series and leaks nothing.
func TestExpositionPublicLabels(t *testing.T) {
	e := populated(t)
	fams := scrapeParsed(t, e.Handler(nil, false))
	f := fams[nameNodeInfo]
	if f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetGauge().GetValue() != 1 ||
		!reflect.DeepEqual(labelMap(f.GetMetric()[0]), map[string]string{"Hostname": "gpu-node-07"}) {
		t.Errorf("%s: %v", nameNodeInfo, f)
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case labelJob, labelUser, labelSlurmGPU, labelGPU, labelUUID, labelPCIBusID, labelDevice, labelModel:
					t.Errorf("public %s has label %s=%q", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
}

// The job mapping file dcgm-exporter reads for a GPU is named by the same
// number as gpufence's gpu label of that GPU, both NVML's index, so its
// hpc_job and gpufence's job_id agree on which GPU a job holds.
func TestJobMapMatchesGPULabel(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "map")
	jm, err := jobmap.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	smp := &fakeSampler{}
	// Slurm's 0 and 1 are /dev/nvidia0 and /dev/nvidia1; NVML numbers them 1 and 0.
	smp.set(nil, inventory.Usage{Index: 1, Minor: 0, UUID: "GPU-a"}, inventory.Usage{Index: 0, Minor: 1, UUID: "GPU-b"})
	e := New(Options{Sampler: smp, JobMap: jm})
	e.Allocations([]Allocation{alloc(41, 0, gpu(0, 0)), alloc(42, 0, gpu(1, 1))})
	e.sample()
	e.refresh()
	for _, c := range []struct{ job, slurm, nvml, uuid string }{{"41", "0", "1", "GPU-a"}, {"42", "1", "0", "GPU-b"}} {
		b, err := os.ReadFile(filepath.Join(dir, c.nvml))
		if err != nil || string(b) != c.job+"\n" {
			t.Errorf("mapping file %s: %q %v, want job %s", c.nvml, b, err, c.job)
		}
		one(t, e.Registry(), nameAllocated, map[string]string{"job_id": c.job, "slurm_gpu": c.slurm, "gpu": c.nvml, "UUID": c.uuid})
	}
}
