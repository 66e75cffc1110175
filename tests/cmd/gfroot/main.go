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
// each -bind folder at the same path, chroots, drops to -user and execs CMD,
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
	var binds list
	root := flag.String("root", "", "the root folder to chroot into")
	flag.Var(&binds, "bind", "a folder of this host to bind at the same path inside (repeatable)")
	usr := flag.String("user", "", "UID:GID[:G1,G2,...] to run CMD as (default: stay root)")
	chdir := flag.String("chdir", "/", "working folder inside the root")
	flag.Parse()
	if *root == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: gfroot -root DIR [-bind PATH]... [-user UID:GID[:G,...]] [-chdir DIR] -- CMD [ARG]...")
		os.Exit(2)
	}
	if err := run(*root, binds, *usr, *chdir, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "gfroot:", err)
		os.Exit(127)
	}
}

func run(root string, binds []string, usr, chdir string, argv []string) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "sh")); err != nil {
		return fmt.Errorf("%s is not a root filesystem: %w", root, err)
	}
	// The namespace and the chroot belong to this thread, which then execs.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	for _, d := range []string{"/proc", "/sys", "/dev"} {
		if err := bind(d, filepath.Join(root, d), true); err != nil {
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
	if err := unix.Chroot(root); err != nil {
		return fmt.Errorf("chroot %s: %w", root, err)
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
