// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const impostorEnv = "GPUFENCE_TEST_IMPOSTOR_SOCKET"

// impostor, in a child running as nobody, listens on the socket and
// accepts forever: what a process squatting on the agent's path would do.
func impostor(path string) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Stdout.WriteString("ready\n")
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(0)
		}
		go func() { c.Write([]byte{0}); time.Sleep(time.Minute) }()
	}
}

// The plugin trusts only a root listener: a socket bound by another user
// is refused with a message naming gpufence, as a refusal (never a reason
// for failure=open to let the step run).
func TestPrivilegedNonRootListenerRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs the listener as another user")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	for d := filepath.Dir(dir); d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			os.Chmod(d, fi.Mode().Perm()|0o001)
		}
	}
	sock := filepath.Join(dir, "agent.sock")
	bin := filepath.Join(dir, "goclient.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), impostorEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("impostor: %q", line)
	}
	_, err = stepStart(sock, 2*time.Second, 7, 0, 2001, ptr("0"), nil)
	code, text := outcome(err)
	if code != codeRefused || !strings.Contains(text, "not root") || !strings.Contains(text, "gpufence") || !strings.Contains(text, "uid 65534") {
		t.Errorf("step start against a nobody listener: code %d, %q; want a refusal naming gpufence and the uid", code, text)
	}
}

func TestMain(m *testing.M) {
	if p := os.Getenv(impostorEnv); p != "" {
		impostor(p)
	}
	os.Exit(m.Run())
}
