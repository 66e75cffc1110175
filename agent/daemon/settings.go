package daemon

import (
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpufence/gpufence/agent/slurm"
)

// settingsCache re-reads slurm.conf and cgroup.conf only when either
// changed, so a slurmd restarted with another ConstrainDevices is followed
// without an agent restart and without reading files on every step.
type settingsCache struct {
	path string

	mu    sync.Mutex
	stamp [2]time.Time
	val   slurm.Settings
	ok    bool
}

func (c *settingsCache) get() (slurm.Settings, error) {
	stamp := [2]time.Time{mtime(c.path), mtime(filepath.Join(filepath.Dir(c.path), "cgroup.conf"))}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ok && stamp == c.stamp {
		return c.val, nil
	}
	v, err := slurm.ReadSettings(c.path)
	if err != nil {
		return v, err
	}
	c.val, c.stamp, c.ok = v, stamp, true
	return v, nil
}

func mtime(path string) time.Time {
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}
