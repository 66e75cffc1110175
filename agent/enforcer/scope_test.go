// SPDX-License-Identifier: Apache-2.0

package enforcer

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/jobcgroup"
)

// TestNoteScope: a scope that cannot be told is logged and audited once
// while it lasts, again when it changes or comes back; a cgroup that only
// bears the scope's name is logged once.
func TestNoteScope(t *testing.T) {
	var logs bytes.Buffer
	rec := &audittest.Recorder{}
	e := New(Options{Log: slog.New(slog.NewTextHandler(&logs, nil)), Recorder: rec})
	planted := jobcgroup.Candidate{Path: "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/n1_slurmstepd.scope", Refused: "inside user.slice"}
	ambiguous := jobcgroup.Found{Err: fmt.Errorf("%w: a and b", jobcgroup.ErrAmbiguous), Candidates: []jobcgroup.Candidate{planted}}
	for range 3 {
		e.note(ambiguous)
	}
	if got := rec.Records(audit.EventFilterAttachFailed); len(got) != 1 || got[0].Severity != audit.SeverityError || got[0].Error != ambiguous.Err.Error() {
		t.Fatalf("after three finds of one ambiguity: records %+v, want one error record", got)
	}
	if n := strings.Count(logs.String(), "is not Slurm's; ignored"); n != 1 || !strings.Contains(logs.String(), planted.Path) {
		t.Errorf("planted scope logged %d times:\n%s", n, logs.String())
	}
	e.note(jobcgroup.Found{Scope: "/sys/fs/cgroup/system.slice/slurmstepd.scope", Candidates: []jobcgroup.Candidate{planted}})
	if !strings.Contains(logs.String(), "can be told again") {
		t.Errorf("no log that the scope can be told again:\n%s", logs.String())
	}
	e.note(ambiguous)
	if got := rec.Records(audit.EventFilterAttachFailed); len(got) != 2 {
		t.Errorf("the ambiguity back: %d records, want 2", len(got))
	}
}
