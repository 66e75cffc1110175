// SPDX-License-Identifier: Apache-2.0

// Package verify is `gpufence verify`: a live self-test of GPU isolation
// on this node. It makes a throw-away cgroup below Slurm's scope
// (<scope>/gpufence-verify-<pid>), has the running agent give its leaf
// `given` one GPU exactly as a step gets its GPUs (a request on the agent's
// socket from a process inside it; the agent writes the filter's entry),
// and checks with the kernel itself, by opening each GPU device file from
// a child process there, that the GPU given opens and every other GPU is
// refused (EPERM). In scope mode a second leaf, never registered, must be
// refused every GPU, as a job cgroup nobody registered is. Then it removes
// everything, asks the agent to drop the entry (which audits the result)
// and reports each check.
package verify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/verifycgroup"
	"github.com/gpufence/gpufence/proto/agentclient"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// Options configure a self-test.
type Options struct {
	// Socket is the agent's socket.
	Socket string
	// Mount is the cgroup v2 mount ("" = found); Scope the configured
	// scope ("" = found as the agent finds it), Node this node's name and
	// Slice cgroup.conf's CgroupSlice ("" = system.slice).
	Mount, Scope, Node, Slice string
	// GPU is the GPU index to give; nil: the agent's lowest.
	GPU *int
	// Timeout bounds the whole self-test.
	Timeout time.Duration
	// Child is the command that runs ChildMain in a new process (default:
	// this executable's hidden `__verify-child` command); the child's
	// arguments are appended. Env is added to its environment.
	Child []string
	Env   []string
}

// ChildCommand is the hidden command of the gpufence binary that runs
// ChildMain.
const ChildCommand = "__verify-child"

// Check is one thing the self-test checked. Name states the result ("GPU
// 1 refused", or when it failed "GPU 1 opened though not given").
type Check struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
	Skipped bool   `json:"skipped,omitempty"`
	Detail  string `json:"detail,omitempty"`
	TookUS  int64  `json:"took_us,omitempty"`
}

// Report is the self-test's result.
type Report struct {
	OK         bool     `json:"ok"`
	Failed     []string `json:"failed"`
	Checks     []Check  `json:"checks"`
	Mode       string   `json:"mode,omitempty"`
	PolicyMode string   `json:"policy_mode,omitempty"`
	Scope      string   `json:"scope,omitempty"`
	Cgroup     string   `json:"cgroup,omitempty"`
	GPU        *int     `json:"gpu,omitempty"`
	TookUS     int64    `json:"took_us"`
}

func (r *Report) add(c Check) {
	r.Checks = append(r.Checks, c)
	if !c.OK && !c.Skipped {
		r.Failed = append(r.Failed, c.Name)
	}
}

// pass and fail make a check that passed or failed.
func pass(id, name, detail string) Check { return Check{ID: id, Name: name, OK: true, Detail: detail} }
func fail(id, name, detail string) Check { return Check{ID: id, Name: name, Detail: detail} }

// Run runs the self-test.
func Run(o Options) Report {
	start := time.Now()
	r := Report{Failed: []string{}}
	run(o, &r, start)
	r.OK = len(r.Failed) == 0
	r.TookUS = time.Since(start).Microseconds()
	return r
}

func run(o Options, r *Report, start time.Time) {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	if !isRoot() {
		r.add(fail("root", "not run as root", "gpufence verify makes a cgroup below Slurm's scope and talks to the agent's root-only socket"))
		return
	}
	if len(o.Child) == 0 {
		exe, err := os.Executable()
		if err != nil {
			r.add(fail("child", "cannot find the gpufence binary", err.Error()))
			return
		}
		o.Child = []string{exe, ChildCommand}
	}
	mount := o.Mount
	if mount == "" {
		m, err := jobcgroup.Mountpoint()
		if err != nil {
			r.add(fail("scope", "no cgroup v2 mount", err.Error()))
			return
		}
		mount = m
	}
	found := jobcgroup.Find(jobcgroup.Where{Mount: mount, Configured: o.Scope, Node: o.Node, Slice: o.Slice})
	scope := found.Scope
	switch {
	case found.Err != nil:
		r.add(fail("scope", "Slurm's slurmstepd scope cannot be told", found.Err.Error()))
		return
	case scope == "":
		r.add(fail("scope", "Slurm's slurmstepd scope not found", strings.Join(found.Expected, " or ")+" does not exist; slurmd makes it when it starts"))
		return
	}
	r.Scope = scope
	// The scope tested must be the one Slurm's own steps live in, not a
	// cgroup that only bears its name: a self-test below any other would
	// pass while jobs run unfiltered.
	if !slurmCheck(r, found) {
		return
	}
	removeStale(scope)

	dir := verifycgroup.Dir(scope, os.Getpid())
	given, bare := filepath.Join(dir, verifycgroup.Given), filepath.Join(dir, verifycgroup.Bare)
	for _, d := range []string{dir, given, bare} {
		if err := os.Mkdir(d, 0o755); err != nil {
			r.add(fail("cgroup", "cannot make the verify cgroup", err.Error()))
			cleanup(r, dir, nil, o.Socket, start)
			return
		}
	}
	r.Cgroup = dir

	// The child in `given` asks the agent for its GPU and opens every
	// GPU device file of the node's table.
	args := []string{"--socket", o.Socket, "--timeout", o.Timeout.String(), "--register"}
	if o.GPU != nil {
		args = append(args, "--gpu", strconv.Itoa(*o.GPU))
	}
	t0 := time.Now()
	res, err := child(ctx, o, given, args)
	took := time.Since(t0).Microseconds()
	var info *childInfo
	switch {
	case err != nil:
		r.add(fail("child", "the verify process in the cgroup failed", err.Error()))
	case res.Unreachable:
		c := fail("agent", "agent unreachable", res.Error)
		c.TookUS = took
		r.add(c)
	case res.Error != "":
		c := fail("agent", "agent refused the verify cgroup", res.Error)
		c.TookUS = took
		r.add(c)
	default:
		info = res.Info
		r.Mode, r.PolicyMode, r.GPU = info.Mode, info.PolicyMode, &info.GPU
		c := pass("agent", fmt.Sprintf("agent gave GPU %d to the verify cgroup", info.GPU), info.Cgroup)
		c.TookUS = took
		r.add(c)
		switch {
		case info.FilterProblem == "" && info.Scope != scope:
			r.add(fail("filter", "filter not on Slurm's scope", fmt.Sprintf("the agent's filter is on %s, but Slurm's processes live in %s", info.Scope, scope)))
		case info.FilterProblem == "" && info.Mode == "scope":
			r.add(pass("filter", "filter attached to the live scope", fmt.Sprintf("%s mode, %s", info.Mode, info.Scope)))
		case info.FilterProblem == "":
			r.add(pass("filter", "filter attached to the verify cgroup", fmt.Sprintf("%s mode, below %s", info.Mode, info.Scope)))
		default:
			r.add(fail("filter", "filter not attached to the live scope", info.FilterProblem))
		}
		if info.PolicyMode == "audit-only" {
			r.add(fail("enforcing", "agent in audit-only mode: nothing is denied", "enforcement: audit-only"))
		} else {
			r.add(pass("enforcing", "agent enforcing", info.PolicyMode))
		}
		judgeGiven(r, info, res.Opens)
		if info.Mode == "scope" {
			t0 := time.Now()
			res2, err := child(ctx, o, bare, append([]string{"--timeout", o.Timeout.String(), "--open"}, allFiles(info)...))
			if err != nil {
				r.add(fail("unregistered", "the unregistered verify process failed", err.Error()))
			} else {
				judgeBare(r, info, res2.Opens, time.Since(t0).Microseconds())
			}
		} else {
			r.add(Check{ID: "unregistered", Name: "unregistered cgroup not checked", Skipped: true,
				Detail: "per-cgroup mode narrows registered cgroups only; the plugin refuses steps it could not register"})
		}
	}
	cleanup(r, dir, info, o.Socket, start)
}

// slurmCheck checks that Slurm's own processes (root's, running slurmd or
// slurmstepd, jobcgroup.SlurmProcs) live in the scope: with none there,
// the scope cannot be shown to be the one Slurm's steps are in, and
// verify fails.
func slurmCheck(r *Report, found jobcgroup.Found) bool {
	var in, out []string
	for _, p := range found.Procs {
		if jobcgroup.Within(p.Cgroup, found.Scope) {
			in = append(in, p.String())
		} else if p.IsStepd() {
			out = append(out, p.String())
		}
	}
	switch {
	case len(in) > 0:
		// slurmstepds elsewhere are not counted against it: another
		// slurmd's (multiple-slurmd), or one not yet moved into its job.
		r.add(pass("slurm", "Slurm's own processes live in the scope", strings.Join(in, ", ")))
		return true
	case len(out) > 0:
		r.add(fail("slurm", "Slurm's processes do not live in the scope", fmt.Sprintf("none in %s; %s", found.Scope, strings.Join(out, ", "))))
		return false
	}
	// An idle node whose slurmd is not in the scope (started by systemd,
	// or Slurm before 23.02): nothing to show either way; the scope is
	// where slurmd makes it and root's (Find).
	r.add(Check{ID: "slurm", Name: "no Slurm process to check the scope against", Skipped: true,
		Detail: "no slurmd or slurmstepd runs in " + found.Scope + " and no slurmstepd runs elsewhere"})
	return true
}

// judgeGiven checks what the registered child met: its GPU's files open,
// every other GPU's are refused.
func judgeGiven(r *Report, info *childInfo, opens []opened) {
	got := map[string]string{}
	for _, o := range opens {
		got[o.Path] = o.Errno
	}
	mine := map[string]bool{}
	for _, g := range info.GPUs {
		if g.Index == info.GPU {
			for _, f := range g.Files {
				mine[f] = true
			}
		}
	}
	for _, g := range info.GPUs {
		id := "gpu" + strconv.Itoa(g.Index)
		if g.Index == info.GPU {
			var bad []string
			for _, f := range g.Files {
				if e := got[f]; !allowed(e) {
					bad = append(bad, f+": "+e)
				}
			}
			if len(bad) > 0 {
				r.add(fail(id, fmt.Sprintf("GPU %d not opened in its own cgroup", g.Index), strings.Join(bad, ", ")))
			} else {
				r.add(pass(id, fmt.Sprintf("GPU %d opened in its own cgroup", g.Index), describe(g.Files, got)))
			}
			continue
		}
		var bad, checked []string
		for _, f := range g.Files {
			if mine[f] {
				continue // a MIG slice's parent, shared with the slice given
			}
			checked = append(checked, f)
			if e := got[f]; e != "EPERM" {
				bad = append(bad, f+": "+e)
			}
		}
		switch {
		case len(checked) == 0:
		case len(bad) > 0 && anyOpened(bad):
			r.add(fail(id, fmt.Sprintf("GPU %d opened though not given", g.Index), strings.Join(bad, ", ")))
		case len(bad) > 0:
			r.add(fail(id, fmt.Sprintf("GPU %d could not be tested", g.Index), strings.Join(bad, ", ")))
		default:
			r.add(pass(id, fmt.Sprintf("GPU %d refused", g.Index), describe(checked, got)))
		}
	}
}

// judgeBare checks that the never registered cgroup was refused every GPU.
func judgeBare(r *Report, info *childInfo, opens []opened, took int64) {
	var bad []string
	for _, o := range opens {
		if o.Errno != "EPERM" {
			bad = append(bad, o.Path+": "+o.Errno)
		}
	}
	c := pass("unregistered", "unregistered cgroup refused every GPU", fmt.Sprintf("%d device files", len(opens)))
	if len(bad) > 0 {
		c = fail("unregistered", "unregistered cgroup opened a GPU", strings.Join(bad, ", "))
	}
	c.TookUS = took
	r.add(c)
}

// allowed: the kernel let the open through to the driver (no driver, a
// fake device: ENXIO; a real GPU: success or the driver's own error).
func allowed(errno string) bool { return errno != "EPERM" && !untested(errno) }

// untested: the open never reached the device cgroup check.
func untested(errno string) bool {
	switch errno {
	case "", "ENOENT", "ENOTDIR", "ELOOP", "EACCES", "ENAMETOOLONG":
		return true
	}
	return false
}

func anyOpened(bad []string) bool {
	for _, b := range bad {
		if _, e, _ := strings.Cut(b, ": "); allowed(e) {
			return true
		}
	}
	return false
}

func describe(files []string, got map[string]string) string {
	parts := make([]string, 0, len(files))
	for _, f := range files {
		parts = append(parts, f+": "+got[f])
	}
	return strings.Join(parts, ", ")
}

func allFiles(info *childInfo) []string {
	var out []string
	for _, g := range info.GPUs {
		for _, f := range g.Files {
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	return out
}

// cleanup removes the verify cgroup, tells the agent (which drops the
// kernel entry and audits), and checks that nothing is left behind.
func cleanup(r *Report, dir string, info *childInfo, socket string, start time.Time) {
	var errs []error
	for _, d := range []string{filepath.Join(dir, verifycgroup.Given), filepath.Join(dir, verifycgroup.Bare), dir} {
		if err := rmdir(d); err != nil {
			errs = append(errs, err)
		}
	}
	if info != nil {
		failed := slices.Clone(r.Failed)
		if len(errs) > 0 {
			failed = append(failed, "verify cgroup left behind")
		}
		resp, err := agentclient.Call(socket, &pb.Request{Msg: &pb.Request_VerifyEnd{VerifyEnd: &pb.VerifyEnd{
			CgroupId: info.CgroupID, Failed: failed, ElapsedUs: uint64(time.Since(start).Microseconds())}}}, 5*time.Second)
		switch {
		case err != nil:
			r.add(fail("entry", "agent did not drop the verify cgroup's kernel entry", err.Error()))
		case resp.GetVerify().GetEntriesLeft() > 0:
			r.add(fail("entry", "kernel entry of the verify cgroup left behind", fmt.Sprintf("cgroup id %d", info.CgroupID)))
		default:
			r.add(pass("entry", "kernel entry removed and the result audited", fmt.Sprintf("cgroup id %d", info.CgroupID)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		r.add(fail("cleanup", "verify cgroup left behind", err.Error()))
		return
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		r.add(fail("cleanup", "verify cgroup left behind", dir))
		return
	}
	r.add(pass("cleanup", "nothing left behind", dir+" removed"))
}

// rmdir removes a cgroup directory; a child just reaped may keep it busy
// for a moment.
func rmdir(d string) error {
	var err error
	for i := 0; i < 200; i++ {
		err = unix.Rmdir(d)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("remove %s: %w", d, err)
}

// removeStale removes verify cgroups a killed verify left (its pid gone,
// or this process's own pid reused), which hold no process.
func removeStale(scope string) {
	dirs, _ := filepath.Glob(filepath.Join(scope, verifycgroup.Prefix+"*"))
	for _, d := range dirs {
		pid, ok := verifycgroup.PID(filepath.Base(d))
		if !ok {
			continue
		}
		if pid != os.Getpid() {
			if err := unix.Kill(pid, 0); err == nil || errors.Is(err, unix.EPERM) {
				continue // another verify running
			}
		}
		for _, leaf := range []string{verifycgroup.Given, verifycgroup.Bare} {
			unix.Rmdir(filepath.Join(d, leaf))
		}
		unix.Rmdir(d)
	}
}

// child runs the child command born in cgroup dir and reads its result.
func child(ctx context.Context, o Options, dir string, args []string) (childResult, error) {
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return childResult{}, err
	}
	defer unix.Close(fd)
	cmd := exec.CommandContext(ctx, o.Child[0], append(slices.Clone(o.Child[1:]), args...)...)
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return childResult{}, fmt.Errorf("%s in %s: %w: %s", o.Child[0], dir, err, strings.TrimSpace(errOut.String()))
	}
	var res childResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return childResult{}, fmt.Errorf("%s in %s: bad output: %w", o.Child[0], dir, err)
	}
	return res, nil
}

func isRoot() bool { return os.Geteuid() == 0 }
