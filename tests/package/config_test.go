// SPDX-License-Identifier: Apache-2.0

package pkgtest

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/config"
)

const shippedConfig = "packaging/agent.yaml"

// TestDefaultConfig checks the shipped /etc/gpufence/agent.yaml: as shipped
// it gives the defaults; with every "#key: value" line uncommented it still
// gives exactly the defaults (so the values it shows are the real ones); and
// it names every key the agent knows.
func TestDefaultConfig(t *testing.T) {
	path := filepath.Join(repoRoot(t), shippedConfig)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Default()

	got, err := config.Load(path, true)
	if err != nil {
		t.Fatalf("as shipped: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("as shipped the file changes the defaults:\n got %+v\nwant %+v", got, want)
	}

	// "#key: value" and, nested, "#  key: value" show a default; "# text"
	// is prose.
	uncommented := regexp.MustCompile(`(?m)^#([^ \n]|  )`).ReplaceAllStringFunc(string(data), func(m string) string {
		return m[1:]
	})
	if uncommented == string(data) {
		t.Fatal("no #key: value lines found")
	}
	all := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(all, []byte(uncommented), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = config.Load(all, true)
	if err != nil {
		t.Fatalf("with every default uncommented: %v\n%s", err, uncommented)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("with every default uncommented the values differ from config.Default():\n got %+v\nwant %+v", got, want)
	}

	for _, key := range yamlKeys(reflect.TypeOf(config.Config{}), "") {
		leaf := key[strings.LastIndex(key, ".")+1:]
		if !regexp.MustCompile(`(?m)^#? ?\s*` + regexp.QuoteMeta(leaf) + `:`).Match(data) {
			t.Errorf("%s does not mention the key %s", shippedConfig, key)
		}
	}
}

// yamlKeys lists the yaml keys of a config struct, nested ones as a.b.
func yamlKeys(typ reflect.Type, prefix string) []string {
	var keys []string
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(config.Duration{}) {
			keys = append(keys, yamlKeys(f.Type, prefix+name+".")...)
			continue
		}
		keys = append(keys, prefix+name)
	}
	return keys
}

// TestCopyrightNamesModules fails when a Go module linked into the packaged
// binaries is not named in the package's copyright file.
func TestCopyrightNamesModules(t *testing.T) {
	root := repoRoot(t)
	copyright, err := os.ReadFile(filepath.Join(root, "packaging/copyright"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(root, "go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "./agent/cmd/gpufence")
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	seen := map[string]bool{}
	for _, m := range strings.Fields(out) {
		if m == "github.com/gpufence/gpufence" || seen[m] {
			continue
		}
		seen[m] = true
		if !regexp.MustCompile(`(?m)[ :]` + regexp.QuoteMeta(m) + `$`).Match(copyright) {
			t.Errorf("packaging/copyright does not name %s, which is linked into the binaries", m)
		}
	}
	if len(seen) == 0 {
		t.Fatal("go list found no modules")
	}
}
