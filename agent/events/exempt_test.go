// SPDX-License-Identifier: Apache-2.0

package events

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// TestAccessRecordSlurmCgroupNonRoot: what the program refuses in one of
// Slurm's own cgroups (a non-root process there: slurmd's sbcast child) is
// a gpu_access record with its own reason, naming that cgroup and the
// process's uid and no job; root's allowed accesses there, and denials in
// job steps, carry no such reason.
func TestAccessRecordSlurmCgroupNonRoot(t *testing.T) {
	e := newStage(&audittest.Recorder{})
	defer e.Close()
	slurmd := registry.Owner{Exempt: "slurmd"}
	step := registry.Owner{JobID: 42, StepID: 0, UID: 1000, GPUs: []int{1}}
	tests := []struct {
		name       string
		owner      registry.Owner
		decision   devfilter.Decision
		uid        uint32
		wantReason string
		wantMsg    string
	}{
		{"non-root in slurmd denied", slurmd, devfilter.DecisionDenied, 2951, audit.ReasonNonRootInSlurmCgroup,
			"device 195:0 denied to a non-root process in Slurm's own slurmd cgroup (every device there is for root only): pid 0 x, uid 2951"},
		{"non-root in slurmd, audit-only", slurmd, devfilter.DecisionWouldDeny, 2951, audit.ReasonNonRootInSlurmCgroup,
			"device 195:0 would-deny to a non-root process in Slurm's own slurmd cgroup"},
		{"root in slurmd allowed", slurmd, devfilter.DecisionAllowed, 0, "", "device 195:0 allowed to Slurm's slurmd cgroup: pid 0 x, uid 0"},
		{"job step denied", step, devfilter.DecisionDenied, 1000, "", "device 195:0 denied to job 42 step 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.accessRecord(devfilter.Event{Major: 195, Minor: 0, Decision: tt.decision, UID: tt.uid, Comm: "x"}, tt.owner, true, 0)
			if r.Reason != tt.wantReason {
				t.Errorf("reason %q, want %q", r.Reason, tt.wantReason)
			}
			if !strings.HasPrefix(r.Message, tt.wantMsg) {
				t.Errorf("message %q, want it to start with %q", r.Message, tt.wantMsg)
			}
			if r.UID == nil || *r.UID != tt.uid {
				t.Errorf("uid %v, want %d", r.UID, tt.uid)
			}
			if tt.owner.Exempt != "" && (r.JobID != 0 || r.StepID != "") {
				t.Errorf("record names job %d step %q for Slurm's own cgroup", r.JobID, r.StepID)
			}
		})
	}
}

// TestSuppressedSlurmCgroupNonRoot: denials in Slurm's own cgroup that the
// kernel only counted are recorded with the same reason, naming the cgroup.
func TestSuppressedSlurmCgroupNonRoot(t *testing.T) {
	rec := &audittest.Recorder{}
	reg := registry.New(nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	reg.SetExempt("slurmd", cgroup.Cgroup{ID: 77, Path: "/sys/fs/cgroup/x/slurmd"})
	e := New(Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Recorder: rec, Owners: reg, Table: noTable{}, Users: &users.Cache{}})
	defer e.Close()
	key := devfilter.RateKey{CgroupID: 77, Major: 195, Minor: 0, Decision: devfilter.DecisionDenied}
	e.Flush(&countsFilter{supp: map[devfilter.RateKey]uint64{key: 3}})
	recs := rec.Records(audit.EventAccessSuppressed)
	if len(recs) != 1 {
		t.Fatalf("%d access_suppressed records, want 1", len(recs))
	}
	r := recs[0]
	if r.Reason != audit.ReasonNonRootInSlurmCgroup || r.Suppressed != 3 || r.JobID != 0 || r.UID != nil {
		t.Errorf("record %+v: want reason %q, 3 suppressed, no job, no uid", r, audit.ReasonNonRootInSlurmCgroup)
	}
	if want := "3 more denied accesses to device 195:0 by non-root processes in Slurm's own slurmd cgroup"; !strings.HasPrefix(r.Message, want) {
		t.Errorf("message %q, want it to start with %q", r.Message, want)
	}
}
