// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/status"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// writeConfig writes an agent configuration for status.
func writeConfig(t *testing.T, socket, pinDir, stateFile, scope string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.yaml")
	body := fmt.Sprintf("socket: %q\npin_dir: %q\nstate_file: %q\nnode_name: n1\n", socket, pinDir, stateFile)
	if scope != "" {
		body += fmt.Sprintf("scope: %q\n", scope)
	}
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeAgent listens on a socket and drops each connection.
func fakeAgent(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return p
}

// runStatus runs gpufence status with args.
func runStatus(args []string, stdout, stderr io.Writer) int {
	return run(append([]string{"status"}, args...), stdout, stderr)
}

func runStatusJSON(t *testing.T, args ...string) (status.Report, int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := runStatus(append(args, "--json"), &out, &errb)
	var r status.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("status --json (exit %d) printed no JSON: %v\n%s\n%s", code, err, out.String(), errb.String())
	}
	return r, code, out.String()
}

func TestRunStatusUsage(t *testing.T) {
	var out, errb bytes.Buffer
	for _, args := range [][]string{{"--bogus"}, {"extra"}, {"--config", filepath.Join(t.TempDir(), "missing.yaml")}} {
		if code := runStatus(args, &out, &errb); code != 2 {
			t.Errorf("status %q: exit %d, want 2", args, code)
		}
	}
	if code := runStatus([]string{"--help"}, &out, &errb); code != 0 {
		t.Errorf("--help: exit %d", code)
	}
}

func TestRunStatusFiles(t *testing.T) {
	sock := fakeAgent(t)
	state := filepath.Join(t.TempDir(), "state.json")
	cfg := writeConfig(t, sock, "", state, "")
	r, code, _ := runStatusJSON(t, "--config", cfg)
	if os.Geteuid() != 0 {
		// The fake agent listens as this user, not as root: not the agent.
		if code != 1 || r.OK || !r.Agent.Listening || r.Agent.Untrusted == "" {
			t.Fatalf("listener of uid %d: exit %d: %+v", os.Geteuid(), code, r)
		}
		return
	}
	if code != 0 || !r.OK || !r.Agent.Listening || r.Agent.PID != os.Getpid() || r.State.Exists || r.Agent.Untrusted != "" {
		t.Fatalf("exit %d: %+v", code, r)
	}
	// A step whose cgroup is gone.
	body := `{"version":1,"jobs":[{"id":9,"uid":0,"gpus":[1],"steps":[{"id":0,"uid":0,"cgroup_id":12345,"cgroup":"/nonexistent/job_9/step_0","gpus":[1]}]}]}`
	if err := os.WriteFile(state, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r, code, _ = runStatusJSON(t, "--config", cfg)
	if code != 1 || r.OK || len(r.Jobs) != 1 || r.Jobs[0].User != "root" || r.Jobs[0].Steps[0].CgroupExists {
		t.Fatalf("exit %d: %+v", code, r)
	}
	// Agent down.
	cfg = writeConfig(t, filepath.Join(t.TempDir(), "none.sock"), "", "", "")
	r, code, _ = runStatusJSON(t, "--config", cfg)
	if code != 1 || r.Agent.SocketExists {
		t.Fatalf("exit %d: %+v", code, r)
	}
}

// cgroup2Root is where the root cgroup2 is mounted, or "".
func cgroup2Root(t *testing.T) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if i > 4 && i+1 < len(fields) && fields[i+1] == "cgroup2" && fields[3] == "/" {
			return fields[4]
		}
	}
	return ""
}

func cgroupID(t *testing.T, dir string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestPrivilegedStatus pins a real filter in a bpffs of its own on a cgroup
// tree of its own, writes the state the agent would, and checks status
// against it; then removes an entry behind the state's back.
func TestPrivilegedStatus(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (loads BPF programs, mounts bpffs, creates cgroups)")
	}
	mnt := cgroup2Root(t)
	if mnt == "" {
		t.Skip("skipping: no cgroup2 mount of the root cgroup")
	}
	best, err := devfilter.Probe()
	if err != nil {
		t.Skipf("skipping: kernel lacks a device filter feature: %v", err)
	}
	modes := []devfilter.Mode{devfilter.ModePerCgroup}
	if best == devfilter.ModeScope {
		modes = append(modes, devfilter.ModeScope)
	}
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) { privilegedStatus(t, mnt, mode) })
	}
}

func privilegedStatus(t *testing.T, mnt string, mode devfilter.Mode) {
	var rnd [6]byte
	rand.Read(rnd[:])
	root := filepath.Join(mnt, "gpufence-status-test-"+hex.EncodeToString(rnd[:]))
	scope := filepath.Join(root, "slice", "test_slurmstepd.scope")
	for _, d := range []string{"job_1/step_0", "job_1/step_1", "system"} {
		if err := os.MkdirAll(filepath.Join(scope, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// Deepest first.
		for _, d := range []string{"job_1/step_0", "job_1/step_1", "job_1", "system", ""} {
			for range 50 {
				if err := unix.Rmdir(filepath.Join(scope, d)); err == nil || !errors.Is(err, unix.EBUSY) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		unix.Rmdir(filepath.Join(root, "slice"))
		if err := unix.Rmdir(root); err != nil {
			t.Errorf("remove test cgroups: %v", err)
		}
	})

	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		t.Skipf("skipping: mount bpffs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(bpffs, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount test bpffs: %v", err)
		}
	})
	pinDir := filepath.Join(bpffs, "gpufence")
	opts := devfilter.Options{Mode: mode, PinDir: pinDir}
	if mode == devfilter.ModeScope {
		opts.ScopeDir = scope
	}
	step0 := cgroup.Cgroup{ID: cgroupID(t, filepath.Join(scope, "job_1/step_0")), Path: filepath.Join(scope, "job_1/step_0")}
	step1 := cgroup.Cgroup{ID: cgroupID(t, filepath.Join(scope, "job_1/step_1")), Path: filepath.Join(scope, "job_1/step_1")}
	system := cgroup.Cgroup{ID: cgroupID(t, filepath.Join(scope, "system")), Path: filepath.Join(scope, "system")}

	// The agent's filter, closed as at agent stop: the pins stay.
	f, err := devfilter.New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		// Before the unmount: detach and unpin everything.
		f, err := devfilter.New(opts)
		if err != nil {
			t.Errorf("New for cleanup: %v", err)
			return
		}
		if err := f.Unpin(); err != nil {
			t.Errorf("Unpin: %v", err)
		}
	})
	if err := f.Set(step0, devfilter.Policy{GPUMinors: []uint32{0, 1}}); err != nil {
		t.Fatal(err)
	}
	wantEntries := 1
	if mode == devfilter.ModeScope {
		// The agent keeps Slurm's system cgroup open.
		if err := f.Set(system, devfilter.Policy{AllowAll: true}); err != nil {
			t.Fatal(err)
		}
		wantEntries = 2
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state.json")
	// The table's files are missing here: the agent (and status) take
	// the minor from NVIDIA's naming, /dev/nvidiaN is 195:N.
	dev := t.TempDir()
	body := fmt.Sprintf(`{"version":1,"scope":%q,"gpu_table":{"source":"gres.conf","gpus":[{"index":0,"files":[%q]},{"index":1,"files":[%q]}]},`+
		`"jobs":[{"id":1,"uid":0,"gpus":[0,1],"steps":[{"id":0,"uid":0,"cgroup_id":%d,"cgroup":%q,"gpus":[0,1]}]}]}`,
		scope, filepath.Join(dev, "nvidia0"), filepath.Join(dev, "nvidia1"), step0.ID, step0.Path)
	if err := os.WriteFile(state, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, fakeAgent(t), pinDir, state, scope)

	r, code, raw := runStatusJSON(t, "--config", cfg)
	t.Logf("consistent:\n%s", raw)
	if code != 0 || !r.OK {
		t.Fatalf("exit %d, problems %q", code, r.Problems)
	}
	if !r.Filter.Pinned || r.Filter.Mode != string(mode) || r.Filter.PolicyEntries != wantEntries || r.Filter.Enforcement != "enforce" || r.Filter.NvidiaMajor != 195 {
		t.Errorf("filter: %+v", r.Filter)
	}
	if mode == devfilter.ModeScope {
		if l := r.Filter.Link; l == nil || l.ID == 0 || l.ProgramID == 0 || l.CgroupID != cgroupID(t, scope) || r.Filter.ScopeCgroupID != l.CgroupID {
			t.Errorf("scope link: %+v", r.Filter.Link)
		}
		if len(r.OtherEntries) != 1 || r.OtherEntries[0].Exempt != "system" {
			t.Errorf("other entries: %+v", r.OtherEntries)
		}
	}
	if len(r.Jobs) != 1 || len(r.Jobs[0].Steps) != 1 {
		t.Fatalf("jobs: %+v", r.Jobs)
	}
	s := r.Jobs[0].Steps[0]
	if !s.CgroupExists || s.Kernel == nil || !s.Kernel.Present || !slices.Equal(s.Kernel.GPUMinors, []uint32{0, 1}) {
		t.Errorf("step: %+v kernel %+v", s, s.Kernel)
	}
	var human, errb bytes.Buffer
	if code := runStatus([]string{"--config", cfg}, &human, &errb); code != 0 {
		t.Errorf("human status: exit %d: %s", code, errb.String())
	}
	t.Logf("human:\n%s", human.String())

	// Behind the state's back: step 0's entry goes, step 1 gets one.
	f, err = devfilter.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(step0); err != nil {
		t.Fatal(err)
	}
	if err := f.Set(step1, devfilter.Policy{GPUMinors: []uint32{2}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	r, code, _ = runStatusJSON(t, "--config", cfg)
	if code != 1 || r.OK {
		t.Fatalf("exit %d after Remove, problems %q", code, r.Problems)
	}
	for _, w := range []string{
		fmt.Sprintf("job 1 step 0: the state has the step but the kernel has no entry for its cgroup %d", step0.ID),
		fmt.Sprintf("kernel entry for cgroup %d with no step in the state", step1.ID),
	} {
		if !slices.Contains(r.Problems, w) {
			t.Errorf("no problem %q in %q", w, r.Problems)
		}
	}
	if len(r.Problems) != 2 {
		t.Errorf("problems: %q", r.Problems)
	}
	human.Reset()
	if code := runStatus([]string{"--config", cfg}, &human, &errb); code != 1 {
		t.Errorf("human status after Remove: exit %d", code)
	}
	t.Logf("mismatch:\n%s", human.String())
}
