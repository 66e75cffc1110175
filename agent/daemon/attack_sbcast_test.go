// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/bpf/devfilter"
	"golang.org/x/sys/unix"
)

// The open helper's uid switch (this file's init runs before
// daemon_test.go's, which opens): setresuid(uid, uid, 0), as slurmd's
// sbcast child does before it opens the destination.
func init() {
	s := os.Getenv("GPUFENCE_TEST_RESUID")
	if s == "" {
		return
	}
	uid, err := strconv.Atoi(s)
	if err == nil {
		err = unix.Setresuid(uid, uid, 0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "setresuid %q: %v\n", s, err)
		os.Exit(2)
	}
}

// openAs is openNames of nvidia0 as uid (0: root) in cgroup dir.
func (tr *tree) openAs(dir string, uid int) string {
	tr.t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "GPUFENCE_TEST_OPEN="+filepath.Join(tr.dev, "nvidia0"), "GPUFENCE_TEST_RESUID="+strconv.Itoa(uid))
	var out []byte
	err := tr.inCgroup(dir, cmd, func() (err error) { out, err = cmd.CombinedOutput(); return err })
	if err != nil {
		tr.t.Fatalf("open helper as uid %d in %s: %v\n%s", uid, dir, err, out)
	}
	_, res, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	return res
}

// TestPrivilegedSlurmdServiceOutsideScope is issue 18's attack 6 where
// production has it: slurmd under systemd in slurmd.service, beside the
// scope, where the child slurmd forks for sbcast drops to the job's user
// and opens the destination. The agent finds slurmd's cgroup by the root
// slurmd process in it whose pid is in SlurmdPidFile (a stand-in: a copy
// of sleep named slurmd; another outside the scope is not this node's), puts
// the filter there with a root-only entry at start, so root keeps the GPU
// (ENXIO) and a process there as a user is refused it (EPERM) and audited
// as a non-root process in that cgroup; when the cgroup is made again (a
// slurmd restart under systemd) the filter is on the new one with no
// reconcile pass, from the watch on its parent, and audited as
// re-attached.
func TestPrivilegedSlurmdServiceOutsideScope(t *testing.T) {
	tr := newTree(t)
	if m, _ := devfilter.Probe(); m != devfilter.ModeScope {
		t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", m)
	}
	// The helper re-executed as nobody must reach the test binary and the
	// fake nodes.
	for _, p := range []string{filepath.Dir(os.Args[0]), tr.dev, filepath.Dir(tr.dev)} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// mknod's mode went through the umask; the driver's nodes are 0666.
	if err := os.Chmod(filepath.Join(tr.dev, "nvidia0"), 0o666); err != nil {
		t.Fatal(err)
	}
	svc := filepath.Join(tr.root, "system.slice", "slurmd.service")
	if err := os.Mkdir(svc, 0o755); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	if got := tr.openAs(svc, nobody); got != "ENXIO" {
		t.Fatalf("before the agent, a user's process in slurmd.service: nvidia0 %s, want ENXIO (nothing narrows it)", got)
	}
	// This node's slurmd is the one its SlurmdPidFile names: the
	// machine's other Slurms' are not this node's to narrow.
	pidFile := filepath.Join(tr.t.TempDir(), "slurmd.pid")
	conf := filepath.Join(tr.gres, "slurm.conf")
	if err := os.WriteFile(conf, []byte("TaskPlugin=task/affinity,task/cgroup\nSlurmdPidFile="+pidFile+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writePid := func(cmd *exec.Cmd) {
		t.Helper()
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Another root slurmd outside the scope, not this node's: left alone.
	other := filepath.Join(tr.root, "system.slice", "other-slurmd.service")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	tr.slurmProc("slurmd", other)
	sd := tr.slurmProc("slurmd", svc)
	writePid(sd)
	d, _ := tr.daemonWith(devfilter.ModeScope, func(c *config.Config) {
		// Only the watch may re-attach below, never a periodic pass.
		c.ReconcileInterval = config.Duration{Duration: time.Hour}
	})
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-runDone })

	narrowed := func(what string) {
		t.Helper()
		if got := tr.openAs(svc, 0); got != "ENXIO" {
			t.Errorf("%s: root in slurmd.service (slurmd's NVML): nvidia0 %s, want ENXIO", what, got)
		}
		if got := tr.openAs(svc, nobody); got != "EPERM" {
			t.Errorf("%s: uid %d in slurmd.service (sbcast's child): nvidia0 %s, want EPERM", what, nobody, got)
		}
	}
	narrowed("at start")
	if got := tr.openAs(other, nobody); got != "ENXIO" {
		t.Errorf("uid %d beside another Slurm's slurmd: nvidia0 %s, want ENXIO (not this node's cgroup)", nobody, got)
	}
	_, id := d.enf.Slurmd()
	waitRecord(t, tr, "the denial in slurmd.service", func(r audit.Record) bool {
		return r.Event == audit.EventGPUAccess && r.Decision == audit.DecisionDenied && r.CgroupID == id &&
			r.Reason == audit.ReasonNonRootInSlurmCgroup && strings.Contains(r.Message, "system.slice/slurmd.service cgroup") &&
			r.UID != nil && *r.UID == nobody
	})
	// A task in the scope cgroup's own job tree is no better off: an
	// unregistered job is denied, root or not.
	if got := tr.openAs(tr.mkdir("job_9/step_0/user/task_0"), 0); got != "EPERM" {
		t.Errorf("root in an unregistered job: nvidia0 %s, want EPERM", got)
	}

	// systemctl restart slurmd: the unit's cgroup is removed and made anew.
	sd.Process.Kill()
	sd.Wait()
	if err := unix.Rmdir(svc); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(svc, 0o755); err != nil {
		t.Fatal(err)
	}
	newID := tr.cgroupID(svc)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, on := d.enf.Slurmd(); on == newID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the filter is not on slurmd.service made again (cgroup %d) 5s later", newID)
		}
		time.Sleep(5 * time.Millisecond)
	}
	writePid(tr.slurmProc("slurmd", svc))
	narrowed("after slurmd.service was made again")
	waitRecord(t, tr, "the re-attach", func(r audit.Record) bool {
		return r.Event == audit.EventFilterReattached && r.CgroupID == newID && r.Cgroup == svc
	})
}

func (tr *tree) cgroupID(dir string) uint64 {
	tr.t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		tr.t.Fatal(err)
	}
	return st.Ino
}

// waitRecord waits up to 5s for a record the agent emits asynchronously
// (the event reader's) that matches.
func waitRecord(t *testing.T, tr *tree, what string, match func(audit.Record) bool) audit.Record {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, ev := range []audit.Event{audit.EventGPUAccess, audit.EventFilterReattached} {
			for _, r := range tr.rec.Records(ev) {
				if match(r) {
					return r
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audit record for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
