// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/tests/cluster"
)

// TestPrivilegedSbcastForeignGPU is attack 6 of issue 18: a user with a
// GPU job runs `sbcast -f /bin/true <another job's GPU>`. slurmd serves the
// broadcast by forking a child that drops to the user (setresuid(uid, uid,
// -1): the saved uid stays root) and opens the destination with
// O_WRONLY|O_CREAT|O_TRUNC, in slurmd's own cgroup, which keeps every
// device for slurmd's NVML. That child must be refused the GPU (EPERM
// reaches sbcast), and the audit must name the denial in Slurm's slurmd
// cgroup as a non-root process there; the GPU the victim holds is never
// opened by it. slurmd itself (root) keeps its devices: the victim's steps
// still open their GPUs.
func TestPrivilegedSbcastForeignGPU(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	t0 := time.Now()
	defer func() { t.Logf("attack test took %v after the node was idle", time.Since(t0).Round(time.Millisecond)) }()

	victim := st.allocate(t, "", "--gres=gpu:3", "-J", "victim")
	attacker := st.allocate(t, user, "--gres=gpu:1", "-J", "sbcast")
	alloc := st.allocated(t)
	mine, theirs := alloc[attacker], alloc[victim]
	if len(mine) != 1 || len(theirs) != 3 || slices.ContainsFunc(mine, func(g int) bool { return slices.Contains(theirs, g) }) {
		t.Fatalf("Slurm allocated %v to the attacker and %v to the victim; want 1 and 3 disjoint GPUs", mine, theirs)
	}
	target := st.c.DevPath(theirs[0])
	t.Logf("Slurm gave the attacker's job %d GPU %v and the victim's job %d GPUs %v; target %s", attacker, mine, victim, theirs, target)
	var devSt unix.Stat_t
	if err := unix.Stat(target, &devSt); err != nil {
		t.Fatal(err)
	}
	wantMajor, wantMinor := unix.Major(devSt.Rdev), unix.Minor(devSt.Rdev)
	var slurmdSt unix.Stat_t
	slurmdCg := filepath.Join(st.c.ScopeDir(), "slurmd")
	if err := unix.Stat(slurmdCg, &slurmdSt); err != nil {
		t.Fatalf("slurmd's cgroup under the scope (the harness runs slurmd without systemd): %v", err)
	}
	uid, _ := lookup(t)
	auditPath := st.auditFiles[len(st.auditFiles)-1]
	before := 0
	if _, err := os.Stat(auditPath); err == nil {
		before = len(readAudit(t, auditPath))
	}

	r := st.c.Run(st.ctx, user, "sbcast", fmt.Sprintf("--jobid=%d", attacker), "-f", "/bin/true", target)
	t.Logf("sbcast as %s: exit %d, stderr %q", user, r.Code, strings.TrimSpace(r.Stderr))
	if r.Code == 0 {
		t.Errorf("sbcast onto another job's GPU %s succeeded: %s", target, r)
	}
	if !strings.Contains(r.Stderr, "Operation not permitted") {
		t.Errorf("sbcast's error does not say the open was refused (EPERM): %q", r.Stderr)
	}

	// The denial is recorded, and nothing records the open as allowed.
	var denied *audit.Record
	var allowed []audit.Record
	deadline := time.Now().Add(15 * time.Second)
	for denied == nil && time.Now().Before(deadline) {
		allowed = allowed[:0]
		recs := readAudit(t, auditPath)
		for i := before; i < len(recs); i++ {
			rec := recs[i]
			if rec.Event != audit.EventGPUAccess || rec.Device == nil || rec.Device.Major != wantMajor || rec.Device.Minor != wantMinor {
				continue
			}
			if rec.UID == nil || *rec.UID != uid {
				continue
			}
			switch rec.Decision {
			case audit.DecisionDenied:
				denied = &rec
			case audit.DecisionAllowed:
				allowed = append(allowed, rec)
			}
		}
		if denied == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, a := range allowed {
		t.Errorf("the attacker's open of %s was allowed: %s", target, a.Message)
	}
	if denied == nil {
		t.Fatalf("no denied gpu_access record of %d:%d for uid %d after sbcast", wantMajor, wantMinor, uid)
	}
	t.Logf("audit: %s (reason %q)", denied.Message, denied.Reason)
	if denied.CgroupID != slurmdSt.Ino {
		t.Errorf("denial recorded for cgroup %d, want slurmd's %d (%s)", denied.CgroupID, slurmdSt.Ino, slurmdCg)
	}
	if denied.Reason != audit.ReasonNonRootInSlurmCgroup {
		t.Errorf("denial reason %q, want %q", denied.Reason, audit.ReasonNonRootInSlurmCgroup)
	}
	if denied.JobID != 0 {
		t.Errorf("denial names job %d; the access came from slurmd's cgroup, not a job", denied.JobID)
	}
	if denied.GPU == nil || denied.GPU.Index != theirs[0] {
		t.Errorf("denial names GPU %+v, want index %d", denied.GPU, theirs[0])
	}

	// Root's steps in the victim's job, and the attacker's own, keep theirs.
	st.expectGPUs(t, st.probeStep(t, attacker, nil), mine)
	rv := st.c.Run(st.ctx, "", "srun", append([]string{fmt.Sprintf("--jobid=%d", victim), "--overlap", st.open, "-env"}, st.paths()...)...)
	mustOK(t, rv)
	st.expectGPUs(t, cluster.ParseOpen(rv.Stdout), theirs)
}
