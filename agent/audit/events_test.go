// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// The schema's event enum, docs/audit.md's event list and Events agree.
func TestEventsMatchSchemaAndDocs(t *testing.T) {
	_, here, _, _ := runtime.Caller(0)
	docs := filepath.Join(filepath.Dir(here), "..", "..", "docs")
	b, err := os.ReadFile(filepath.Join(docs, "audit.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Properties struct {
			Event struct {
				Enum []Event `json:"enum"`
			} `json:"event"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(doc.Properties.Event.Enum, Events) {
		t.Errorf("schema event enum %v, Events %v", doc.Properties.Event.Enum, Events)
	}
	md, err := os.ReadFile(filepath.Join(docs, "audit.md"))
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, l := range strings.Split(string(md), "\n") {
		if strings.HasPrefix(l, "| `event` |") {
			row = l
		}
	}
	for _, e := range Events {
		if !strings.Contains(row, "`"+string(e)+"`") {
			t.Errorf("docs/audit.md's event row lacks %s", e)
		}
	}
}
