package e2e

// The tests here run after every other test of the package: go test runs
// tests in the order of their files' names, then of their places in a file.

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/gpufence/gpufence/agent/audit"
)

// TestPrivilegedZLeftovers:
// once every job is gone, the kernel holds only the exempt entries.
func TestPrivilegedZLeftovers(t *testing.T) {
	st := get(t)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if q := st.c.Run(st.ctx, "", "squeue", "-h"); strings.TrimSpace(q.Stdout) == "" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	var n int
	var err error
	for time.Now().Before(deadline) {
		if n, err = policyEntries(st.c.ScopeDir()); err == nil && n == 2 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || n != 2 {
		t.Errorf("policy entries after all jobs ended: %d (%v), want 2 (system and slurmd)", n, err)
	}
}

// TestPrivilegedZAuditSchema checks that every record any agent
// of the suite wrote validates against docs/audit.schema.json, and within
// each agent run every missing sequence number is explained by a loss
// record.
func TestPrivilegedZAuditSchema(t *testing.T) {
	st := get(t)
	f, err := os.Open("../../docs/audit.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("audit.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	schema, err := c.Compile("audit.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, path := range st.auditFiles {
		fh, err := os.Open(path)
		if err != nil {
			if os.IsNotExist(err) {
				continue // the tmpfs file went with its mount
			}
			t.Fatal(err)
		}
		seen := map[uint64]bool{}
		explained := map[uint64]bool{}
		var max uint64
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			total++
			v, err := jsonschema.UnmarshalJSON(strings.NewReader(sc.Text()))
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if err := schema.Validate(v); err != nil {
				t.Errorf("%s: record does not validate: %#v\n%s", path, err, sc.Text())
			}
			var r audit.Record
			json.Unmarshal(sc.Bytes(), &r)
			if seen[r.Seq] {
				t.Errorf("%s: seq %d twice", path, r.Seq)
			}
			seen[r.Seq] = true
			max = max0(max, r.Seq)
			if r.Loss != nil {
				for _, g := range r.Loss.LostSeqs {
					for s := g.First; s <= g.Last; s++ {
						explained[s] = true
					}
				}
			}
		}
		fh.Close()
		for s := uint64(1); s <= max; s++ {
			if !seen[s] && !explained[s] {
				t.Errorf("%s: seq %d missing and not explained by an audit_loss record", path, s)
			}
		}
	}
	if total == 0 {
		t.Fatal("no audit records at all")
	}
	t.Logf("%d records in %d audit files validated", total, len(st.auditFiles))
}
