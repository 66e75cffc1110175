// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseSlurmdG: whatever slurmd -G prints (every recorded release's
// output is a seed), the parser returns in bounded memory a table Slurm
// could number, or an error, and never panics. The time bound is the fuzz
// engine's own: an input that hangs fails the target.
func FuzzParseSlurmdG(f *testing.F) {
	outs, _ := filepath.Glob(filepath.Join(recorded, "*", "*.stderr"))
	if len(outs) == 0 {
		f.Fatal("no recorded slurmd -G outputs")
	}
	for _, p := range outs {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"slurmd: Gres Name=gpu Type=(null) Count=65536 Index=0 ID=1 File=/d/n[0-65535] (null)\n",
		"slurmd: Gres Name=gpu Count=1 File=/d/n[0-65535]\n",
		"Gres Name=gpu Count=2 File=/a,/b\nGres Name=gpu Count=1 File=/a,/c\n",
		"[x] Gres Name=gpu Count=1 File=/dev/nvidia0\n",
		"slurmd: Gres Name=gpu Count=1 File=/dev/nvidia0 Name=mps\n",
		strings.Repeat("slurmd: Gres Name=gpu Count=1 File=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap1\n", 2000),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		before := heapAllocs()
		gpus, err := parseSlurmdG(out)
		if a := heapAllocs() - before; a > allocBound(len(out)) {
			t.Fatalf("parseSlurmdG allocated %d bytes for %d bytes of output", a, len(out))
		}
		if err != nil {
			if gpus != nil || err.Error() == "" {
				t.Fatalf("error %v with %d GPUs", err, len(gpus))
			}
			return
		}
		if gpus == nil || len(gpus) > maxGPUs {
			t.Fatalf("%d GPUs (nil %v) without an error", len(gpus), gpus == nil)
		}
		whole := map[string]bool{}
		for i, g := range gpus {
			switch {
			case g.Index != i:
				t.Fatalf("GPU %d has index %d", i, g.Index)
			case len(g.Files) == 0 || g.Path != g.Files[0] || !filepath.IsAbs(g.Path):
				t.Fatalf("GPU %d: path %q, files %q", i, g.Path, g.Files)
			case g.MIG != (len(g.Files) > 1) || len(g.Files) > maxMIGFiles:
				t.Fatalf("GPU %d: MIG %v with %d files", i, g.MIG, len(g.Files))
			case !strings.HasPrefix(g.Source, "slurmd -G line "):
				t.Fatalf("GPU %d has source %q", i, g.Source)
			case !g.MIG && whole[g.Path]:
				t.Fatalf("whole GPU %s listed twice", g.Path)
			}
			if !g.MIG {
				whole[g.Path] = true
			}
		}
		for _, g := range gpus {
			for _, f := range g.Files {
				if g.MIG && whole[f] {
					t.Fatalf("%s is a whole GPU and part of MIG slice %d", f, g.Index)
				}
			}
		}
	})
}
