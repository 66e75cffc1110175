// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
)

// TestUser is the unprivileged user that jobs run as.
const TestUser = "gftest"

// testUID is the uid preferred for TestUser when it is free.
const testUID = 2951

const mungeKey = "/etc/munge/munge.key"

// packages are the Debian packages the harness needs, and the binary that
// proves each one is installed.
var packages = []struct{ pkg, bin string }{
	{"slurmctld", "/usr/sbin/slurmctld"},
	{"slurmd", "/usr/sbin/slurmd"},
	{"slurm-client", "/usr/bin/srun"},
	{"libslurm-dev", "/usr/include/slurm/spank.h"},
	{"munge", "/usr/sbin/munged"},
	{"gcc", "/usr/bin/gcc"},
	{"libc6-dev", "/usr/include/stdio.h"},
}

// Setup records what Ensure changed on the machine, so that Teardown undoes
// exactly that and nothing else.
type Setup struct {
	Installed       []string `json:"installed,omitempty"` // packages are left installed
	CreatedUser     bool     `json:"created_user"`
	CreatedMungeKey bool     `json:"created_munge_key"`
	// Holder is this user of the setup in the shared registry (see
	// registry.go): the user and key are removed only when the last
	// holder tears down, so concurrent test binaries never pull them from
	// under each other.
	Holder string `json:"holder,omitempty"`
}

// Ensure installs Slurm and munge when missing, creates a munge key when
// there is none and creates TestUser when missing. It needs root.
func Ensure(ctx context.Context, logf func(string, ...any)) (*Setup, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("cluster.Ensure needs root")
	}
	reg, err := lockRegistry()
	if err != nil {
		return nil, err
	}
	defer reg.unlock()
	s := &Setup{Holder: processHolder()}
	var missing []string
	for _, p := range packages {
		if _, err := os.Stat(p.bin); err != nil {
			missing = append(missing, p.pkg)
		}
	}
	if len(missing) > 0 {
		logf("installing %s", strings.Join(missing, " "))
		env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := runCmd(ctx, env, "apt-get", "update"); err != nil {
			return nil, fmt.Errorf("apt-get update: %w\n%s", err, lastLines(out, 30))
		}
		args := append([]string{"install", "-y", "--no-install-recommends"}, missing...)
		if out, err := runCmd(ctx, env, "apt-get", args...); err != nil {
			return nil, fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, lastLines(out, 30))
		}
		s.Installed = missing
	}
	if _, err := os.Stat(mungeKey); os.IsNotExist(err) {
		if err := createMungeKey(); err != nil {
			return nil, err
		}
		logf("created %s", mungeKey)
		s.CreatedMungeKey = true
		reg.st.CreatedMungeKey = true
	}
	if _, err := user.Lookup(TestUser); err != nil {
		args := []string{"-M", "-s", "/bin/bash", "-U"}
		if _, err := user.LookupId(strconv.Itoa(testUID)); err != nil {
			args = append(args, "-u", strconv.Itoa(testUID))
		}
		args = append(args, TestUser)
		if out, err := runCmd(ctx, nil, "useradd", args...); err != nil {
			return nil, fmt.Errorf("useradd %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		logf("created user %s", TestUser)
		s.CreatedUser = true
		reg.st.CreatedUser = true
	}
	reg.add(s.Holder)
	return s, reg.save()
}

func createMungeKey() error {
	mu, err := user.Lookup("munge")
	if err != nil {
		return fmt.Errorf("create munge key: %w", err)
	}
	uid, _ := strconv.Atoi(mu.Uid)
	gid, _ := strconv.Atoi(mu.Gid)
	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("create munge key: %w", err)
	}
	if err := os.MkdirAll("/etc/munge", 0o700); err != nil {
		return fmt.Errorf("create munge key: %w", err)
	}
	f, err := os.OpenFile(mungeKey, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o400)
	if err != nil {
		return fmt.Errorf("create munge key: %w", err)
	}
	_, werr := f.Write(key)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(mungeKey)
		return fmt.Errorf("create munge key: %v %v", werr, cerr)
	}
	return os.Chown(mungeKey, uid, gid)
}

// Teardown removes the user and munge key that Ensure created; packages it
// installed stay (removing them could take what other work relies on).
func (s *Setup) Teardown(logf func(string, ...any)) error {
	if s == nil {
		return nil
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	reg, err := lockRegistry()
	if err != nil {
		return err
	}
	defer reg.unlock()
	reg.remove(s.Holder)
	s.Holder = ""
	if others := reg.live(); len(others) > 0 {
		logf("test user kept: still used by %s", strings.Join(others, ", "))
		return reg.save()
	}
	var errs []error
	if reg.st.CreatedUser {
		if out, err := runCmd(context.Background(), nil, "userdel", TestUser); err != nil {
			errs = append(errs, fmt.Errorf("userdel %s: %w\n%s", TestUser, err, out))
		} else {
			logf("removed user %s", TestUser)
			reg.st.CreatedUser = false
		}
	}
	if reg.st.CreatedMungeKey {
		if err := os.Remove(mungeKey); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		} else {
			logf("removed %s", mungeKey)
			reg.st.CreatedMungeKey = false
		}
	}
	s.CreatedUser, s.CreatedMungeKey = false, false
	errs = append(errs, reg.save())
	return joinErrs(errs)
}

// HoldFor moves this setup's hold from the calling process to a cluster
// root that outlives it (gfcluster up): the hold lasts while root exists.
func (s *Setup) HoldFor(root string) error {
	reg, err := lockRegistry()
	if err != nil {
		return err
	}
	defer reg.unlock()
	reg.remove(s.Holder)
	s.Holder = "root:" + root
	reg.add(s.Holder)
	return reg.save()
}

func runCmd(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = env
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
