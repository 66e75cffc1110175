// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/tests/cluster"
)

// readAudit parses an audit file; a partial last line is left out.
func readAudit(t *testing.T, path string) []audit.Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []audit.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r audit.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: bad line %q: %v", path, sc.Text(), err)
		}
		recs = append(recs, r)
	}
	return recs
}

// ocsfFile is where an agent start writes the OCSF events of the records
// it writes to auditFile.
func ocsfFile(auditFile string) string {
	return strings.TrimSuffix(auditFile, ".jsonl") + ".ocsf.jsonl"
}

// ocsfEvent is what the tests read of an OCSF event.
type ocsfEvent struct {
	ClassUID      int `json:"class_uid"`
	ActivityID    int `json:"activity_id"`
	TypeUID       int `json:"type_uid"`
	DispositionID int `json:"disposition_id"`
	Time          int64
	Metadata      struct {
		UID, Version string
	}
	File struct {
		Path   string
		TypeID int `json:"type_id"`
		UID    string
	}
	Actor struct {
		User    struct{ Name, UID string }
		Process struct {
			PID  uint32
			Name string
		}
	}
	Unmapped struct {
		JobID uint32 `json:"job_id"`
	}
}

// readOCSF parses an OCSF file by metadata.uid.
func readOCSF(t *testing.T, path string) map[string]ocsfEvent {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs := map[string]ocsfEvent{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e ocsfEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s: bad line %q: %v", path, sc.Text(), err)
		}
		evs[e.Metadata.UID] = e
	}
	return evs
}

// waitRecords polls the current audit file until match returns true for the
// records of job, or fails after 15 s.
func (st *suite) waitRecords(t *testing.T, job uint32, done func([]audit.Record) bool) []audit.Record {
	t.Helper()
	var mine []audit.Record
	deadline := time.Now().Add(15 * time.Second)
	for {
		mine = mine[:0]
		path := st.auditFiles[len(st.auditFiles)-1]
		if _, err := os.Stat(path); os.IsNotExist(err) && time.Now().Before(deadline) {
			// A just-started agent opens its audit file with its first record.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for _, r := range readAudit(t, path) {
			if r.JobID == job {
				mine = append(mine, r)
			}
		}
		if done(mine) || time.Now().After(deadline) {
			return mine
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func jobOf(t *testing.T, rep cluster.OpenReport) uint32 {
	t.Helper()
	id, err := strconv.ParseUint(rep.Env["SLURM_JOB_ID"], 10, 32)
	if err != nil {
		t.Fatalf("SLURM_JOB_ID=%q", rep.Env["SLURM_JOB_ID"])
	}
	return uint32(id)
}

func access(recs []audit.Record, decision string) []audit.Record {
	var out []audit.Record
	for _, r := range recs {
		if r.Event == audit.EventGPUAccess && r.Decision == decision {
			out = append(out, r)
		}
	}
	return out
}

// TestPrivilegedAuditRecords: a job opening GPUs it was not given yields a
// denied record per GPU, attributed to its job, step, user, process and
// device; its own GPU yields exactly one allowed record (`first`).
func TestPrivilegedAuditRecords(t *testing.T) {
	st := get(t)
	// Open every GPU three times: still one allowed record for the own one.
	args := []string{"--gres=gpu:1", st.open, "-env", "-loop", "3"}
	r := st.c.Run(st.ctx, user, "srun", append(args, st.c.DevPaths()...)...)
	mustOK(t, r)
	rep := cluster.ParseOpen(r.Stdout)
	job := jobOf(t, rep)
	own := gpusOf(t, rep, "SLURM_STEP_GPUS")[0]
	recs := st.waitRecords(t, job, func(rs []audit.Record) bool {
		n, released := 0, false
		for _, r := range access(rs, audit.DecisionDenied) {
			n += 1 + int(r.Suppressed)
		}
		// srun may return before slurmstepd's exit callback released the
		// step.
		for _, r := range rs {
			released = released || (r.Event == audit.EventPolicyReleased && r.StepID == "0")
		}
		return n >= 9 && len(access(rs, audit.DecisionAllowed)) >= 1 && released
	})
	uid, _ := lookup(t)
	denied := map[int]int{}
	for _, r := range access(recs, audit.DecisionDenied) {
		if r.StepID != "0" || r.User != user || r.UID == nil || *r.UID != uid || r.Comm != "gf-open" || r.PID == 0 ||
			r.GPU == nil || r.Device == nil || r.Device.Path != st.c.DevPath(r.GPU.Index) || r.Device.Major != 195 ||
			r.Device.Minor != uint32(r.GPU.Index) || r.PolicyMode != audit.ModeEnforce || r.Cluster == "" || r.Node != st.c.Hostname() ||
			!slices.Equal(r.Access, []string{"read", "write"}) {
			t.Errorf("badly attributed denied record: %+v", r)
			continue
		}
		denied[r.GPU.Index] += 1 + int(r.Suppressed)
	}
	for i := range 4 {
		want := 3
		if i == own {
			want = 0
		}
		if denied[i] != want {
			t.Errorf("GPU %d: %d denied opens recorded, want %d (job holds GPU %d)", i, denied[i], want, own)
		}
	}
	allowed := access(recs, audit.DecisionAllowed)
	if len(allowed) != 1 || allowed[0].GPU == nil || allowed[0].GPU.Index != own {
		t.Errorf("allowed records %+v, want exactly one for GPU %d", allowed, own)
	}
	var applied, released bool
	for _, r := range recs {
		applied = applied || (r.Event == audit.EventPolicyApplied && r.StepID == "0" && slices.Equal(r.GPUs, []int{own}))
		released = released || (r.Event == audit.EventPolicyReleased && r.StepID == "0")
	}
	if !applied || !released {
		t.Errorf("policy_applied %v, policy_released %v for step 0: %+v", applied, released, recs)
	}
	// The OCSF file has each of these records as a File System Activity
	// event of the same run and seq.
	evs := readOCSF(t, ocsfFile(st.auditFiles[len(st.auditFiles)-1]))
	for _, r := range access(recs, audit.DecisionDenied) {
		e, ok := evs[r.RunID+":"+strconv.FormatUint(r.Seq, 10)]
		if !ok || e.ClassUID != 1001 || e.ActivityID != 14 || e.TypeUID != 100114 || e.DispositionID != 2 ||
			e.File.TypeID != 3 || e.File.Path != r.Device.Path || e.File.UID != fmt.Sprintf("%d:%d", r.Device.Major, r.Device.Minor) ||
			e.Actor.User.Name != user || e.Actor.User.UID != strconv.Itoa(int(uid)) || e.Actor.Process.PID != r.PID ||
			e.Actor.Process.Name != r.Comm || e.Unmapped.JobID != job || e.Metadata.Version != audit.OCSFVersion ||
			e.Time != r.AccessTime.UnixMilli() {
			t.Errorf("OCSF event of denied record %s:%d: %v %+v\nrecord %+v", r.RunID, r.Seq, ok, e, r)
		}
	}
	// The CLI shows it to a person.
	out, err := exec.Command(st.gpufence, "audit", "tail", "--file", st.auditFiles[len(st.auditFiles)-1],
		"--job", fmt.Sprint(job), "--denied").CombinedOutput()
	if err != nil || strings.Count(string(out), "denied") < 3 || !strings.Contains(string(out), user) {
		t.Errorf("gpufence audit tail --job %d --denied: %v\n%s", job, err, out)
	}
}

// TestPrivilegedAuditOnly: nothing is denied, every would-be denial is
// recorded.
func TestPrivilegedAuditOnly(t *testing.T) {
	st := get(t)
	if err := st.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := st.startAgent(agentOpts{auditOnly: true}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		st.agent.Stop()
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
	}()
	rep, r := st.srun(t, nil, "--gres=gpu:1")
	mustOK(t, r)
	st.expectGPUs(t, rep, []int{0, 1, 2, 3})
	job := jobOf(t, rep)
	own := gpusOf(t, rep, "SLURM_STEP_GPUS")[0]
	recs := st.waitRecords(t, job, func(rs []audit.Record) bool { return len(access(rs, audit.DecisionWouldDeny)) >= 3 })
	var got []int
	for _, r := range access(recs, audit.DecisionWouldDeny) {
		if r.PolicyMode != audit.ModeAuditOnly || r.GPU == nil {
			t.Errorf("would-deny record: %+v", r)
			continue
		}
		got = append(got, r.GPU.Index)
	}
	slices.Sort(got)
	var want []int
	for i := range 4 {
		if i != own {
			want = append(want, i)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("would-deny records for GPUs %v, want %v", got, want)
	}
	if n := len(access(recs, audit.DecisionDenied)); n != 0 {
		t.Errorf("%d denied records in audit-only mode", n)
	}
}

// TestPrivilegedAuditStorm: a million denied opens from one job are all
// accounted for, records plus suppressed counts, while the agent stays small.
func TestPrivilegedAuditStorm(t *testing.T) {
	st := get(t)
	const n = 1000000
	before := procStats(t, st.agent.PID)
	t0 := time.Now()
	r := st.c.Run(st.ctx, user, "srun", "--gres=gpu:1", st.open, "-env", "-count", fmt.Sprint(n), st.c.DevPath(3), st.c.DevPath(2))
	mustOK(t, r)
	dur := time.Since(t0)
	rep := cluster.ParseOpen(r.Stdout)
	job := jobOf(t, rep)
	own := gpusOf(t, rep, "SLURM_STEP_GPUS")[0]
	target := 3
	if own == 3 {
		target = 2
	}
	if !strings.Contains(r.Stdout, fmt.Sprintf("%s EPERM x%d", st.c.DevPath(target), n)) {
		t.Fatalf("not every open of GPU %d was denied:\n%s", target, r.Stdout)
	}
	count := func(rs []audit.Record) (recs, suppressed int) {
		for _, r := range rs {
			if r.GPU != nil && r.GPU.Index == target && r.Decision == audit.DecisionDenied &&
				(r.Event == audit.EventGPUAccess || r.Event == audit.EventAccessSuppressed) {
				if r.Event == audit.EventGPUAccess {
					recs++
				}
				suppressed += int(r.Suppressed)
			}
		}
		return
	}
	recs := st.waitRecords(t, job, func(rs []audit.Record) bool {
		a, b := count(rs)
		return a+b >= n
	})
	a, b := count(recs)
	after := procStats(t, st.agent.PID)
	// Kernel-side counts no record attributes: the ring buffer's losses,
	// and accesses counted over a full rate table (none with one key, but
	// they belong in the books).
	lost, full := 0, 0
	for _, r := range readAudit(t, st.auditFiles[len(st.auditFiles)-1]) {
		if r.Event == audit.EventAuditLoss && r.Loss != nil {
			lost += int(r.Loss.RingbufLost)
			full += int(r.Loss.RateFull[audit.DecisionDenied])
		}
	}
	t.Logf("storm: %d denied opens in %s; %d records + %d suppressed + %d lost + %d rate_full; agent CPU %.2fs, RSS %d KiB -> %d KiB (peak %d KiB)",
		n, dur.Round(time.Millisecond), a, b, lost, full, after.cpu-before.cpu, before.rss, after.rss, after.hwm)
	if a+b+lost+full != n {
		t.Errorf("records %d + suppressed %d + lost %d + rate_full %d = %d, want exactly %d", a, b, lost, full, a+b+lost+full, n)
	}
	if after.rss > 200*1024 {
		t.Errorf("agent RSS %d KiB after the storm", after.rss)
	}
}

type stats struct {
	cpu      float64
	rss, hwm int
}

func procStats(t *testing.T, pid int) stats {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
	ut, _ := strconv.Atoi(f[11])
	stt, _ := strconv.Atoi(f[12])
	var s stats
	s.cpu = float64(ut+stt) / 100
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(st), "\n") {
		fs := strings.Fields(l)
		if len(fs) >= 2 && fs[0] == "VmRSS:" {
			s.rss, _ = strconv.Atoi(fs[1])
		}
		if len(fs) >= 2 && fs[0] == "VmHWM:" {
			s.hwm, _ = strconv.Atoi(fs[1])
		}
	}
	return s
}

// TestPrivilegedAuditFullFilesystem: with the audit file on a full
// filesystem, enforcement is unaffected, nothing crashes, and the loss is
// counted and reported once space returns.
func TestPrivilegedAuditFullFilesystem(t *testing.T) {
	st := get(t)
	dir := filepath.Join(st.c.Root(), "auditfs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "gpufence-e2e-audit", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	defer func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	}()
	file := filepath.Join(dir, "audit.jsonl")
	st.agent.Stop()
	if err := st.startAgent(agentOpts{auditFile: file}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		st.agent.Stop()
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
	}()
	// Fill the filesystem.
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 60<<10), 0o644); err == nil || !strings.Contains(err.Error(), "no space") {
		fi, _ := os.Stat(filler)
		t.Logf("filler: %v (size %v)", err, fi.Size())
	}
	// Denied opens while full: still denied, agent still alive.
	for range 3 {
		rep, r := st.srun(t, nil, "--gres=gpu:1")
		mustOK(t, r)
		st.expectGPUs(t, rep, gpusOf(t, rep, "SLURM_STEP_GPUS"))
	}
	if !st.agent.Alive() {
		t.Fatal("agent died with its audit file on a full filesystem")
	}
	os.Remove(filler)
	rep, r := st.srun(t, nil, "--gres=gpu:1")
	mustOK(t, r)
	job := jobOf(t, rep)
	var loss []audit.Record
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		loss = loss[:0]
		found := false
		for _, r := range readAudit(t, file) {
			if r.Event == audit.EventAuditLoss && r.Loss != nil && r.Loss.SinkFailed["file"] > 0 {
				loss = append(loss, r)
			}
			found = found || r.JobID == job
		}
		if len(loss) > 0 && found {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(loss) == 0 {
		fi, _ := os.Stat(file)
		df, _ := exec.Command("df", "-k", dir).CombinedOutput()
		t.Fatalf("no audit_loss record for the file sink after space returned (file %v bytes; %s):\n%s\nagent log:\n%s", fi.Size(), df, tailFile(file), tailFile(st.agent.Log))
	}
	t.Logf("loss reported: %s", loss[0].Message)
}

func tailFile(p string) string {
	b, _ := os.ReadFile(p)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n")
}

func max0(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}
