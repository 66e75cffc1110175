// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	osuser "os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/verify"
	"github.com/gpufence/gpufence/tests/cluster"
)

// plantScope is the attack of issue 18 (2): a user with a systemd login
// session owns user@UID.service (systemd chowns it to them, Delegate=yes)
// and makes <node>_slurmstepd.scope in it. The test makes the delegated
// cgroup as systemd would (only the parts that do not exist, removed at the
// end); the job user makes the scope themselves.
func (st *suite) plantScope(t *testing.T) string {
	t.Helper()
	mount, err := jobcgroup.Mountpoint()
	if err != nil {
		t.Fatal(err)
	}
	u, err := osuser.Lookup(user)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	svc := filepath.Join("user.slice", "user-"+u.Uid+".slice", "user@"+u.Uid+".service")
	var made []string
	p := mount
	for _, part := range strings.Split(svc, "/") {
		p = filepath.Join(p, part)
		if _, err := os.Stat(p); err == nil {
			if part == filepath.Base(svc) {
				t.Fatalf("%s exists already: not the test's to use", p)
			}
			continue
		}
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		made = append(made, p)
	}
	if err := os.Chown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(p, st.c.Hostname()+"_slurmstepd.scope")
	t.Cleanup(func() {
		rm := []string{dir}
		for i := len(made) - 1; i >= 0; i-- {
			rm = append(rm, made[i])
		}
		for _, d := range rm {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				t.Errorf("remove the planted cgroup %s: %v", d, err)
			}
		}
	})
	mustOK(t, st.c.Run(st.ctx, user, "mkdir", dir))
	var sb syscall.Stat_t
	if err := syscall.Stat(dir, &sb); err != nil || int(sb.Uid) != uid {
		t.Fatalf("planted %s: owner %d, err %v; want the job user's %d", dir, sb.Uid, err, uid)
	}
	t.Logf("planted %s (owner %s, uid %d)", dir, user, uid)
	return dir
}

// defaultVerify runs `gpufence verify --json` as an operator would, with
// no --scope: the scope is found by the agent's own rule.
func (st *suite) defaultVerify(t *testing.T, args ...string) verify.Report {
	t.Helper()
	cfg := filepath.Join(st.c.Root(), "etc", fmt.Sprintf("agent-%d.yaml", st.starts))
	cmd := exec.CommandContext(st.ctx, st.gpufence, append([]string{"verify", "--json", "--config", cfg, "--socket", st.sock}, args...)...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+st.c.SlurmConf())
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	var r verify.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("gpufence verify --json %v: %v\n%s", args, err, out)
	}
	for _, c := range r.Checks {
		t.Logf("  verify %v: ok=%v %s: %s", args, c.OK, c.Name, c.Detail)
	}
	return r
}

// programsOn counts the device programs attached to cgroup dir.
func programsOn(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		t.Fatal(err)
	}
	return len(res.Programs)
}

// heldStep starts an srun gpu:1 step of a job named name that tells it
// runs (a file it makes), then waits for the go-file before probing: a
// step registered with the agent before whatever the test does next.
func (st *suite) heldStep(t *testing.T, name string) (id uint32, gpus []int, proceed func() cluster.OpenReport) {
	t.Helper()
	dir := filepath.Join(st.c.Root(), "work", name)
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777) // the job user makes its marker here
	ready, goFile := filepath.Join(dir, "ready"), filepath.Join(dir, "go")
	script := fmt.Sprintf("touch %s; %s exec %s -env %s", ready, waitFor(goFile), st.open, strings.Join(st.paths(), " "))
	done := make(chan cluster.Result, 1)
	go func() { done <- st.c.Run(st.ctx, user, "srun", "--gres=gpu:1", "-J", name, "sh", "-c", script) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("step %s ended before it ran: %s", name, r)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("step %s not running after 60s", name)
		}
	}
	id, ok := st.jobNamed(t, name)
	if !ok {
		t.Fatalf("no running job named %s", name)
	}
	gpus = st.allocated(t)[id]
	return id, gpus, func() cluster.OpenReport {
		if err := os.WriteFile(goFile, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		r := <-done
		mustOK(t, r)
		return cluster.ParseOpen(r.Stdout)
	}
}

// TestPrivilegedPlantedScopeE2E: the job user plants
// <node>_slurmstepd.scope in their own delegated cgroup (user@UID.service).
// At the agent's next start (a package upgrade restarts it) and at the
// next re-creation of Slurm's scope, the filter stays on Slurm's scope: a
// running gpu:1 step opens exactly its GPU, not those of the job holding
// the other three; new steps work; nothing is attached to the planted
// cgroup; `gpufence verify` passes against Slurm's scope as found and
// fails against the planted one; status and the agent's log name it.
func TestPrivilegedPlantedScopeE2E(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	realScope := st.c.ScopeDir()
	planted := st.plantScope(t)
	agentLog := st.c.LogPath("gpufence.log")

	checkAfter := func(t *testing.T, victim uint32) {
		t.Helper()
		held := st.allocated(t)[victim]
		rep, r := st.srun(t, nil, "--gres=gpu:1")
		mustOK(t, r)
		got := st.allocatedOf(t, rep)
		if slices.Contains(held, got[0]) {
			t.Fatalf("Slurm gave GPU %d, which job %d holds (%v)", got[0], victim, held)
		}
		st.expectGPUs(t, rep, got)
		if n := programsOn(t, planted); n != 0 {
			t.Errorf("%d device program(s) attached to the planted %s", n, planted)
		}
		v := st.defaultVerify(t)
		if !v.OK || v.Scope != realScope {
			t.Errorf("gpufence verify: ok=%v scope %s (want %s), failed %q", v.OK, v.Scope, realScope, v.Failed)
		}
		if c, _ := checkNamedE2E(v, "slurm"); !c.OK {
			t.Errorf("verify's slurm check: %+v", c)
		}
		pv := st.defaultVerify(t, "--scope", planted)
		if c, _ := checkNamedE2E(pv, "scope"); pv.OK || !strings.Contains(c.Detail, "a user's own cgroup subtree") {
			t.Errorf("gpufence verify --scope %s: ok=%v, scope check %+v", planted, pv.OK, c)
		}
		out, _ := st.status(t)
		var s struct {
			Problems []string `json:"problems"`
			Filter   struct {
				SlurmScope    string `json:"slurm_scope"`
				IgnoredScopes []struct {
					Path    string `json:"path"`
					Refused string `json:"refused"`
				} `json:"ignored_scopes"`
			} `json:"filter"`
		}
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("gpufence status --json: %v\n%s", err, out)
		}
		ignored := false
		for _, c := range s.Filter.IgnoredScopes {
			ignored = ignored || (c.Path == planted && strings.Contains(c.Refused, "a user's own cgroup subtree"))
		}
		if s.Filter.SlurmScope != realScope || !ignored {
			t.Errorf("gpufence status: slurm_scope %q, ignored %+v; want %s and the planted %s", s.Filter.SlurmScope, s.Filter.IgnoredScopes, realScope, planted)
		}
		for _, p := range s.Problems {
			if strings.HasPrefix(p, "scope:") || strings.Contains(p, "but Slurm's scope") {
				t.Errorf("gpufence status problem: %s", p)
			}
		}
		for _, rec := range readAudit(t, st.auditFiles[len(st.auditFiles)-1]) {
			if strings.Contains(rec.Cgroup, "user.slice") {
				t.Errorf("audit record on the planted scope: %+v", rec)
			}
		}
	}

	t.Run("agent start", func(t *testing.T) {
		victim := st.allocate(t, user, "--gres=gpu:3")
		attacker, mine, probe := st.heldStep(t, "scope-attacker")
		t.Logf("victim job %d holds %v; the attacker's job %d holds %v", victim, st.allocated(t)[victim], attacker, mine)
		off := fileSize(agentLog)
		if err := st.agent.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
		rep := probe()
		st.expectGPUs(t, rep, mine)
		if l := logSince(agentLog, off); !strings.Contains(l, "is not Slurm's; ignored") || !strings.Contains(l, planted) {
			t.Errorf("the agent did not log the planted scope as ignored:\n%s", l)
		}
		checkAfter(t, victim)
		st.c.Run(st.ctx, "", "scancel", strconv.FormatUint(uint64(victim), 10))
	})

	t.Run("scope re-creation", func(t *testing.T) {
		st.waitIdle(t)
		off := fileSize(agentLog)
		before, after, err := st.c.RecreateScopeThen(st.ctx, func() error {
			// Held until the agent's reconcile met the node without
			// Slurm's scope and only the planted one named like it.
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				l := logSince(agentLog, off)
				if strings.Contains(l, "Slurm's scope is gone") || strings.Contains(l, "re-attached") {
					return nil
				}
				time.Sleep(100 * time.Millisecond)
			}
			return errors.New("the agent logged no reconcile of the removed scope in 30s")
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("scope %s: cgroup %d → %d", realScope, before, after)
		victim := st.allocate(t, user, "--gres=gpu:3")
		checkAfter(t, victim)
		found := false
		for _, rec := range readAudit(t, st.auditFiles[len(st.auditFiles)-1]) {
			found = found || (rec.Event == audit.EventFilterReattached && rec.CgroupID == after && rec.Cgroup == realScope)
		}
		if !found {
			t.Errorf("no filter_reattached record for Slurm's new scope %d", after)
		}
		st.c.Run(st.ctx, "", "scancel", strconv.FormatUint(uint64(victim), 10))
	})
}

func checkNamedE2E(r verify.Report, id string) (verify.Check, bool) {
	for _, c := range r.Checks {
		if c.ID == id {
			return c, true
		}
	}
	return verify.Check{}, false
}
