// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/tests/cluster"
)

// controlBytes lists the bytes of s a terminal may act on, other than the
// line ends: C0, DEL, C1 (UTF-8 encoded or a lone byte).
func controlBytes(s string) []string {
	var bad []string
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '\n':
		case r < 0x20 || (r >= 0x7f && r <= 0x9f), r == utf8.RuneError && size == 1 && s[i] <= 0x9f:
			lo, hi := max(0, i-20), min(len(s), i+20)
			bad = append(bad, fmt.Sprintf("%q at byte %d in %q", s[i:i+size], i, s[lo:hi]))
		}
		i += size
	}
	return bad
}

// TestPrivilegedAuditHostileComm: a job's process renames itself to escape
// sequences (prctl(PR_SET_NAME), as any process may) and opens GPUs it was
// not given. The admin's `gpufence audit tail` (text and --json), `gpufence
// status` and the agent's log print no control byte, and the record still
// says what the name was (escaped, reversibly).
func TestPrivilegedAuditHostileComm(t *testing.T) {
	st := get(t)
	// Clears the screen, sets the terminal title, an 8-bit CSI: 14 bytes.
	const name = "\x1b[2J\x1b]0;pwn\x07\u009b"
	args := append([]string{"--gres=gpu:1", st.open, "-env", "-comm", name}, st.c.DevPaths()...)
	r := st.c.Run(st.ctx, user, "srun", args...)
	mustOK(t, r)
	rep := cluster.ParseOpen(r.Stdout)
	job := jobOf(t, rep)
	eperm := 0
	for _, p := range st.c.DevPaths() {
		if rep.Open[p] == "EPERM" {
			eperm++
		}
	}
	if eperm != 3 {
		t.Fatalf("a gpu:1 step opening 4 GPUs was denied %d of them, want 3:\n%s", eperm, r.Stdout)
	}
	recs := st.waitRecords(t, job, func(rs []audit.Record) bool { return len(access(rs, audit.DecisionDenied)) >= 3 })
	denied := access(recs, audit.DecisionDenied)
	if len(denied) != 3 {
		t.Fatalf("%d denied records for job %d, want 3: %+v", len(denied), job, recs)
	}
	for _, rec := range denied {
		// Escape is reversible (agent/audit's TestEscape round-trips it).
		if want := audit.Escape(name); rec.Comm != want {
			t.Errorf("record comm %q, want %q: the name the process set, %q, escaped", rec.Comm, want, name)
		}
		if bad := controlBytes(rec.Comm + rec.Message); len(bad) > 0 {
			t.Errorf("record holds control characters: %v", bad)
		}
	}
	file := st.auditFiles[len(st.auditFiles)-1]
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if bad := controlBytes(string(raw)); len(bad) > 0 {
		t.Errorf("the audit file holds control bytes: %v", bad)
	}
	escaped := audit.Escape(name)
	for _, args := range [][]string{{"--job", fmt.Sprint(job)}, {"--job", fmt.Sprint(job), "--json"}, {"--denied", "-n", "0"}} {
		out, err := exec.Command(st.gpufence, append([]string{"audit", "tail", "--file", file}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("gpufence audit tail %v: %v\n%s", args, err, out)
		}
		if bad := controlBytes(string(out)); len(bad) > 0 {
			t.Errorf("gpufence audit tail %v printed control bytes: %v", args, bad)
		}
		want := escaped
		if slicesContain(args, "--json") {
			b, _ := json.Marshal(escaped)
			want = strings.Trim(string(b), `"`)
		}
		if !strings.Contains(string(out), want) {
			t.Errorf("gpufence audit tail %v does not show the escaped name %q:\n%s", args, want, out)
		}
	}
	// The agent's own log (text) quotes what it logs.
	log, err := os.ReadFile(st.agent.Log)
	if err != nil {
		t.Fatal(err)
	}
	if bad := controlBytes(string(log)); len(bad) > 0 {
		t.Errorf("the agent's log holds control bytes: %v", bad)
	}
	// slog's text handler writes the (escaped) value as it is, or quoted
	// when it holds a character that needs quoting.
	if !bytes.Contains(log, []byte("comm="+escaped)) && !bytes.Contains(log, []byte("comm="+strconv.Quote(escaped))) {
		t.Errorf("the agent's log does not show the escaped comm %q", escaped)
	}
	out, _ := exec.Command(st.gpufence, "status", "--socket", st.sock, "--pin-dir", filepath.Join(st.bpffs, "gpufence"),
		"--state-file", filepath.Join(st.c.Root(), "run", "agent-state.json")).CombinedOutput()
	if bad := controlBytes(string(out)); len(bad) > 0 {
		t.Errorf("gpufence status printed control bytes: %v", bad)
	}
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// mountDev is major:minor of the superblock of the file at path, as
// mountinfo shows it for the file's mount: what the kernel records.
func mountDev(t *testing.T, path string) string {
	t.Helper()
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &stx); err != nil || stx.Mask&unix.STATX_MNT_ID == 0 {
		t.Fatalf("statx %s: %v", path, err)
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[0] == strconv.FormatUint(stx.Mnt_id, 10) {
			return f[2]
		}
	}
	t.Fatalf("mount %d of %s not in mountinfo", stx.Mnt_id, path)
	return ""
}

// TestPrivilegedAuditExecAfterOpen: a job's process opens GPUs it was not
// given and at once execs another program (sleep). The agent reads
// /proc/<pid>/exe only afterwards; the record must not name sleep as the
// program of the access: exe is either verified to be gf-open, or absent
// with exe_status "changed" and sleep in exe_now; exe_dev/exe_ino always
// name gf-open's file, as the kernel saw it at the access.
func TestPrivilegedAuditExecAfterOpen(t *testing.T) {
	st := get(t)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	if sleep, err = filepath.EvalSymlinks(sleep); err != nil {
		t.Fatal(err)
	}
	open, err := filepath.EvalSymlinks(st.open)
	if err != nil {
		t.Fatal(err)
	}
	var stOpen unix.Stat_t
	if err := unix.Stat(open, &stOpen); err != nil {
		t.Fatal(err)
	}
	wantDev := mountDev(t, open)
	outcomes := map[string]int{}
	// A few jobs: whether the agent reads /proc before or after the exec
	// is a race, and both ends must be right.
	for range 3 {
		script := fmt.Sprintf("echo job=$SLURM_JOB_ID; exec %s -exec %s -exec-arg 1 %s", open, sleep, strings.Join(st.c.DevPaths(), " "))
		r := st.c.Run(st.ctx, user, "srun", "--gres=gpu:1", "bash", "-c", script)
		mustOK(t, r)
		id, ok := strings.CutPrefix(strings.TrimSpace(r.Stdout), "job=")
		job, err := strconv.ParseUint(id, 10, 32)
		if !ok || err != nil {
			t.Fatalf("no job id in %q", r.Stdout)
		}
		recs := st.waitRecords(t, uint32(job), func(rs []audit.Record) bool { return len(access(rs, audit.DecisionDenied)) >= 3 })
		denied := access(recs, audit.DecisionDenied)
		if len(denied) != 3 {
			t.Fatalf("job %d: %d denied records, want 3: %+v", job, len(denied), recs)
		}
		for _, rec := range denied {
			outcomes[rec.ExeStatus]++
			if rec.Exe == sleep || rec.Comm != "gf-open" {
				t.Errorf("job %d: the denied open is recorded under exe %q comm %q, want gf-open's: %+v", job, rec.Exe, rec.Comm, rec)
			}
			if rec.ExeIno != stOpen.Ino || rec.ExeDev != wantDev {
				t.Errorf("job %d: exe_dev %q exe_ino %d, want gf-open's %s %d", job, rec.ExeDev, rec.ExeIno, wantDev, stOpen.Ino)
			}
			switch rec.ExeStatus {
			case audit.ExeVerified:
				if rec.Exe != open || rec.ExeNow != "" {
					t.Errorf("job %d: verified exe %q (exe_now %q), want %s", job, rec.Exe, rec.ExeNow, open)
				}
			case audit.ExeChanged:
				if rec.Exe != "" || rec.ExeNow != sleep {
					t.Errorf("job %d: changed: exe %q exe_now %q, want no exe and exe_now %s", job, rec.Exe, rec.ExeNow, sleep)
				}
			case audit.ExeExited:
				if rec.Exe != "" || rec.ExeNow != "" {
					t.Errorf("job %d: exited: exe %q exe_now %q, want neither", job, rec.Exe, rec.ExeNow)
				}
			default:
				t.Errorf("job %d: exe_status %q for a process the kernel identified: %+v", job, rec.ExeStatus, rec)
			}
		}
		out, err := exec.Command(st.gpufence, "audit", "tail", "--file", st.auditFiles[len(st.auditFiles)-1],
			"--job", fmt.Sprint(job), "--denied").CombinedOutput()
		if err != nil {
			t.Fatalf("gpufence audit tail: %v\n%s", err, out)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if strings.Contains(l, sleep) && !strings.Contains(l, "[exec'd since] "+sleep) {
				t.Errorf("audit tail shows %s as the program of the access: %s", sleep, l)
			}
		}
	}
	t.Logf("exe_status of the denied opens: %v", outcomes)
}
