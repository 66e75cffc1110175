// SPDX-License-Identifier: Apache-2.0

package jobcgroup

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// userUID owns the test's fake delegated subtrees (user@UID.service, as
// systemd chowns it to the user) and runs the user's forged processes.
const userUID = 64123

// cgTree is a cgroup tree of the test's own below the cgroup v2 mount,
// standing for the node's: Base points Find at it. Fake Slurm processes are
// copies of sleep named slurmstepd or slurmd, started inside its cgroups.
type cgTree struct {
	t     *testing.T
	mount string
	root  string
	bin   string
	procs []*exec.Cmd
}

func newCgTree(t *testing.T) *cgTree {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates cgroups, chowns them and starts processes in them")
	}
	mount, err := Mountpoint()
	if err != nil {
		t.Skipf("no cgroup v2: %v", err)
	}
	root, err := os.MkdirTemp(mount, "gpufence-scope-test-")
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir (0700 below a 0700 folder): the user's forged
	// processes run the same copies.
	bin, err := os.MkdirTemp("", "gpufence-scope-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	tr := &cgTree{t: t, mount: mount, root: root, bin: bin}
	t.Cleanup(tr.remove)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep binary: %v", err)
	}
	for _, name := range []string{"slurmstepd", "slurmd"} {
		copyFile(t, sleep, filepath.Join(tr.bin, name))
	}
	// Debian's layout: slurmstepd-wlm, and slurmstepd a link to it.
	deb := filepath.Join(tr.bin, "debian")
	if err := os.Mkdir(deb, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, sleep, filepath.Join(deb, "slurmstepd-wlm"))
	copyFile(t, sleep, filepath.Join(deb, "other-wlm"))
	if err := os.Symlink("slurmstepd-wlm", filepath.Join(deb, "slurmstepd")); err != nil {
		t.Fatal(err)
	}
	return tr
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// mkdir makes rel's cgroups below the tree's root; from owned on (a path
// prefix of rel, "" for none) they are chowned to uid.
func (tr *cgTree) mkdir(rel, owned string, uid int) string {
	tr.t.Helper()
	p := tr.root
	for _, part := range strings.Split(rel, "/") {
		p = filepath.Join(p, part)
		if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
			tr.t.Fatal(err)
		}
		if r, _ := filepath.Rel(tr.root, p); owned != "" && (r == owned || strings.HasPrefix(r, owned+"/")) {
			if err := os.Chown(p, uid, uid); err != nil {
				tr.t.Fatal(err)
			}
		}
	}
	return p
}

// run starts the fake Slurm binary name as uid in the cgroup rel.
func (tr *cgTree) run(rel, name string, uid int) int {
	tr.t.Helper()
	dir := filepath.Join(tr.root, rel)
	fd, err := syscall.Open(dir, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		tr.t.Fatal(err)
	}
	defer syscall.Close(fd)
	cmd := exec.Command(filepath.Join(tr.bin, name), "300")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if uid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}
	}
	if err := cmd.Start(); err != nil {
		tr.t.Fatal(err)
	}
	tr.procs = append(tr.procs, cmd)
	return cmd.Process.Pid
}

// remove kills the tree's processes by pid and removes its cgroups,
// deepest first.
func (tr *cgTree) remove() {
	for _, c := range tr.procs {
		c.Process.Kill()
		c.Wait()
	}
	var dirs []string
	filepath.WalkDir(tr.root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil {
			tr.t.Errorf("remove test cgroup %s: %v", d, err)
		}
	}
}

// The planted scope of issue 18: a user with a systemd login session owns
// user@UID.service (Delegate=yes) and makes <node>_slurmstepd.scope in it.
const (
	userService = "user.slice/user-64123.slice/user@64123.service"
	planted     = userService + "/tn_slurmstepd.scope"
)

// TestPrivilegedFindScope: Find takes only the cgroup where slurmd makes
// its scope, root's, holding Slurm's processes; a planted one (the user's
// own, in their delegated subtree, even holding a process named
// slurmstepd of theirs), a root one in the wrong slice, and two that could
// each be Slurm's are never taken, the last being an error.
func TestPrivilegedFindScope(t *testing.T) {
	none := func() ([]Proc, error) { return nil, nil }
	for _, tc := range []struct {
		name  string
		setup func(tr *cgTree)
		slice string
		// configured is relative to the tree's root; procs nil = /proc.
		configured string
		procs      func() ([]Proc, error)
		want       string // relative to the tree's root, "" for none
		wantErr    error
		errHas     string
		// ignored must be named as not Slurm's, with this in the reason.
		ignored, ignoredWhy string
	}{
		{name: "Debian 22.05 scope, planted one in a user's subtree",
			setup: func(tr *cgTree) {
				tr.mkdir("system.slice/tn_slurmstepd.scope/system", "", 0)
				tr.run("system.slice/tn_slurmstepd.scope/system", "slurmstepd", 0)
				tr.mkdir(planted+"/job_1/step_0", "user.slice/user-64123.slice/user@64123.service", userUID)
				tr.run(planted+"/job_1/step_0", "slurmstepd", userUID)
			},
			want: "system.slice/tn_slurmstepd.scope", ignored: planted, ignoredWhy: "a user's own cgroup subtree"},
		{name: "25.11 plain scope, planted node-named one",
			setup: func(tr *cgTree) {
				tr.mkdir("system.slice/slurmstepd.scope/slurmd", "", 0)
				tr.run("system.slice/slurmstepd.scope/slurmd", "slurmd", 0)
				tr.mkdir(planted, "user.slice/user-64123.slice/user@64123.service", userUID)
			},
			want: "system.slice/slurmstepd.scope", ignored: planted, ignoredWhy: "owned by uid 64123"},
		{name: "planted only: no scope yet",
			setup: func(tr *cgTree) {
				tr.mkdir(planted, "user.slice/user-64123.slice/user@64123.service", userUID)
				tr.run(planted, "slurmstepd", userUID)
			},
			ignored: planted, ignoredWhy: "not where slurmd makes its scope"},
		{name: "root's scope in the wrong slice",
			setup: func(tr *cgTree) {
				tr.mkdir("other.slice/tn_slurmstepd.scope/system", "", 0)
				tr.run("other.slice/tn_slurmstepd.scope/system", "slurmstepd", 0)
			},
			ignored: "other.slice/tn_slurmstepd.scope", ignoredWhy: "not where slurmd makes its scope"},
		{name: "empty scope while slurmstepd runs in the wrong slice",
			setup: func(tr *cgTree) {
				tr.mkdir("system.slice/tn_slurmstepd.scope", "", 0)
				tr.mkdir("other.slice/tn_slurmstepd.scope/system", "", 0)
				tr.run("other.slice/tn_slurmstepd.scope/system", "slurmstepd", 0)
			},
			wantErr: ErrUntrusted, errHas: "holds no slurmd or slurmstepd process, but slurmstepd pid"},
		{name: "empty scope, no Slurm process on the node", procs: none,
			setup: func(tr *cgTree) { tr.mkdir("system.slice/slurmstepd.scope", "", 0) },
			want:  "system.slice/slurmstepd.scope"},
		{name: "two candidates, both Slurm's",
			setup: func(tr *cgTree) {
				for _, s := range []string{"tn_slurmstepd.scope", "slurmstepd.scope"} {
					tr.mkdir("system.slice/"+s+"/system", "", 0)
					tr.run("system.slice/"+s+"/system", "slurmstepd", 0)
				}
			},
			wantErr: ErrAmbiguous, errHas: "Slurm's processes run in both"},
		{name: "two candidates, neither holding a Slurm process", procs: none,
			setup: func(tr *cgTree) {
				tr.mkdir("system.slice/tn_slurmstepd.scope", "", 0)
				tr.mkdir("system.slice/slurmstepd.scope", "", 0)
			},
			wantErr: ErrAmbiguous, errHas: "neither holds"},
		{name: "two candidates, one holding slurmstepd",
			setup: func(tr *cgTree) {
				tr.mkdir("system.slice/tn_slurmstepd.scope", "", 0)
				tr.mkdir("system.slice/slurmstepd.scope/job_3/step_0/slurm", "", 0)
				tr.run("system.slice/slurmstepd.scope/job_3/step_0/slurm", "slurmstepd", 0)
			},
			want: "system.slice/slurmstepd.scope", ignored: "system.slice/tn_slurmstepd.scope", ignoredWhy: "holds no slurmd or slurmstepd process"},
		{name: "user's slurmstepd proves nothing",
			setup: func(tr *cgTree) {
				tr.mkdir("system.slice/tn_slurmstepd.scope", "", 0)
				tr.mkdir("system.slice/slurmstepd.scope/system", "", 0)
				tr.run("system.slice/slurmstepd.scope/system", "slurmstepd", userUID)
			},
			wantErr: ErrAmbiguous, errHas: "neither holds"},
		{name: "expected scope owned by a user",
			setup: func(tr *cgTree) {
				tr.mkdir("system.slice/tn_slurmstepd.scope", "system.slice/tn_slurmstepd.scope", userUID)
			},
			wantErr: ErrUntrusted, errHas: "owned by uid 64123"},
		{name: "CgroupSlice", slice: "gpu.slice",
			setup: func(tr *cgTree) {
				tr.mkdir("gpu.slice/slurmstepd.scope/slurmd", "", 0)
				tr.run("gpu.slice/slurmstepd.scope/slurmd", "slurmd", 0)
				tr.mkdir("system.slice/slurmstepd.scope", "", 0)
			},
			want: "gpu.slice/slurmstepd.scope", ignored: "system.slice/slurmstepd.scope", ignoredWhy: "not where slurmd makes its scope"},
		{name: "CgroupSlice climbing out", slice: "../x.slice", setup: func(tr *cgTree) {},
			wantErr: ErrUntrusted, errHas: "not a cgroup below the mount"},
		{name: "configured scope in a user's subtree", configured: planted,
			setup: func(tr *cgTree) {
				tr.mkdir(planted, "user.slice/user-64123.slice/user@64123.service", userUID)
			},
			wantErr: ErrUntrusted, errHas: "a user's own cgroup subtree"},
		{name: "configured scope, root's", configured: "custom/slurm",
			setup: func(tr *cgTree) {
				tr.mkdir("custom/slurm", "", 0)
				tr.mkdir("system.slice/slurmstepd.scope/system", "", 0)
				tr.run("system.slice/slurmstepd.scope/system", "slurmstepd", 0)
			},
			want: "custom/slurm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newCgTree(t)
			tc.setup(tr)
			w := Where{Mount: tr.mount, Node: "tn", Slice: tc.slice, Base: tr.root, Procs: tc.procs}
			if tc.configured != "" {
				w.Configured = filepath.Join(tr.root, tc.configured)
			}
			f := Find(w)
			want := ""
			if tc.want != "" {
				want = filepath.Join(tr.root, tc.want)
			}
			if f.Scope != want {
				t.Errorf("Scope = %q, want %q (err %v, candidates %+v)", f.Scope, want, f.Err, f.Candidates)
			}
			switch {
			case tc.wantErr == nil && f.Err != nil:
				t.Errorf("Err = %v, want none", f.Err)
			case tc.wantErr != nil && (!errors.Is(f.Err, tc.wantErr) || !strings.Contains(f.Err.Error(), tc.errHas)):
				t.Errorf("Err = %v, want %v with %q", f.Err, tc.wantErr, tc.errHas)
			}
			if tc.ignored != "" {
				p := filepath.Join(tr.root, tc.ignored)
				i := slices.IndexFunc(f.Ignored(), func(c Candidate) bool { return c.Path == p })
				if i < 0 || !strings.Contains(f.Ignored()[i].Refused, tc.ignoredWhy) {
					t.Errorf("%s not named as ignored with %q: %+v", p, tc.ignoredWhy, f.Ignored())
				}
			}
		})
	}
}

// TestPrivilegedSlurmProcs: a root process running a binary named
// slurmstepd, or the file a slurmstepd link beside it names (Debian's
// slurmstepd-wlm), is Slurm's; the same binary run by a user, another
// binary, or a root process that only renamed itself (comm), is not.
func TestPrivilegedSlurmProcs(t *testing.T) {
	tr := newCgTree(t)
	tr.mkdir("a", "", 0)
	root := tr.run("a", "slurmstepd", 0)
	debian := tr.run("a", "debian/slurmstepd-wlm", 0)
	other := tr.run("a", "debian/other-wlm", 0)
	usr := tr.run("a", "slurmstepd", userUID)
	// A root shell that names itself slurmstepd (comm is the process's
	// own to write) and stays.
	named := exec.Command("/bin/sh", "-c", "printf slurmstepd > /proc/$$/comm; while :; do sleep 1; done")
	if err := named.Start(); err != nil {
		t.Fatal(err)
	}
	tr.procs = append(tr.procs, named)
	for i := 0; ; i++ {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(named.Process.Pid) + "/comm")
		if strings.TrimSpace(string(b)) == "slurmstepd" {
			break
		}
		if i > 2000 {
			t.Fatalf("the shell did not rename itself: comm %q", b)
		}
		time.Sleep(time.Millisecond)
	}
	ps, err := SlurmProcs()
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]Proc{}
	for _, p := range ps {
		got[p.PID] = p
	}
	for _, pid := range []int{root, debian} {
		if p, ok := got[pid]; !ok || p.Cgroup != filepath.Join(tr.root, "a") || !p.IsStepd() {
			t.Errorf("root slurmstepd %d: %+v, %v; want it in %s", pid, p, ok, filepath.Join(tr.root, "a"))
		}
	}
	for _, pid := range []int{usr, other, named.Process.Pid} {
		if p, ok := got[pid]; ok {
			t.Errorf("pid %d counted as Slurm's: %+v", pid, p)
		}
	}
}

func TestFoundSlurmd(t *testing.T) {
	const m = "/sys/fs/cgroup"
	scope := m + "/system.slice/n1_slurmstepd.scope"
	svc := m + "/system.slice/slurmd.service"
	d := func(pid int, cg string) Proc { return Proc{PID: pid, Kind: "slurmd", Cgroup: cg} }
	for _, tc := range []struct {
		name    string
		scope   string
		pidFile string // "-": none
		procs   []Proc
		want    string
		wantErr bool
	}{
		{"systemd's slurmd.service", scope, "10\n", []Proc{d(10, svc), d(11, svc), {PID: 12, Kind: "slurmstepd", Cgroup: scope + "/system"}}, svc, false},
		{"another Slurm's slurmd, not the pid file's", scope, "10\n", []Proc{d(10, svc), d(20, m+"/gpufence-test/system.slice/slurmd.service")}, svc, false},
		{"the pid file names no slurmd (stale)", scope, "30\n", []Proc{d(10, svc), {PID: 30, Kind: "slurmstepd", Cgroup: svc}}, "", false},
		{"no pid file: slurmd not running", scope, "-", []Proc{d(10, svc)}, "", false},
		{"slurmd inside the scope", scope, "10", []Proc{d(10, scope+"/slurmd")}, "", false},
		{"no scope yet", "", "10", []Proc{d(10, svc)}, "", false},
		{"the mount's root", scope, "10", []Proc{d(10, m)}, "", false},
		{"an ancestor of the scope", scope, "10", []Proc{d(10, m+"/system.slice")}, "", false},
		{"root's login session", scope, "10", []Proc{d(10, m+"/user.slice/user-0.slice/session-3.scope")}, "", false},
		{"inside a cgroup named like a scope", scope, "10", []Proc{d(10, m+"/gpufence-test/x_slurmstepd.scope/slurmd")}, "", false},
		{"outside the mount", scope, "10", []Proc{d(10, "/elsewhere")}, "", false},
		{"a pid file that is no pid", scope, "slurmd\n", []Proc{d(10, svc)}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pf := filepath.Join(t.TempDir(), "slurmd.pid")
			if tc.pidFile != "-" {
				if err := os.WriteFile(pf, []byte(tc.pidFile), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := Found{Scope: tc.scope, Procs: tc.procs}.Slurmd(m, pf)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Errorf("Slurmd() = %q, %v; want %q, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
