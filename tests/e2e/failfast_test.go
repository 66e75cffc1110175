// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// failfastTimeout is the plugstack timeout= of TestPrivilegedFailFast;
// GPUFENCE_FAILFAST_TIMEOUT overrides it (the figures in docs were measured
// with 5, the default).
func failfastTimeout(t *testing.T) int {
	if v := os.Getenv("GPUFENCE_FAILFAST_TIMEOUT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GPUFENCE_FAILFAST_TIMEOUT=%q", v)
		}
		return n
	}
	return 2
}

// TestPrivilegedFailFast: with the agent absent, refusing connections,
// accepting none (SIGSTOP) or crash-looping behind a socket held for it (as
// systemd holds gpufence.socket), a GPU step fails with the gpufence
// message within 1.5 × timeout in all, and a new job as a whole (its
// prolog, extern step and step: three processes) within 1.5 × timeout +
// 1 s, since once one exchange on the node waited its timeout for nothing
// the others make one short try (spank/plugin/client.c, <socket>.hung).
// Once the agent answers again the next step works at once.
func TestPrivilegedFailFast(t *testing.T) {
	st := get(t)
	st.waitIdle(t)
	timeout := failfastTimeout(t)
	budget := time.Duration(timeout) * 1500 * time.Millisecond
	// srun and slurmstepd's own start; measured here at 0.2-0.4 s.
	const slack = 2 * time.Second
	// A whole new job, Slurm's own start included.
	jobBound := time.Duration(timeout)*1500*time.Millisecond + time.Second
	sock := filepath.Join(st.c.Root(), "run", "failfast.sock")
	line := strings.Join([]string{"required", st.plugin, "socket=" + sock, fmt.Sprintf("timeout=%d", timeout)}, " ")
	if err := st.c.WritePlugstack([]string{line}); err != nil {
		t.Fatal(err)
	}
	// slurmd reads the plugstack for the job prolog at its start.
	if err := st.c.RestartSlurmd(false); err != nil {
		t.Fatal(err)
	}
	defer func() {
		os.Remove(sock)
		os.Remove(sock + ".hung")
		if err := st.c.WritePlugstack([]string{st.plugstackLine()}); err != nil {
			t.Fatal(err)
		}
		st.waitIdle(t)
		if err := st.c.RestartSlurmd(false); err != nil {
			t.Fatal(err)
		}
		rep, r := st.srun(t, nil, "--gres=gpu:1")
		mustOK(t, r)
		st.expectGPUs(t, rep, st.allocatedOf(t, rep))
		// The holding jobs' epilogs could not reach the agent: it drops
		// their records once slurmctld says they ended (reconcile, after
		// EndCheckFirst). Later tests expect no job left behind.
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			left, _ := os.ReadDir(st.jobMapDir)
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("jobs whose epilog missed the agent still mapped after 90 s: %v", left)
				break
			}
		}
	}()

	work := filepath.Join(st.c.Root(), "work")
	kinds := []struct {
		name        string
		setup, undo func(t *testing.T)
	}{
		{"agent absent (no socket)", func(*testing.T) { os.Remove(sock) }, func(*testing.T) {}},
		{"refusing connections (socket, no listener)", func(t *testing.T) {
			os.Remove(sock)
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			l.Close() // the file stays: connect gets ECONNREFUSED
		}, func(*testing.T) { os.Remove(sock) }},
		{"agent stopped (SIGSTOP)", func(t *testing.T) {
			os.Remove(sock)
			if err := os.Symlink(st.sock, sock); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(st.agent.PID, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		}, func(t *testing.T) {
			if err := syscall.Kill(st.agent.PID, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			os.Remove(sock)
		}},
	}
	// Crash-looping behind a held socket: "systemd" (the test) holds the
	// listening socket and starts an agent on it every 100 ms, which
	// exits at once (its configuration is broken).
	var loop *exec.Cmd
	var held *os.File
	kinds = append(kinds, struct {
		name        string
		setup, undo func(t *testing.T)
	}{"crash-looping behind a held socket", func(t *testing.T) {
		os.Remove(sock)
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		if held, err = l.(*net.UnixListener).File(); err != nil {
			t.Fatal(err)
		}
		l.Close()
		bad := filepath.Join(st.c.Root(), "etc", "agent-broken.yaml")
		if err := os.WriteFile(bad, []byte("no_such_key: 1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		stop := filepath.Join(work, "failfast-loop-stop")
		os.Remove(stop)
		loop = exec.Command("/bin/sh", "-c", `while [ ! -e "$2" ]; do sh -c 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" agent --config "$1"' "$0" "$1" 2>>"$3"; sleep 0.1; done`,
			st.gpufence, bad, stop, filepath.Join(st.c.Root(), "logs", "agent-crashloop.log"))
		loop.ExtraFiles = []*os.File{held}
		if err := loop.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { loop.Process.Kill(); loop.Wait() })
	}, func(t *testing.T) {
		os.WriteFile(filepath.Join(work, "failfast-loop-stop"), nil, 0o644)
		loop.Wait()
		held.Close()
		os.Remove(sock)
	}})

	var table []string
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			// An allocation made while the agent answers (its prolog
			// record is in place), for a step launched during the outage.
			os.Remove(sock)
			if err := os.Symlink(st.sock, sock); err != nil {
				t.Fatal(err)
			}
			marker := filepath.Join(work, fmt.Sprintf("failfast-hold-%d", time.Now().UnixNano()))
			r := st.c.Run(st.ctx, user, "sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "touch "+marker+"; sleep 300")
			mustOK(t, r)
			holder := strings.TrimSpace(r.Stdout)
			defer func() {
				st.c.Run(st.ctx, "", "scancel", holder)
				st.c.WaitJob(st.ctx, holder)
			}()
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if _, err := os.Stat(marker); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("holding job %s never ran its script", holder)
				}
			}
			os.Remove(sock)
			k.setup(t)
			undone := false
			defer func() {
				if !undone {
					k.undo(t)
				}
			}()

			// Each figure from a node that has not yet seen the agent
			// hang: the marker of an earlier measurement removed.
			hung := sock + ".hung"
			os.Remove(hung)
			// A new job: its prolog, its extern step and the step, three
			// processes; once one has waited its timeout, the others
			// fail fast.
			start := time.Now()
			r = st.c.Run(st.ctx, user, "srun", "--gres=gpu:1", st.open, st.c.DevPath(0))
			newJob := time.Since(start)
			if r.Code == 0 || !strings.Contains(r.Stderr, "gpufence") {
				t.Errorf("new GPU job with the agent %s: %s", k.name, r)
			}
			if newJob > jobBound {
				t.Errorf("new GPU job failed after %v, want within 1.5 × timeout + 1 s (%v)", newJob.Round(time.Millisecond), jobBound)
			}
			_, markerErr := os.Lstat(hung)
			hungSeen := markerErr == nil

			// A step in the running allocation: one exchange, one budget.
			os.Remove(hung)
			start = time.Now()
			r = st.c.Run(st.ctx, user, "srun", "--jobid="+holder, "--overlap", st.open, st.c.DevPath(0))
			step := time.Since(start)
			if r.Code == 0 || !strings.Contains(r.Stderr, "gpufence") {
				t.Errorf("step in an allocation with the agent %s: %s", k.name, r)
			}
			if step > budget+slack {
				t.Errorf("step in an allocation failed after %v, want within 1.5 × timeout (%v) plus %v for srun", step.Round(time.Millisecond), budget, slack)
			}
			// A batch job: prolog, extern step, batch step refused, epilog.
			// Started once the new job's epilog (one more wait) is done.
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				q := st.c.Run(st.ctx, "", "squeue", "-h", "-o", "%i")
				if strings.TrimSpace(q.Stdout) == holder {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("jobs other than %s still in squeue: %s", holder, q.Stdout)
				}
			}
			os.Remove(hung)
			start = time.Now()
			id, err := st.c.Sbatch(st.ctx, user, "--gres=gpu:1", "-o", filepath.Join(work, "failfast-%j.out"), "--wrap", st.open+" "+st.c.DevPath(0))
			if err != nil {
				t.Fatal(err)
			}
			state, err := st.c.WaitJob(st.ctx, id)
			job := time.Since(start)
			out, _ := os.ReadFile(filepath.Join(work, "failfast-"+id+".out"))
			if err != nil || state != "FAILED" || !strings.Contains(string(out), "gpufence") {
				t.Errorf("batch job %s with the agent %s: %q %v\n%s", id, k.name, state, err, out)
			}
			if job > budget+2*slack {
				t.Errorf("batch job ended after %v, want within 1.5 × timeout (the prolog's; extern, batch step and epilog fail fast) plus slack", job.Round(time.Millisecond))
			}

			// The agent answers again: the next step uses it at once,
			// though the node saw it hang a moment ago.
			k.undo(t)
			undone = true
			os.Remove(sock)
			if err := os.Symlink(st.sock, sock); err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			var back time.Duration
			for {
				r = st.c.Run(st.ctx, user, "srun", "--jobid="+holder, "--overlap", st.open, st.c.DevPath(0))
				if r.Code == 0 {
					back = time.Since(start)
					break
				}
				if time.Since(start) > 45*time.Second {
					t.Fatalf("no step worked within 45 s of the agent answering again: %s", r)
				}
				time.Sleep(200 * time.Millisecond)
			}
			if back > budget+slack {
				t.Errorf("the first step after the agent answered again worked after %v, want within %v", back.Round(time.Millisecond), budget+slack)
			}
			if _, err := os.Lstat(hung); err == nil {
				t.Errorf("%s left after the agent answered", hung)
			}
			table = append(table, fmt.Sprintf("%-45s new job (srun) %6.2fs (bound %.1fs, marked hung: %v)   step in allocation %6.2fs   batch job to end %6.2fs   step after the agent is back %6.2fs",
				k.name, newJob.Seconds(), jobBound.Seconds(), hungSeen, step.Seconds(), job.Seconds(), back.Seconds()))
		})
	}
	t.Logf("timeout=%d (budget %v per exchange, %v per new job):\n%s", timeout, budget, jobBound, strings.Join(table, "\n"))
}
