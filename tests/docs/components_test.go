// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// mapped are the trees whose every package docs/architecture.md's
// component map names.
var mapped = []string{"agent", "bpf", "proto", "spank"}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the test's own source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// listPackages is what `go list` finds under the mapped trees, as paths
// relative to the module root.
func listPackages(t *testing.T, root string) []string {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatalf("no go command to list the packages: %v", err)
		}
	}
	args := []string{"list", "-f", "{{.Dir}}"}
	for _, m := range mapped {
		args = append(args, "./"+m+"/...")
	}
	cmd := exec.Command(goBin, args...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []string
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, filepath.ToSlash(rel))
	}
	if len(pkgs) < 30 {
		t.Fatalf("go list found %d packages under %v, fewer than the tree holds: %s", len(pkgs), mapped, out)
	}
	return pkgs
}

// componentPaths are the paths the first column of each table in the
// "## Components" section names in backquotes.
func componentPaths(t *testing.T, doc string) []string {
	t.Helper()
	_, section, ok := strings.Cut(doc, "\n## Components\n")
	if !ok {
		t.Fatal("docs/architecture.md has no \"## Components\" section")
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	code := regexp.MustCompile("`([^`]+)`")
	var paths []string
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, m := range code.FindAllStringSubmatch(first, -1) {
			paths = append(paths, strings.TrimSuffix(m[1], "/"))
		}
	}
	return paths
}

// TestComponentMap holds docs/architecture.md's component map to the
// tree: every package under agent/, bpf/, proto/ and spank/ has its row,
// and every row names a folder that exists.
func TestComponentMap(t *testing.T) {
	root := repoRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs/architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := componentPaths(t, string(doc))
	if len(listed) == 0 {
		t.Fatal("the Components section names no path")
	}
	for _, pkg := range listPackages(t, root) {
		if !slices.Contains(listed, pkg) {
			t.Errorf("package %s is missing from docs/architecture.md's component map (## Components): add a row with its one job", pkg)
		}
	}
	seen := map[string]bool{}
	for _, p := range listed {
		if seen[p] {
			t.Errorf("docs/architecture.md's component map names %s twice", p)
		}
		seen[p] = true
		if fi, err := os.Stat(filepath.Join(root, p)); err != nil || !fi.IsDir() {
			t.Errorf("docs/architecture.md's component map names %s, which is not a folder of the tree", p)
		}
	}
}

// TestComponentPaths checks the parser on a section that lacks a
// package and names one twice, so a map that reads as complete cannot be
// an artefact of reading nothing.
func TestComponentPaths(t *testing.T) {
	doc := "# x\n\n## Components\n\n| path | what |\n|---|---|\n| `agent/a`, `agent/b/` | jobs; see `agent/c` |\n| `spank/plugin/` | C |\n\n## Next\n\n| `agent/d` | not here |\n"
	got := componentPaths(t, doc)
	want := []string{"agent/a", "agent/b", "spank/plugin"}
	if !slices.Equal(got, want) {
		t.Errorf("componentPaths = %q, want %q", got, want)
	}
}
