// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
)

// TestPrivilegedAttackExeSpoof is issue 18's attack 4 under real Slurm: a
// job user's srun step makes a user and mount namespace of its own
// (unshare -Urm, no privilege needed where unprivileged user namespaces
// are allowed), binds gf-open over /usr/bin/true there, execs
// /usr/bin/true and opens every GPU, three of which the job was not given.
// /proc/<pid>/exe then reads "/usr/bin/true" and is gf-open's file. The
// denied records must not call /usr/bin/true the verified program: they
// carry gf-open's device and inode as the kernel saw them, and
// /usr/bin/true only as the namespace's path. gf-open run by its own path
// in the same way is still verified.
func TestPrivilegedAttackExeSpoof(t *testing.T) {
	st := get(t)
	var trueSt, openSt unix.Stat_t
	if err := unix.Stat("/usr/bin/true", &trueSt); err != nil {
		t.Fatal(err)
	}
	open, err := filepath.EvalSymlinks(st.open)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(open, &openSt); err != nil {
		t.Fatal(err)
	}
	wantDev := mountDev(t, open)
	// The attack.
	for _, r := range st.exeStep(t, "spoof", fmt.Sprintf(`unshare -Urm sh -c 'mount --bind "$0" /usr/bin/true && exec /usr/bin/true "$@"' %s`, open)) {
		t.Logf("spoof: pid %d: exe %q exe_status %q exe_namespace_path %q exe_mnt_ns %d exe %s/%d", r.PID, r.Exe, r.ExeStatus, r.ExeNamespacePath, r.ExeMntNS, r.ExeDev, r.ExeIno)
		if r.ExeStatus == audit.ExeVerified || r.Exe != "" {
			t.Errorf("job %d: the bind-mounted /usr/bin/true is recorded as verified program %q (exe_status %q)", r.JobID, r.Exe, r.ExeStatus)
		}
		if r.ExeIno != openSt.Ino || r.ExeDev != wantDev || r.ExeIno == trueSt.Ino {
			t.Errorf("job %d: exe_dev %q exe_ino %d, want gf-open's %s %d (the node's /usr/bin/true is inode %d)", r.JobID, r.ExeDev, r.ExeIno, wantDev, openSt.Ino, trueSt.Ino)
		}
		if r.ExeStatus != audit.ExeOtherNamespace || r.ExeNamespacePath != "/usr/bin/true" || r.ExeMntNS == 0 || r.Comm != "true" {
			t.Errorf("job %d: exe_status %q exe_namespace_path %q exe_mnt_ns %d comm %q, want other_namespace, /usr/bin/true, the namespace, true",
				r.JobID, r.ExeStatus, r.ExeNamespacePath, r.ExeMntNS, r.Comm)
		}
	}
	// The same program by its own path is still the verified program.
	for _, r := range st.exeStep(t, "plain", open) {
		if r.ExeStatus != audit.ExeVerified || r.Exe != open || r.ExeIno != openSt.Ino || r.ExeDev != wantDev {
			t.Errorf("job %d: plain gf-open: exe %q exe_status %q exe_namespace_path %q exe %s/%d, want verified %s %s/%d",
				r.JobID, r.Exe, r.ExeStatus, r.ExeNamespacePath, r.ExeDev, r.ExeIno, open, wantDev, openSt.Ino)
		}
	}
}

// exeStep runs, as an srun step of a gpu:1 batch job of the job user,
// prog with gf-open's arguments to open every GPU until the test is done
// with it (the process lives, running the file it exec'd, while the agent
// looks at it), and returns the job's denied records once the three GPUs
// it was not given are recorded.
func (st *suite) exeStep(t *testing.T, name, prog string) []audit.Record {
	t.Helper()
	work := filepath.Join(st.c.Root(), "work")
	stamp := time.Now().UnixNano()
	stop := filepath.Join(work, fmt.Sprintf("exe-%s-stop-%d", name, stamp))
	out := filepath.Join(work, fmt.Sprintf("exe-%s-%d-%%j.out", name, stamp))
	script := fmt.Sprintf("#!/bin/sh\nexec srun --gres=gpu:1 %s -until %s -sleep 20ms %s\n", prog, stop, strings.Join(st.c.DevPaths(), " "))
	sh := filepath.Join(work, fmt.Sprintf("exe-%s-%d.sh", name, stamp))
	if err := os.WriteFile(sh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	id, err := st.c.Sbatch(st.ctx, user, "--gres=gpu:1", "-o", out, sh)
	if err != nil {
		t.Fatal(err)
	}
	out = strings.ReplaceAll(out, "%j", id)
	defer func() {
		os.WriteFile(stop, nil, 0o644)
		if state, err := st.c.WaitJob(st.ctx, id); err != nil || state != "COMPLETED" {
			log, _ := os.ReadFile(out)
			t.Errorf("%s job %s: state %q, %v\n%s", name, id, state, err, log)
		}
	}()
	// The step has run prog once it reports an open.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if b, _ := os.ReadFile(out); strings.Contains(string(b), "EPERM") {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(out)
			t.Fatalf("%s job %s never opened a GPU:\n%s", name, id, b)
		}
	}
	job, err := strconv.ParseUint(id, 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	recs := st.waitRecords(t, uint32(job), func(rs []audit.Record) bool { return len(access(rs, audit.DecisionDenied)) >= 3 })
	denied := access(recs, audit.DecisionDenied)
	// gf-open opens in rounds: the rate limit lets more than one
	// record of a GPU through, and each must be right.
	if len(denied) < 3 {
		t.Fatalf("%s job %d: %d denied records, want 3 or more: %+v", name, job, len(denied), recs)
	}
	return denied
}
