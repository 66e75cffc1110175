// SPDX-License-Identifier: Apache-2.0

package status

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/audit"
)

// TestStatusTextEscapes: strings that reach `gpufence status` from outside
// (a job's broken reason quoting its fields, a user name from NSS, a
// program name someone else's loader chose, errors naming paths) print no
// control character and cannot add a line of their own.
func TestStatusTextEscapes(t *testing.T) {
	in := consistentInput(t)
	const evil = "\x1b[2J\x1b]0;pwned\x07\nConsistent: no problem found.\t\u009b"
	in.Agent.Error, in.Agent.Listening = "refused "+evil, false
	in.Kernel.Link.ProgramName = "devfilter" + evil
	in.Kernel.Errors = []string{"map x: " + evil}
	in.UserName = func(uint32) string { return "alice" + evil }
	in.State.Jobs[0].Broken = "slurmctld said " + evil
	clean := Build(consistentInput(t))
	r := Build(in)
	var out, want bytes.Buffer
	Write(&out, r)
	Write(&want, clean)
	text := out.String()
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if audit.Printable(line) != line {
			t.Errorf("line %d holds a control character: %q", i+1, line)
		}
		if strings.TrimSpace(line) == "Consistent: no problem found." {
			t.Errorf("line %d is a line the job wrote: %q", i+1, line)
		}
	}
	if !strings.Contains(text, `\x1b[2J\x1b]0;pwned\x07\x0aConsistent`) {
		t.Errorf("status does not show the escaped text:\n%s", text)
	}
	// The hostile fields change what the lines say, not how many there
	// are beyond the problems they cause.
	extra := len(r.Problems) - len(clean.Problems)
	if got, base := strings.Count(text, "\n"), strings.Count(want.String(), "\n"); got > base+extra+2 {
		t.Errorf("%d lines, the clean report has %d and %d more problems", got, base, extra)
	}
}
