// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The registry is shared by every harness user on the machine (test binaries
// running in parallel, gfbench, gfcluster): who holds the setup, and whether
// the harness created the test user and munge key.
const (
	registryLock = "/run/lock/gpufence-test-setup.lock"
	registryFile = "/run/lock/gpufence-test-setup.json"
)

type registryState struct {
	Holders         []string `json:"holders"`
	CreatedUser     bool     `json:"created_user"`
	CreatedMungeKey bool     `json:"created_munge_key"`
}

type registry struct {
	f  *os.File
	st registryState
}

func lockRegistry() (*registry, error) {
	f, err := os.OpenFile(registryLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", registryLock, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", registryLock, err)
	}
	r := &registry{f: f}
	b, err := os.ReadFile(registryFile)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		r.unlock()
		return nil, err
	default:
		if err := json.Unmarshal(b, &r.st); err != nil {
			r.unlock()
			return nil, fmt.Errorf("%s: %w", registryFile, err)
		}
	}
	r.st.Holders = r.live()
	return r, nil
}

func (r *registry) unlock() { r.f.Close() }

func (r *registry) add(h string) {
	if !slices.Contains(r.st.Holders, h) {
		r.st.Holders = append(r.st.Holders, h)
	}
}

func (r *registry) remove(h string) {
	r.st.Holders = slices.DeleteFunc(r.st.Holders, func(x string) bool { return x == h })
}

// live returns the holders that still exist: a process with the same start
// time, or a cluster root folder.
func (r *registry) live() []string {
	var out []string
	for _, h := range r.st.Holders {
		if holderAlive(h) {
			out = append(out, h)
		}
	}
	return out
}

func (r *registry) save() error {
	if len(r.st.Holders) == 0 && !r.st.CreatedUser && !r.st.CreatedMungeKey {
		if err := os.Remove(registryFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(r.st)
	if err != nil {
		return err
	}
	return os.WriteFile(registryFile, b, 0o600)
}

func processHolder() string {
	pid := os.Getpid()
	st, _ := procStartTime(pid)
	return fmt.Sprintf("pid:%d:%d", pid, st)
}

func holderAlive(h string) bool {
	switch kind, rest, _ := strings.Cut(h, ":"); kind {
	case "pid":
		p, t, _ := strings.Cut(rest, ":")
		pid, err1 := strconv.Atoi(p)
		want, err2 := strconv.ParseUint(t, 10, 64)
		if err1 != nil || err2 != nil {
			return false
		}
		got, err := procStartTime(pid)
		return err == nil && got == want
	case "root":
		_, err := os.Stat(rest)
		return err == nil
	}
	return false
}
