// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"os"
	"strings"
	"testing"
)

// recordedLinks is the recorded layout whose slurmd -G output (every
// release, 22.05 to 26.05) numbers the GPUs nvidia2, nvidia3, nvidia0,
// nvidia1; it was recorded with its device files under this root.
const (
	recordedLinks     = "../../agent/slurm/testdata/slurmd-G/layouts/autodetect-links/"
	recordedLinksRoot = "/var/tmp/gfg-slurmdg/autodetect-links"
)

// TestAutoDetectLayoutIsRecorded: the harness's fake_gpus.conf is the one
// the recorded slurmd -G outputs came from (with the recording's root and
// CPU count), so the order the e2e test expects (AutoDetectOrder) is what
// real releases printed for it, not what the harness assumes.
func TestAutoDetectLayoutIsRecorded(t *testing.T) {
	want, err := os.ReadFile(recordedLinks + "fake_gpus.conf")
	if err != nil {
		t.Fatal(err)
	}
	p := testParams()
	p.Root, p.CPUs, p.AutoDetect = recordedLinksRoot, 2, true
	if got := renderFakeGPUs(p); got != string(want) {
		t.Errorf("fake_gpus.conf:\n%s\nthe recorded layout's:\n%s", got, want)
	}
	// The recording's slurmd -G table, in Slurm's index order.
	out, err := os.ReadFile("../../agent/slurm/testdata/slurmd-G/22.05/autodetect-links.stderr")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, l := range strings.Split(string(out), "\n") {
		if _, f, ok := strings.Cut(l, " File="); ok && strings.Contains(l, "Gres Name=gpu ") {
			files = append(files, strings.Fields(f)[0])
		}
	}
	if len(files) != len(AutoDetectOrder) {
		t.Fatalf("recorded table %v, want %d GPUs", files, len(AutoDetectOrder))
	}
	for i, m := range AutoDetectOrder {
		if want := recordedLinksRoot + "/dev/nvidia" + string(rune('0'+m)); files[i] != want {
			t.Errorf("recorded GPU index %d is %s, AutoDetectOrder says %s", i, files[i], want)
		}
	}
	g := renderGresConf(p)
	if strings.Contains(g, "File=") || !strings.Contains("\n"+g, "\nAutoDetect=nvml\n") {
		t.Errorf("AutoDetect gres.conf: %q, want AutoDetect=nvml and no File= line", g)
	}
	// Untyped Gres=, in every variant.
	for _, pc := range []bool{false, true} {
		p.PCluster = pc
		if conf := renderSlurmConf(p); !strings.Contains(conf, " Gres=gpu:4 ") {
			t.Errorf("PCluster=%v: slurm.conf node line is not Gres=gpu:4:\n%s", pc, conf)
		}
	}
}
