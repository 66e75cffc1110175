// SPDX-License-Identifier: Apache-2.0

package e2e

// Checks over the whole suite: TestMain runs them after every test, so
// they do not depend on the order go test runs tests in.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/tests/ocsf"
)

// finalChecks: once every job is gone the kernel holds only the exempt
// entries, and every audit record any agent of the suite wrote validates.
func (st *suite) finalChecks() error {
	var errs []error
	if err := st.checkLeftovers(); err != nil {
		errs = append(errs, err)
	}
	n, err := st.checkAuditSchema()
	if err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(os.Stderr, "final checks: %d records in %d audit files validated\n", n, len(st.auditFiles))
	n, files, err := st.checkOCSF()
	if err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(os.Stderr, "final checks: %d OCSF events in %d files validated against OCSF %s\n", n, files, audit.OCSFVersion)
	return errors.Join(errs...)
}

// checkOCSF validates every event of every OCSF file the suite's agents
// wrote against the pinned OCSF schema (tests/ocsf).
func (st *suite) checkOCSF() (events, files int, err error) {
	schema, err := ocsf.Pinned()
	if err != nil {
		return 0, 0, err
	}
	var errs []error
	for _, f := range st.auditFiles {
		path := ocsfFile(f)
		fh, err := os.Open(path)
		if os.IsNotExist(err) {
			continue // a test's own audit file, or one on a file system it removed
		} else if err != nil {
			return events, files, err
		}
		files++
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			events++
			if bad := schema.Validate(sc.Bytes()); len(bad) > 0 {
				errs = append(errs, fmt.Errorf("%s: OCSF event does not validate: %s\n%s", path, strings.Join(bad, "; "), sc.Text()))
			}
		}
		fh.Close()
		if err := sc.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
	}
	return events, files, errors.Join(errs...)
}

// checkLeftovers: with no job left, the kernel holds only the exempt
// entries (system and slurmd).
func (st *suite) checkLeftovers() error {
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
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("policy entries after all jobs ended: %d (%v), want 2 (system and slurmd)", n, err)
}

// checkAuditSchema checks that every record validates against
// docs/audit.schema.json, and that within each agent run every missing
// sequence number is explained by a loss record.
func (st *suite) checkAuditSchema() (int, error) {
	f, err := os.Open("../../docs/audit.schema.json")
	if err != nil {
		return 0, err
	}
	doc, err := jsonschema.UnmarshalJSON(f)
	f.Close()
	if err != nil {
		return 0, err
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("audit.schema.json", doc); err != nil {
		return 0, err
	}
	schema, err := c.Compile("audit.schema.json")
	if err != nil {
		return 0, err
	}
	var errs []error
	total := 0
	for _, path := range st.auditFiles {
		fh, err := os.Open(path)
		if err != nil {
			if os.IsNotExist(err) {
				continue // the tmpfs file went with its mount
			}
			return total, err
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
				errs = append(errs, fmt.Errorf("%s: %v", path, err))
				continue
			}
			if err := schema.Validate(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: record does not validate: %#v\n%s", path, err, sc.Text()))
			}
			var r audit.Record
			json.Unmarshal(sc.Bytes(), &r)
			if seen[r.Seq] {
				errs = append(errs, fmt.Errorf("%s: seq %d twice", path, r.Seq))
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
				errs = append(errs, fmt.Errorf("%s: seq %d missing and not explained by an audit_loss record", path, s))
			}
		}
	}
	if total == 0 {
		errs = append(errs, errors.New("no audit records at all"))
	}
	return total, errors.Join(errs...)
}
