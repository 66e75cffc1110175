// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a daemon the harness started in its own session. It is only
// ever signalled by its recorded PID, after checking that the PID still
// belongs to the process we started (same start time).
type Process struct {
	Name      string `json:"name"`
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // field 22 of /proc/<pid>/stat
	Log       string `json:"log"`

	done chan struct{} // closed when cmd.Wait returned; nil for a loaded state
}

// startProcess starts argv with setsid, stdout and stderr to logPath.
func startProcess(name, logPath string, env []string, cred *syscall.Credential, dir string, argv ...string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: cred}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, strings.Join(argv, " "), err)
	}
	p := &Process{Name: name, PID: cmd.Process.Pid, Log: logPath, done: make(chan struct{})}
	p.StartTime, _ = procStartTime(p.PID)
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// procStartTime reads a process's start time in clock ticks since boot.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// comm may hold spaces and parentheses: fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process %d is a zombie", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Alive reports whether the process we started still runs (a zombie or a
// reused PID counts as gone).
func (p *Process) Alive() bool {
	if p == nil || p.PID <= 0 {
		return false
	}
	if p.done != nil {
		select {
		case <-p.done:
			return false
		default:
		}
	}
	st, err := procStartTime(p.PID)
	return err == nil && (p.StartTime == 0 || st == p.StartTime)
}

// Stop sends SIGTERM, waits up to 10 s, then SIGKILL.
func (p *Process) Stop() error { return p.stop(10 * time.Second) }

func (p *Process) stop(grace time.Duration) error {
	if !p.Alive() {
		return nil
	}
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	if p.wait(grace) {
		return nil
	}
	_ = syscall.Kill(p.PID, syscall.SIGKILL)
	if p.wait(5 * time.Second) {
		return fmt.Errorf("%s (pid %d) ignored SIGTERM for %s, killed\n%s", p.Name, p.PID, grace, tail(p.Log, 20))
	}
	return fmt.Errorf("%s (pid %d) survived SIGKILL", p.Name, p.PID)
}

func (p *Process) wait(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !p.Alive() {
			return true
		}
		if p.done != nil {
			select {
			case <-p.done:
				return true
			case <-time.After(50 * time.Millisecond):
			}
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return !p.Alive()
}

// WaitSocket waits until a unix socket at path accepts a connection.
func WaitSocket(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for {
		var c net.Conn
		c, err = net.DialTimeout("unix", path, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("socket %s not ready after %s: %w", path, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitListener waits until the unix socket at path accepts a connection
// from a listener that pid made. A connect alone can land in the backlog
// of an agent that was just killed: until a child it was forking at that
// instant has exec'd, the child holds the old listener open. The peer
// credentials of a connected unix socket are the listener's (SO_PEERCRED).
func WaitListener(path string, pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for {
		err = listenerIs(path, pid)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("socket %s not served by pid %d after %s: %w", path, pid, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func listenerIs(path string, pid int) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	if int(cred.Pid) != pid {
		return fmt.Errorf("listener is pid %d, not %d", cred.Pid, pid)
	}
	return nil
}

// tail returns the last n lines of a file, labelled, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Sprintf("--- %s: absent", path)
		}
		return fmt.Sprintf("--- %s: %v", path, err)
	}
	return fmt.Sprintf("--- last lines of %s:\n%s", path, lastLines(string(b), n))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
