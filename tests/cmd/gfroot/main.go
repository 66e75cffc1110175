// SPDX-License-Identifier: Apache-2.0

// Command gfroot runs a command chrooted into a Debian root, as the test
// cluster runs another release's Slurm daemons and clients against this
// host's kernel and cgroup tree (tests/cluster):
//
//	gfroot -root DIR [-bind PATH]... [-user UID:GID[:G1,G2...]] [-chdir DIR] -- CMD [ARG]...
//
// It enters a mount namespace of its own (private propagation, so nothing it
// mounts is ever seen outside, and every mount goes when the last process in
// the namespace exits), binds /proc, /sys and /dev recursively, this host's
// /etc/passwd, /etc/group and /etc/hosts (the same users on both sides) and
// each -bind folder at the same path (or, with -devnode, a /dev of its own
// holding fake device nodes; -overlay puts a folder over one inside, such as
// a fake /proc/driver/nvidia), makes the root the namespace's root
// (pivot_root, not chroot: a chrooted process may not create user
// namespaces, as Slurm's namespace/linux does), drops to -user and execs CMD,
// so that the PID the caller started is CMD's. Root only; the environment is
// passed as it is.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var binds, nodes, overlays list
	root := flag.String("root", "", "the root folder to chroot into")
	flag.Var(&binds, "bind", "a folder of this host to bind at the same path inside (repeatable)")
	flag.Var(&nodes, "devnode", "NAME:MAJOR:MINOR: give the root a /dev of its own (a tmpfs with this host's null, zero, random, tty, pts and shm) holding this character device (repeatable)")
	flag.Var(&overlays, "overlay", "SRC:DST: bind the host folder SRC over DST inside the root, after /proc and /sys (repeatable; e.g. a fake /proc/driver)")
	usr := flag.String("user", "", "UID:GID[:G1,G2,...] to run CMD as (default: stay root)")
	chdir := flag.String("chdir", "/", "working folder inside the root")
	oneCPU := flag.Bool("one-cpu", false, "run on one CPU (the first this process may use): the namespace is made there, and so are the ones CMD makes (see run)")
	flag.Parse()
	if *root == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: gfroot -root DIR [-bind PATH]... [-user UID:GID[:G,...]] [-chdir DIR] -- CMD [ARG]...")
		os.Exit(2)
	}
	if err := run(*root, binds, nodes, overlays, *usr, *chdir, *oneCPU, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "gfroot:", err)
		os.Exit(127)
	}
}

func run(root string, binds, nodes, overlays []string, usr, chdir string, oneCPU bool, argv []string) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "sh")); err != nil {
		return fmt.Errorf("%s is not a root filesystem: %w", root, err)
	}
	// The namespace and the chroot belong to this thread, which then execs.
	runtime.LockOSThread()
	if oneCPU {
		// Linux 6.18 hands out namespace ids in per-CPU batches, and
		// refuses to bind a mount namespace's file (/proc/PID/ns/mnt)
		// whose id is not above the caller's namespace's, as a loop
		// (mnt_ns_loop: EINVAL). A namespace made on the other CPU than
		// this one can get a lower id though made later: Slurm's
		// namespace/linux then fails a job in one of two. Made on one CPU,
		// the ids rise. The affinity lasts through exec.
		if err := pinOneCPU(); err != nil {
			return err
		}
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// The root becomes a mount of its own, so that it can be the mount
	// namespace's root (pivot_root below): a chrooted process may not make
	// user namespaces, which Slurm 25.11's namespace/linux does.
	if err := bind(root, root, false); err != nil {
		return err
	}
	for _, d := range []string{"/proc", "/sys"} {
		if err := bind(d, filepath.Join(root, d), true); err != nil {
			return err
		}
	}
	if len(nodes) == 0 {
		if err := bind("/dev", filepath.Join(root, "dev"), true); err != nil {
			return err
		}
	} else if err := ownDev(filepath.Join(root, "dev"), nodes); err != nil {
		return err
	}
	for _, o := range overlays {
		src, dst, ok := strings.Cut(o, ":")
		if !ok || !filepath.IsAbs(src) || !filepath.IsAbs(dst) {
			return fmt.Errorf("-overlay %q: want SRC:DST, both absolute", o)
		}
		if err := bind(src, filepath.Join(root, dst), false); err != nil {
			return err
		}
	}
	for _, f := range []string{"/etc/passwd", "/etc/group", "/etc/hosts"} {
		dst := filepath.Join(root, f)
		if _, err := os.Stat(dst); errors.Is(err, os.ErrNotExist) {
			if err := os.WriteFile(dst, nil, 0o644); err != nil {
				return err
			}
		}
		if err := bind(f, dst, false); err != nil {
			return err
		}
	}
	for _, b := range binds {
		if !filepath.IsAbs(b) {
			return fmt.Errorf("-bind %s: not an absolute path", b)
		}
		dst := filepath.Join(root, b)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		// Not recursive: a bind folder may hold the root itself.
		if err := bind(b, dst, false); err != nil {
			return err
		}
	}
	if err := unix.Chdir(root); err != nil {
		return err
	}
	// pivot_root(".", "."): the old root is stacked under the new one and
	// then detached; nothing outside the root stays reachable.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root to %s: %w", root, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := unix.Chdir(chdir); err != nil {
		return fmt.Errorf("chdir %s inside %s: %w", chdir, root, err)
	}
	if usr != "" {
		if err := drop(usr); err != nil {
			return err
		}
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		for _, d := range filepath.SplitList(os.Getenv("PATH")) {
			if st, err := os.Stat(filepath.Join(d, path)); err == nil && st.Mode().IsRegular() {
				path = filepath.Join(d, path)
				break
			}
		}
	}
	err = syscall.Exec(path, argv, os.Environ())
	return fmt.Errorf("exec %s inside %s: %w", argv[0], root, err)
}

// ownDev mounts a tmpfs at dev with this host's basic devices bound in and
// the given character devices made there; none of it is seen outside.
func ownDev(dev string, nodes []string) error {
	if err := unix.Mount("gfroot-dev", dev, "tmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
		return fmt.Errorf("mount a tmpfs at %s: %w", dev, err)
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		dst := filepath.Join(dev, n)
		if err := os.WriteFile(dst, nil, 0o666); err != nil {
			return err
		}
		if err := bind("/dev/"+n, dst, false); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return err
		}
	}
	if err := bind("/dev/pts", filepath.Join(dev, "pts"), false); err != nil {
		return err
	}
	if err := unix.Mount("gfroot-shm", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount %s/shm: %w", dev, err)
	}
	for link, target := range map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, filepath.Join(dev, link)); err != nil {
			return err
		}
	}
	for _, spec := range nodes {
		f := strings.Split(spec, ":")
		if len(f) != 3 || f[0] == "" || strings.Contains(f[0], "..") {
			return fmt.Errorf("-devnode %q: want NAME:MAJOR:MINOR", spec)
		}
		major, err1 := strconv.ParseUint(f[1], 10, 32)
		minor, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("-devnode %q: want numbers", spec)
		}
		p := filepath.Join(dev, f[0])
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(uint32(major), uint32(minor)))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		if err := os.Chmod(p, 0o666); err != nil {
			return err
		}
	}
	return nil
}

func bind(src, dst string, recursive bool) error {
	flags := uintptr(unix.MS_BIND)
	if recursive {
		flags |= unix.MS_REC
	}
	if err := unix.Mount(src, dst, "", flags, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, dst, err)
	}
	return nil
}

// drop sets the supplementary groups, gid and uid (of every thread: Go's
// syscall package does that), then CMD is exec'd.
func drop(spec string) error {
	f := strings.Split(spec, ":")
	if len(f) < 2 || len(f) > 3 {
		return fmt.Errorf("-user %q: want UID:GID[:G1,G2,...]", spec)
	}
	uid, err1 := strconv.Atoi(f[0])
	gid, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return fmt.Errorf("-user %q: want numbers", spec)
	}
	groups := []int{}
	if len(f) == 3 && f[2] != "" {
		for _, g := range strings.Split(f[2], ",") {
			n, err := strconv.Atoi(g)
			if err != nil {
				return fmt.Errorf("-user %q: group %q: %w", spec, g, err)
			}
			groups = append(groups, n)
		}
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("setresgid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresuid %d: %w", uid, err)
	}
	return nil
}

// pinOneCPU keeps this thread on the first CPU of its affinity mask.
func pinOneCPU() error {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return fmt.Errorf("read CPU affinity: %w", err)
	}
	for cpu := 0; cpu < len(set)*64; cpu++ {
		if set.IsSet(cpu) {
			var one unix.CPUSet
			one.Set(cpu)
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				return fmt.Errorf("keep to CPU %d: %w", cpu, err)
			}
			return nil
		}
	}
	return errors.New("no CPU in this process's affinity mask")
}
