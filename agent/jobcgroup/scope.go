// SPDX-License-Identifier: Apache-2.0

package jobcgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// maxScopeDepth is how deep below the cgroup v2 mount FindScopes looks for
// cgroups named like Slurm's scope, to name the ones that are not where
// slurmd makes it (a user's delegated subtree is four levels down:
// user.slice/user-UID.slice/user@UID.service/<name>).
const maxScopeDepth = 4

// DefaultSlice is where slurmd makes its scope when cgroup.conf sets no
// CgroupSlice.
const DefaultSlice = "system.slice"

// FindScopes lists every directory under mount named like Slurm's
// slurmstepd scope (IsScopeName), at any depth up to maxScopeDepth, sorted.
// It is for naming them: a name proves nothing, anyone with a delegated
// cgroup (a systemd login session) can make one. Find decides which is
// Slurm's. It never descends into a scope: the job trees below are Slurm's.
func FindScopes(mount string) []string {
	var found []string
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		if depth > maxScopeDepth {
			return
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if IsScopeName(e.Name()) {
				found = append(found, p)
				continue
			}
			walk(p, depth+1)
		}
	}
	walk(mount, 1)
	sort.Strings(found)
	return found
}

// Where says where slurmd makes its scope on this node, as Slurm's
// cgroup/v2 plugin computes it (_set_int_cg_ns in cgroup_v2.c):
// <Base>/<Slice>/<Node>_slurmstepd.scope when Slurm is built with
// multiple-slurmd support (Debian's packages), else
// <Base>/<Slice>/slurmstepd.scope; or the configured scope.
type Where struct {
	// Mount is the cgroup v2 mount.
	Mount string
	// Configured is the agent's `scope` setting; "" = where slurmd makes it.
	Configured string
	// Node is this node's name (slurmd -N).
	Node string
	// Slice is cgroup.conf's CgroupSlice; "" = system.slice.
	Slice string
	// Base is the directory slurmd puts its slice in: the parent of PID
	// 1's cgroup (the mount itself on a host, a container's cgroup in a
	// container); "" = read from /proc/1/cgroup.
	Base string
	// Procs lists Slurm's own processes; nil = SlurmProcs (this node's
	// /proc). Tests of the rules may give a fixed list.
	Procs func() ([]Proc, error)
	// Owner must own every directory from the mount down to the scope:
	// root (0) on a node; doctor's fixtures are their maker's.
	Owner uint32
}

// Proc is a process of Slurm's own: root's, running slurmd or slurmstepd.
type Proc struct {
	PID int
	// Kind is slurmd or slurmstepd.
	Kind string
	// Exe is the kernel's /proc/<pid>/exe.
	Exe string
	// Cgroup is the absolute cgroup directory the process is in.
	Cgroup string
}

// IsStepd reports whether the process runs slurmstepd.
func (p Proc) IsStepd() bool { return p.Kind == "slurmstepd" }

func (p Proc) String() string {
	return fmt.Sprintf("%s pid %d in %s", p.Kind, p.PID, p.Cgroup)
}

// Candidate is a cgroup that was considered for Slurm's scope.
type Candidate struct {
	Path string `json:"path"`
	// Expected: it is where slurmd makes its scope (or the configured one).
	Expected bool `json:"expected"`
	// Refused says why it cannot be Slurm's scope; "" when it can.
	Refused string `json:"refused,omitempty"`
	// Proof names the Slurm process that runs in it or below; "" if none.
	Proof string `json:"proof,omitempty"`
}

// Found is what Find decided.
type Found struct {
	// Scope is Slurm's scope; "" when there is none yet or Err says why
	// none can be told.
	Scope string
	// Expected are the directories slurmd makes its scope at.
	Expected []string
	// Candidates are the expected directories that exist and every other
	// cgroup named like a scope, each with why it was refused.
	Candidates []Candidate
	// Procs are Slurm's processes on this node.
	Procs []Proc
	// Err: a scope exists where slurmd makes it but cannot be trusted, or
	// two can be Slurm's. Nothing may then be attached or moved on the
	// strength of this search: fail closed.
	Err error
}

// ErrAmbiguous is wrapped by Found.Err when two cgroups can each be Slurm's
// scope.
var ErrAmbiguous = errors.New("Slurm's scope is ambiguous")

// ErrUntrusted is wrapped by Found.Err when the only cgroup where slurmd
// makes its scope fails a check (owner, a user's subtree, no Slurm
// process in it while slurmstepds run elsewhere).
var ErrUntrusted = errors.New("Slurm's scope cannot be trusted")

// Ignored are the cgroups named like a scope that are not Slurm's (never
// attached to, never a reason to move the filter), for doctor and status
// to name.
func (f Found) Ignored() []Candidate {
	var out []Candidate
	for _, c := range f.Candidates {
		if c.Path != f.Scope && c.Refused != "" {
			out = append(out, c)
		}
	}
	return out
}

// Find decides which cgroup is Slurm's slurmstepd scope. Only a cgroup
// that is where slurmd makes it (or the configured one) counts, never one
// found by its name elsewhere: a user with a systemd login session owns
// user@UID.service (Delegate=yes) and can make a <node>_slurmstepd.scope
// there. It must be root's all the way down from the mount, outside every
// user's subtree, and, when Slurm's processes run, hold one of them (a
// root process running slurmd or slurmstepd: a user can neither make a
// root process nor move one into their subtree, since moving needs write
// access to the common ancestor's cgroup.procs). Two that pass, or the
// only one failing a check, is an error (Found.Err); none existing is not
// (slurmd makes it at its start).
func Find(w Where) Found {
	var f Found
	list := w.Procs
	if list == nil {
		list = SlurmProcs
	}
	procs, perr := list()
	f.Procs = procs
	// Cgroups bearing the name are named from where slurmd builds its
	// path down, to say they are not Slurm's.
	top := w.Mount
	if w.Configured != "" {
		f.Expected = []string{filepath.Clean(w.Configured)}
	} else {
		exp, base, err := expected(w)
		if err != nil {
			f.Err = fmt.Errorf("%w: %v", ErrUntrusted, err)
			return f
		}
		f.Expected, top = exp, base
	}
	var ok []Candidate
	var refused []string
	for _, p := range f.Expected {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			continue
		}
		c := Candidate{Path: p, Expected: true, Refused: untrusted(w.Mount, p, w.Owner)}
		if c.Refused == "" {
			for _, pr := range procs {
				if Within(pr.Cgroup, p) {
					c.Proof = pr.String()
					break
				}
			}
		}
		if c.Refused == "" {
			ok = append(ok, c)
		} else {
			refused = append(refused, p+": "+c.Refused)
		}
		f.Candidates = append(f.Candidates, c)
	}
	for _, p := range FindScopes(top) {
		if !slices.Contains(f.Expected, p) {
			f.Candidates = append(f.Candidates, Candidate{Path: p, Refused: elsewhere(w, p, f.Expected)})
		}
	}
	var proven []Candidate
	for _, c := range ok {
		if c.Proof != "" {
			proven = append(proven, c)
		}
	}
	switch {
	case len(proven) == 1:
		f.Scope = proven[0].Path
		f.refuseOthers(proven[0].Path)
	case len(proven) > 1:
		f.Err = fmt.Errorf("%w: Slurm's processes run in both %s (%s) and %s (%s)", ErrAmbiguous,
			proven[0].Path, proven[0].Proof, proven[1].Path, proven[1].Proof)
	case len(ok) > 1:
		f.Err = fmt.Errorf("%w: %s and %s both exist and neither holds a slurmd or slurmstepd process", ErrAmbiguous, ok[0].Path, ok[1].Path)
	case len(ok) == 1:
		// The configured scope is the administrator's word: it is only
		// checked for its owner. One found holds no Slurm process: taken
		// when none runs at all, else slurmstepd is shown living elsewhere.
		if w.Configured == "" {
			if perr != nil {
				f.Err = fmt.Errorf("%w: %s holds no slurmd or slurmstepd process, and Slurm's processes cannot be listed: %v", ErrUntrusted, ok[0].Path, perr)
				return f
			}
			var out []string
			for _, pr := range procs {
				if pr.IsStepd() {
					out = append(out, pr.String())
				}
			}
			if len(out) > 0 {
				f.Err = fmt.Errorf("%w: %s holds no slurmd or slurmstepd process, but %s", ErrUntrusted, ok[0].Path, strings.Join(out, ", "))
				return f
			}
		}
		f.Scope = ok[0].Path
	case len(refused) > 0:
		f.Err = fmt.Errorf("%w: %s", ErrUntrusted, strings.Join(refused, "; "))
	}
	return f
}

// refuseOthers marks the expected candidates other than scope: they hold
// no Slurm process while scope does.
func (f *Found) refuseOthers(scope string) {
	for i, c := range f.Candidates {
		if c.Path != scope && c.Refused == "" {
			f.Candidates[i].Refused = "holds no slurmd or slurmstepd process, while " + scope + " does"
		}
	}
}

// expected are the two directories slurmd may make its scope at: its
// node's name first (multiple-slurmd builds), then the plain name.
func expected(w Where) (exp []string, base string, err error) {
	slice := w.Slice
	if slice == "" {
		slice = DefaultSlice
	}
	clean := path.Clean("/" + slice)
	if clean == "/" || strings.Contains("/"+slice+"/", "/../") {
		return nil, "", fmt.Errorf("CgroupSlice=%q is not a cgroup below the mount", slice)
	}
	base = w.Base
	if base == "" {
		if base, err = InitBase(w.Mount); err != nil {
			return nil, "", err
		}
	}
	dir := filepath.Join(base, clean)
	var out []string
	if w.Node != "" && !strings.ContainsAny(w.Node, "/") && w.Node != "." && w.Node != ".." {
		out = append(out, filepath.Join(dir, w.Node+"_slurmstepd.scope"))
	}
	return append(out, filepath.Join(dir, "slurmstepd.scope")), base, nil
}

// InitBase is the directory slurmd builds its slice path from: the parent
// of PID 1's cgroup, or the mount when PID 1 is at its root. Only root can
// move PID 1.
func InitBase(mount string) (string, error) {
	unified, err := PathOf(1)
	if err != nil {
		return "", err
	}
	p := path.Clean("/" + unified)
	if p == "/" {
		return mount, nil
	}
	return filepath.Join(mount, path.Dir(p)), nil
}

// untrusted says why dir cannot be Slurm's scope: outside the mount, in a
// user's subtree, not a cgroup, or a directory on the way (below the
// mount) not owned by root. "" when it can.
func untrusted(mount, dir string, owner uint32) string {
	rel, err := filepath.Rel(mount, dir)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "not below the cgroup v2 mount " + mount
	}
	if u := UserSubtree(rel); u != "" {
		return "inside " + u + ", a user's own cgroup subtree"
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
		return "not a cgroup"
	}
	p := mount
	for _, part := range strings.Split(rel, "/") {
		p = filepath.Join(p, part)
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err.Error()
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return p + " is not a directory"
		}
		if st.Uid != owner {
			return fmt.Sprintf("%s is owned by uid %d, not root (a delegated cgroup)", p, st.Uid)
		}
	}
	return ""
}

// UserSubtree returns the part of rel (a cgroup path below the mount) that
// makes it a user's: user.slice (logind's sessions and user@UID.service,
// which systemd delegates to the user) and any user-*.slice or
// user@*.service; "" when none does.
func UserSubtree(rel string) string {
	parts := strings.Split(rel, "/")
	for i, p := range parts {
		if p == "user.slice" || (strings.HasPrefix(p, "user-") && strings.HasSuffix(p, ".slice")) ||
			(strings.HasPrefix(p, "user@") && strings.HasSuffix(p, ".service")) {
			return strings.Join(parts[:i+1], "/")
		}
	}
	return ""
}

// elsewhere says why a cgroup named like a scope, not at an expected
// place, is not Slurm's.
func elsewhere(w Where, p string, want []string) string {
	why := "not where slurmd makes its scope (" + strings.Join(want, " or ") + ")"
	if w.Configured != "" {
		why = "not the configured scope " + w.Configured
	}
	if rel, err := filepath.Rel(w.Mount, p); err == nil {
		if u := UserSubtree(rel); u != "" {
			why += "; inside " + u + ", a user's own cgroup subtree"
		}
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err == nil && st.Uid != w.Owner {
		why += fmt.Sprintf("; owned by uid %d", st.Uid)
	}
	return why
}

// Within reports whether cgroup path cg is dir or below it.
func Within(cg, dir string) bool { return cg == dir || strings.HasPrefix(cg, dir+"/") }

// slurmBinaries are the names Slurm's daemons are started as.
var slurmBinaries = []string{"slurmstepd", "slurmd"}

// kinds tells which Slurm daemon an exe is: its own name, or the file
// that name beside it resolves to (Debian installs slurmd-wlm and
// slurmstepd-wlm with slurmd and slurmstepd links to them). A binary
// replaced while it runs (an upgrade) reads "<path> (deleted)" in
// /proc/<pid>/exe; its path is compared.
type kinds map[string]map[string]string

func (k kinds) of(exe string) string {
	exe = strings.TrimSuffix(exe, " (deleted)")
	base, dir := filepath.Base(exe), filepath.Dir(exe)
	for _, n := range slurmBinaries {
		if base == n {
			return n
		}
	}
	links, ok := k[dir]
	if !ok {
		links = map[string]string{}
		for _, n := range slurmBinaries {
			if p, err := filepath.EvalSymlinks(filepath.Join(dir, n)); err == nil {
				links[n] = p
			}
		}
		k[dir] = links
	}
	for _, n := range slurmBinaries {
		if links[n] == exe {
			return n
		}
	}
	return ""
}

// SlurmProcs lists Slurm's own processes on this node: root's (real and
// effective uid 0, as the kernel reports them in /proc/<pid>/status, in
// this user namespace) running slurmd or slurmstepd, by the kernel's exe
// link (kinds). comm and argv are the process's own to write (prctl,
// /proc/self/comm; slurmstepd itself rewrites its argv), so neither is
// read; and only root can start a root process. Processes that exit while
// being read are skipped. An error only when /proc cannot be listed.
func SlurmProcs() ([]Proc, error) {
	mount, err := Mountpoint()
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	var out []Proc
	known := kinds{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		exe, err := os.Readlink("/proc/" + e.Name() + "/exe")
		if err != nil {
			continue
		}
		kind := known.of(exe)
		if kind == "" || !rootProc(pid) {
			continue
		}
		cg, err := PathOf(pid)
		if err != nil {
			continue
		}
		out = append(out, Proc{PID: pid, Kind: kind, Exe: exe, Cgroup: filepath.Join(mount, path.Clean("/"+cg))})
	}
	return out, nil
}

// rootProc reports whether pid's real and effective uids are 0.
func rootProc(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
			f := strings.Fields(rest)
			return len(f) >= 2 && f[0] == "0" && f[1] == "0"
		}
	}
	return false
}

// Slurmd is slurmd's own cgroup when it is outside the scope, as systemd
// runs it (slurmd.service): the cgroup of the slurmd whose pid is in
// pidFile (this node's SlurmdPidFile, which only root writes), when that
// pid is one of f.Procs' root slurmd processes (the same exe rule as the
// scope's proof). Any root slurmd would not do: on one machine there may
// be other Slurms' (test clusters, a second slurmd) whose cgroups are not
// this node's to narrow. "" when slurmd runs inside the scope (the scope's
// program covers it), when none runs (no pid file, a stale one), or when
// its cgroup is the mount's root or an ancestor of the scope (the program
// there would judge every other service), in a user's subtree, or inside
// a cgroup named like a scope.
func (f Found) Slurmd(mount, pidFile string) (string, error) {
	if f.Scope == "" {
		return "", nil
	}
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("slurmd's pid file: %w", err)
	}
	if strings.TrimSpace(string(b)) == "" {
		// Made, not yet written: slurmd is starting.
		return "", nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return "", fmt.Errorf("slurmd's pid file %s: %q is not a pid", pidFile, strings.TrimSpace(string(b)))
	}
	for _, p := range f.Procs {
		if p.PID != pid || p.Kind != "slurmd" {
			continue
		}
		if Within(p.Cgroup, f.Scope) || Within(f.Scope, p.Cgroup) {
			return "", nil
		}
		rel, err := filepath.Rel(mount, p.Cgroup)
		if err != nil || rel == "." || strings.HasPrefix(rel, "../") || UserSubtree(rel) != "" ||
			slices.ContainsFunc(strings.Split(rel, "/"), IsScopeName) {
			return "", nil
		}
		return p.Cgroup, nil
	}
	return "", nil
}
