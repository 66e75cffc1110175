// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpufence/gpufence/tests/cluster"
)

// activated is an agent started the way systemd starts a socket-activated
// service: the listening socket, made by "systemd" (the test), is fd 3 with
// LISTEN_FDS=1 and LISTEN_PID set to the agent's own pid.
type activated struct {
	cmd *exec.Cmd
	log string
}

func (st *suite) startActivated(t *testing.T, sock *os.File) *activated {
	t.Helper()
	args, err := st.agentArgs()
	if err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(st.c.Root(), "logs", "agent-activated.log")
	out, err := os.OpenFile(log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	// exec keeps the shell's pid, so $$ is the agent's pid, as systemd sets it.
	cmd := exec.Command("/bin/sh", append([]string{"-c", `LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@"`, st.gpufence}, args...)...)
	cmd.ExtraFiles = []*os.File{sock}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &activated{cmd: cmd, log: log}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(log); strings.Count(string(b), "gpufence agent ready") > st.activatedStarts {
			st.activatedStarts++
			return a
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.kill()
	b, _ := os.ReadFile(log)
	t.Fatalf("activated agent never became ready:\n%s", tailLines(string(b), 20))
	return nil
}

func (a *activated) kill() {
	a.cmd.Process.Signal(syscall.SIGKILL)
	a.cmd.Wait()
}

// TestPrivilegedSocketActivation: with the agent's socket held by systemd, a
// step launched while the agent is down for less than the plugin's timeout
// starts once the agent is back; a longer outage fails the step with the
// clear message.
func TestPrivilegedSocketActivation(t *testing.T) {
	st := get(t)
	if err := st.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: st.sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(st.sock, 0o600)
	sock, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		sock.Close()
		ln.Close() // removes the socket file, as systemd does when the unit stops
		if err := st.startAgent(); err != nil {
			t.Fatal(err)
		}
	}()

	a := st.startActivated(t, sock)
	rep, r := st.srun(t, nil, "--gres=gpu:1")
	mustOK(t, r)
	st.expectGPUs(t, rep, gpusOf(t, rep, "SLURM_STEP_GPUS"))
	b, _ := os.ReadFile(a.log)
	if !strings.Contains(string(b), "socket_activated=true") {
		t.Fatalf("the agent did not take the activated socket:\n%s", tailLines(string(b), 20))
	}

	// Short outage: the step's requests wait in the socket's backlog.
	a.kill()
	type result struct {
		rep cluster.OpenReport
		r   cluster.Result
		d   time.Duration
	}
	done := make(chan result, 1)
	t0 := time.Now()
	go func() {
		rep, r := st.srun(t, nil, "--gres=gpu:1")
		done <- result{rep, r, time.Since(t0)}
	}()
	time.Sleep(2 * time.Second)
	a = st.startActivated(t, sock)
	res := <-done
	mustOK(t, res.r)
	st.expectGPUs(t, res.rep, gpusOf(t, res.rep, "SLURM_STEP_GPUS"))
	t.Logf("step launched during a 2 s outage finished after %s", res.d.Round(time.Millisecond))

	// Long outage: longer than the plugin's timeout (and its one retry).
	a.kill()
	t0 = time.Now()
	rep, r = st.srun(t, nil, "--gres=gpu:1")
	if r.Code == 0 || !strings.Contains(r.Stderr, "gpufence") {
		t.Errorf("step during a long outage: exit %d, stderr:\n%s", r.Code, r.Stderr)
	}
	if len(rep.Open) != 0 {
		t.Errorf("a task ran during the outage:\n%s", r.Stdout)
	}
	t.Logf("step during a long outage failed after %s: %s", time.Since(t0).Round(time.Millisecond), firstLine(r.Stderr, "gpufence"))
}

func firstLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
