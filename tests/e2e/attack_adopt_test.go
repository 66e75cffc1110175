// SPDX-License-Identifier: Apache-2.0

package e2e

import (
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

// floodSlow is how long the flood must make a full `squeue --json` take:
// past the 3 s that the agent before issue 18 gave every question to
// slurmctld at adoption, so that the attack is the one the issue describes.
const floodSlow = 4 * time.Second

// floodMax bounds the held jobs (slurm.conf's MaxJobCount is 10,000).
const floodMax = 9000

// hammers is how many listings of the flood the attacker keeps running at
// once while the agent starts.
const hammers = 6

// TestPrivilegedAttackAdoptSlowSlurmctld is issue 18's third attack. The
// agent loses its records while the attacker's gpu:1 job runs, probing
// every GPU, and another user's job holds the other three. The attacker
// floods slurmctld with held jobs whose names, comments and output paths
// are long strings of bytes JSON must escape, until a full `squeue --json`
// takes longer than the agent used to wait, and the agent restarts. The
// attacker's job must never open a GPU it was not given: not at adoption,
// not 20 s later, not after the held jobs are cancelled; once slurmctld is
// quick again the job is held to exactly its own GPU. The expected GPUs
// come from slurmctld's JSON (allocated), never from the attacker.
func TestPrivilegedAttackAdoptSlowSlurmctld(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	work := filepath.Join(st.c.Root(), "work")
	stamp := time.Now().UnixNano()
	stop := filepath.Join(work, fmt.Sprintf("slowadopt-stop-%d", stamp))
	probe := filepath.Join(work, fmt.Sprintf("slowadopt-probe-%d", stamp))
	floodIDs := filepath.Join(work, fmt.Sprintf("slowadopt-flood-%d.ids", stamp))
	var attacker string
	var victim uint32
	cancelFlood := func() {
		b, _ := os.ReadFile(floodIDs)
		ids := strings.Fields(string(b))
		for len(ids) > 0 {
			n := min(len(ids), 1000)
			st.c.Run(st.ctx, "", "scancel", ids[:n]...)
			ids = ids[n:]
		}
	}
	defer func() {
		os.WriteFile(stop, nil, 0o644)
		cancelFlood()
		for _, id := range []string{attacker, fmt.Sprint(victim)} {
			if id != "" && id != "0" {
				st.c.Run(st.ctx, "", "scancel", id)
			}
		}
		st.waitIdle(t)
		if !st.agent.Alive() {
			if err := st.startAgent(); err != nil {
				t.Fatal(err)
			}
		}
	}()

	victim = st.allocate(t, "", "--gres=gpu:3", "-J", "victim")
	script := fmt.Sprintf("#!/bin/sh\nexec %s -stamp -until %s -sleep 10ms %s > %s\n", st.open, stop, strings.Join(st.c.DevPaths(), " "), probe)
	sh := filepath.Join(work, "slowadopt.sh")
	if err := os.WriteFile(sh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	if attacker, err = st.c.Sbatch(st.ctx, user, "--gres=gpu:1", "-J", "attacker", "-o", "/dev/null", sh); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, _ := os.ReadFile(probe); len(b) > 2000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the attacker's job %s never probed", attacker)
		}
		time.Sleep(50 * time.Millisecond)
	}
	aid, _ := strconv.ParseUint(attacker, 10, 32)
	alloc := st.allocated(t)
	mine, theirs := alloc[uint32(aid)], alloc[victim]
	if len(mine) != 1 || len(theirs) != 3 || slices.ContainsFunc(mine, func(g int) bool { return slices.Contains(theirs, g) }) {
		t.Fatalf("Slurm allocated %v to the attacker and %v to the victim; want 1 and 3 disjoint GPUs", mine, theirs)
	}
	t.Logf("Slurm %s: attacker's job %s holds GPU %v, victim's job %d GPUs %v", st.c.Release(), attacker, mine, victim, theirs)

	// The flood, as the job user: held jobs whose strings are as long as
	// slurmctld takes and made of a byte JSON escapes as six.
	n, took, size := 0, time.Duration(0), 0
	flood := filepath.Join(work, "slowadopt-flood.sh")
	floodScript := `#!/bin/bash
s=$(head -c 1000 /dev/zero | tr '\0' '\001')
p=/tmp/$(head -c 3800 /dev/zero | tr '\0' '\001')
for i in $(seq 1 $1); do
	sbatch --parsable -H -J "f$s" --comment "$s" -o "$p" -e "$p" --wrap true >> "$2" || exit 1
done
`
	if err := os.WriteFile(flood, []byte(floodScript), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(floodIDs, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(floodIDs, 0o666)
	t0 := time.Now()
	for n < floodMax {
		// Two submitters at once: the node has two cores.
		done := make(chan error, 2)
		for range 2 {
			go func() {
				r := st.c.Run(st.ctx, user, flood, "500", floodIDs)
				if r.Code != 0 {
					done <- fmt.Errorf("%s", r)
					return
				}
				done <- nil
			}()
		}
		for range 2 {
			if err := <-done; err != nil {
				t.Fatalf("flood: %v", err)
			}
		}
		n += 1000
		took, size = st.squeueJSON(t)
		t.Logf("%d held jobs: squeue --json took %v and printed %d bytes", n, took.Round(time.Millisecond), size)
		if took > floodSlow {
			break
		}
	}
	if took <= floodSlow {
		t.Fatalf("%d held jobs make squeue --json take only %v: not the attack", n, took)
	}
	t.Logf("flood: %d held jobs submitted in %v; squeue --json %v, %d bytes", n, time.Since(t0).Round(time.Second), took.Round(time.Millisecond), size)

	// While the agent starts, the job user also keeps slurmctld busy:
	// listings of the flood, several at once, each seconds of slurmctld's
	// time, so that even one job's question waits.
	hammerStop := filepath.Join(work, fmt.Sprintf("slowadopt-hammer-stop-%d", stamp))
	hammer := filepath.Join(work, "slowadopt-hammer.sh")
	if err := os.WriteFile(hammer, []byte(fmt.Sprintf("#!/bin/sh\nfor i in $(seq 1 %d); do\n\t(while [ ! -e %s ]; do squeue --json >/dev/null 2>&1; done) &\ndone\nwait\n", hammers, hammerStop)), 0o755); err != nil {
		t.Fatal(err)
	}
	hammered := make(chan cluster.Result, 1)
	go func() { hammered <- st.c.Run(st.ctx, user, hammer) }()
	stopHammer := func() time.Duration {
		t0 := time.Now()
		os.WriteFile(hammerStop, nil, 0o644)
		if hammered != nil {
			<-hammered
			hammered = nil
		}
		return time.Since(t0)
	}
	defer stopHammer()
	time.Sleep(2 * time.Second) // the listings under way

	// Records lost; the agent starts with the flood in place.
	tStart := time.Now()
	st.killAgentLoseState(t, agentOpts{})
	ready := time.Now()
	auditFile := st.auditFiles[len(st.auditFiles)-1]
	t.Logf("agent ready %v after its start", ready.Sub(tStart).Round(time.Millisecond))
	for _, id := range []uint32{uint32(aid), victim} {
		for _, r := range st.waitRecords(t, id, func(rs []audit.Record) bool {
			return slices.ContainsFunc(rs, func(r audit.Record) bool { return r.Event == audit.EventJobAdopted })
		}) {
			if r.Event == audit.EventJobAdopted {
				t.Logf("adoption of job %d: %s, GPUs %v, mode %q: %s", id, r.Severity, r.GPUs, r.PolicyMode, r.Message)
			}
		}
	}

	// 20 s with the flood and the listings, then the listings stopped and
	// the flood cancelled.
	time.Sleep(20 * time.Second)
	tFlood := time.Now()
	t.Logf("%d concurrent listings stopped (%v to end)", hammers, stopHammer().Round(time.Millisecond))
	cancelFlood()
	deadline = time.Now().Add(2 * time.Minute)
	for {
		r := st.c.Run(st.ctx, "", "squeue", "-h", "-u", user, "-t", "PENDING", "-o", "%i")
		if r.Code == 0 && strings.TrimSpace(r.Stdout) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the held jobs are still there: %s", r)
		}
		time.Sleep(500 * time.Millisecond)
	}
	took, size = st.squeueJSON(t)
	t.Logf("flood cancelled in %v: squeue --json %v, %d bytes (cancelled jobs stay listed for MinJobAge)", time.Since(tFlood).Round(time.Millisecond), took.Round(time.Millisecond), size)
	// A few reconcile passes (2 s) after the flood.
	time.Sleep(6 * time.Second)
	tEnd := time.Now()
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if state, err := st.c.WaitJob(st.ctx, attacker); err != nil || state != "COMPLETED" {
		t.Fatalf("attacker's job: %q %v", state, err)
	}

	// slurmctld's confirmation of each job, from the audit trail: the
	// attacker's with its one GPU, the victim's with its three.
	confirmed := map[uint32]time.Time{}
	for _, r := range readAudit(t, auditFile) {
		want, ok := map[uint32][]int{uint32(aid): mine, victim: theirs}[r.JobID]
		if ok && r.Event == audit.EventJobAdopted && r.Severity == audit.SeverityInfo && slices.Equal(r.GPUs, want) {
			if _, seen := confirmed[r.JobID]; !seen {
				confirmed[r.JobID] = r.Time
			}
		}
	}
	for _, id := range []uint32{uint32(aid), victim} {
		if at, ok := confirmed[id]; !ok {
			t.Errorf("job %d was never confirmed by slurmctld with its GPUs", id)
		} else {
			t.Logf("job %d confirmed %v after the agent was ready", id, at.Sub(ready).Round(time.Millisecond))
		}
	}

	type window struct {
		name     string
		from, to time.Time
	}
	windows := []window{
		{"adopted, flood and listings (20 s)", ready, tFlood},
		{"flood cancelled", tFlood, tEnd},
	}
	var bad []string
	counts := make([]map[string]int, len(windows))
	for i := range counts {
		counts[i] = map[string]int{}
	}
	for _, l := range readProbe(t, probe) {
		gpu := slices.Index(st.c.DevPaths(), l.path)
		for i, w := range windows {
			if l.at.Before(w.from) || !l.at.Before(w.to) {
				continue
			}
			if slices.Contains(mine, gpu) {
				counts[i]["own "+l.result]++
				// Its own GPU may be denied until slurmctld confirms the
				// job, never after.
				if at, ok := confirmed[uint32(aid)]; ok && l.at.After(at) && l.result != "ENXIO" {
					bad = append(bad, fmt.Sprintf("%s: its own GPU %d gave %s at %s, after slurmctld confirmed it", w.name, gpu, l.result, l.at.Format(time.StampMicro)))
				}
				continue
			}
			counts[i]["foreign "+l.result]++
			if l.result != "EPERM" {
				bad = append(bad, fmt.Sprintf("%s: GPU %d (the victim's: %v) gave %s at %s", w.name, gpu, slices.Contains(theirs, gpu), l.result, l.at.Format(time.StampMicro)))
			}
		}
	}
	for i, w := range windows {
		t.Logf("attacker's job, %s: %v", w.name, counts[i])
		if counts[i]["foreign EPERM"]+counts[i]["foreign ENXIO"] == 0 || counts[i]["own ENXIO"]+counts[i]["own EPERM"] == 0 {
			t.Errorf("%s: too few probes: %v", w.name, counts[i])
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d wrong opens, first: %s", len(bad), strings.Join(bad[:min(len(bad), 5)], "; "))
	}
}

// squeueJSON times a full `squeue --json` as root, as the agent used to run
// it, and counts what it prints.
func (st *suite) squeueJSON(t *testing.T) (time.Duration, int) {
	t.Helper()
	bin, err := lookPath(st.c, "squeue")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(st.ctx, bin, "--json")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C", "SLURM_CONF=" + st.c.SlurmConf()}
	var counter countWriter
	cmd.Stdout = &counter
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("squeue --json: %v", err)
	}
	return time.Since(t0), counter.n
}

type countWriter struct{ n int }

func (w *countWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
