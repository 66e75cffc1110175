// SPDX-License-Identifier: Apache-2.0

package pkgtest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var spdxLine = regexp.MustCompile(`(?m)^(//|#|/\*) SPDX-License-Identifier:`)

// TestSPDXHeaders: every source file of ours names its license in its first
// lines: Apache-2.0 (LICENSE), the BPF program GPL-2.0-only OR BSD-2-Clause
// (it calls GPL-only helpers). Vendored headers, generated code and build
// outputs are not ours to label.
func TestSPDXHeaders(t *testing.T) {
	root := repoRoot(t)
	skipDir := map[string]bool{".git": true, "build": true, "bin": true, "headers": true, "node_modules": true}
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if skipDir[d.Name()] && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		ext := filepath.Ext(path)
		script := false
		switch ext {
		case ".go", ".c", ".h", ".sh":
		default:
			b := make([]byte, 2)
			if f, err := os.Open(path); err == nil {
				n, _ := f.Read(b)
				f.Close()
				script = n == 2 && string(b) == "#!"
			}
			if !script {
				return nil
			}
		}
		if strings.Contains(rel, "/testdata/") && ext != ".c" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		head := string(data[:min(len(data), 2048)])
		if strings.Contains(head, "Code generated") || strings.Contains(head, "DO NOT EDIT") {
			return nil
		}
		want := "SPDX-License-Identifier: Apache-2.0"
		if strings.HasSuffix(path, ".bpf.c") {
			want = "SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)"
		}
		checked++
		if !strings.Contains(head, want) {
			t.Errorf("%s: no %q in its first lines", rel, want)
		}
		if n := len(spdxLine.FindAllIndex(data, -1)); n > 1 {
			t.Errorf("%s: %d SPDX lines, want one", rel, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("only %d source files found under %s", checked, root)
	}
	t.Logf("%d source files carry their SPDX line", checked)
}
