// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, rel)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Run over a release tree holding the pinned files plus a class and an
// object nothing used reaches, schemacopy makes the pinned copy again, byte
// for byte, SOURCE included: it copies the closure of the classes, not
// the tree.
func TestSchemacopyReproducesThePinnedCopy(t *testing.T) {
	pinned := filepath.Join("..", "schema")
	source, err := os.ReadFile(filepath.Join(pinned, "SOURCE"))
	if err != nil {
		t.Fatal(err)
	}
	field := func(k string) string {
		for _, l := range strings.Split(string(source), "\n") {
			if v, ok := strings.CutPrefix(l, k+": "); ok {
				return v
			}
		}
		t.Fatalf("SOURCE has no %s", k)
		return ""
	}
	src := t.TempDir()
	copyTree(t, pinned, src)
	os.Remove(filepath.Join(src, "SOURCE"))
	extra := map[string]string{
		"objects/unrelated.json":          `{"name": "unrelated", "caption": "U", "extends": "object", "attributes": {"name": {"requirement": "optional"}}}`,
		"events/system/unused_class.json": `{"uid": 77, "name": "unused_class", "caption": "X", "extends": "system", "attributes": {"file": {"requirement": "required"}}}`,
	}
	for p, body := range extra {
		if err := os.WriteFile(filepath.Join(src, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "schema")
	if err := run(src, out, field("repository"), field("tag"), field("commit"), strings.Fields(field("classes"))); err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for dir, list := range map[string]*[]string{out: &got, pinned: &want} {
		err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				rel, _ := filepath.Rel(dir, p)
				*list = append(*list, rel)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("schemacopy made\n%v\nthe pinned copy is\n%v", got, want)
	}
	for _, f := range want {
		a, _ := os.ReadFile(filepath.Join(out, f))
		b, _ := os.ReadFile(filepath.Join(pinned, f))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from the pinned copy", f)
		}
	}
}
