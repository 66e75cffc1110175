// SPDX-License-Identifier: Apache-2.0

// Command schemacopy copies, from an unpacked OCSF schema release, the files
// that validating gpufence's OCSF events needs: the dictionary, the
// categories, the classes named on the command line with every class they
// extend, the profiles they $include and every object their attributes
// reach, transitively; and writes SOURCE naming the release and the
// SHA-256 of each copied file (refresh-schema.sh runs it).
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type def struct {
	Name       string                     `json:"name"`
	Extends    string                     `json:"extends"`
	Attributes map[string]json.RawMessage `json:"attributes"`
}

type dictAttr struct {
	Type string `json:"type"`
}

func main() {
	src := flag.String("src", "", "unpacked schema release")
	out := flag.String("out", "", "folder to (re)create")
	repo := flag.String("repo", "https://github.com/ocsf/ocsf-schema", "repository URL for SOURCE")
	tag := flag.String("tag", "", "release tag for SOURCE")
	commit := flag.String("commit", "", "commit for SOURCE")
	flag.Parse()
	if *src == "" || *out == "" || *tag == "" || *commit == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: schemacopy -src DIR -out DIR -tag TAG -commit SHA CLASS_FILE...")
		os.Exit(2)
	}
	if err := run(*src, *out, *repo, *tag, *commit, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "schemacopy:", err)
		os.Exit(1)
	}
}

func load(path string) (def, error) {
	var d def
	b, err := os.ReadFile(path)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// index maps the names of the definitions under dir to their paths.
func index(src, dir string) (map[string]string, error) {
	m := map[string]string{}
	err := filepath.WalkDir(filepath.Join(src, dir), func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(p, ".json") {
			return err
		}
		d, err := load(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		m[d.Name] = rel
		return nil
	})
	return m, err
}

func run(src, out, repo, tag, commit string, classes []string) error {
	var dict struct {
		Attributes map[string]dictAttr `json:"attributes"`
	}
	b, err := os.ReadFile(filepath.Join(src, "dictionary.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &dict); err != nil {
		return fmt.Errorf("dictionary.json: %w", err)
	}
	events, err := index(src, "events")
	if err != nil {
		return err
	}
	objects, err := index(src, "objects")
	if err != nil {
		return err
	}
	want := map[string]bool{"LICENSE": true, "version.json": true, "dictionary.json": true, "categories.json": true}
	var visit func(rel string, names map[string]string) error
	visit = func(rel string, names map[string]string) error {
		if want[rel] {
			return nil
		}
		want[rel] = true
		d, err := load(filepath.Join(src, rel))
		if err != nil {
			return err
		}
		if d.Extends != "" {
			p, ok := names[d.Extends]
			if !ok {
				return fmt.Errorf("%s extends %q, which is not defined", rel, d.Extends)
			}
			if err := visit(p, names); err != nil {
				return err
			}
		}
		for k, v := range d.Attributes {
			if k == "$include" {
				var inc []string
				if err := json.Unmarshal(v, &inc); err != nil {
					return fmt.Errorf("%s: $include: %w", rel, err)
				}
				for _, p := range inc {
					if err := visit(p, objects); err != nil {
						return err
					}
				}
				continue
			}
			var local dictAttr
			_ = json.Unmarshal(v, &local)
			t := local.Type
			if t == "" {
				t = dict.Attributes[k].Type
			}
			if p, ok := objects[t]; ok {
				if err := visit(p, objects); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, c := range classes {
		if err := visit(c, events); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	files := make([]string, 0, len(want))
	for f := range want {
		files = append(files, f)
	}
	sort.Strings(files)
	var sums strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return err
		}
		dst := filepath.Join(out, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(&sums, "%s  %s\n", hex.EncodeToString(sum[:]), f)
	}
	source := fmt.Sprintf(`# A pinned copy of part of the OCSF schema, made by tests/ocsf/refresh-schema.sh
# (make ocsf-schema); do not edit. Apache-2.0, see LICENSE.
repository: %s
tag: %s
commit: %s
classes: %s
# SHA-256 of every copied file (sha256sum -c SOURCE checks them):
%s`, repo, tag, commit, strings.Join(classes, " "), sums.String())
	return os.WriteFile(filepath.Join(out, "SOURCE"), []byte(source), 0o644)
}
