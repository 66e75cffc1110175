// SPDX-License-Identifier: Apache-2.0

// Package cgwatch tells when cgroup directories are removed, through
// inotify: Slurm removes a step's cgroup when the step ends, so the agent
// learns of a step's end from the kernel, with no call from slurmstepd
// (which would cost every step's end an exchange) and without waiting for
// its periodic reconcile. It also tells when a cgroup is made again at a
// watched path: systemd makes slurmd.service anew at every slurmd restart.
package cgwatch

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watcher watches cgroup directories, each named by its cgroup id.
type Watcher struct {
	f    *os.File
	gone chan uint64
	made chan string

	mu   sync.Mutex
	byWD map[int32]uint64
	byID map[uint64]int32
	// parents are the directories watched for a child made or written
	// (WatchMade): by watch, the parent and the children's names.
	parents map[int32]parentWatch
	done    chan struct{}
}

// New starts a watcher; Gone delivers the id of each watched cgroup once
// it is removed.
func New() (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &Watcher{
		f:    os.NewFile(uintptr(fd), "inotify"),
		gone: make(chan uint64, 1024),
		made: make(chan string, 1),
		byWD: map[int32]uint64{}, byID: map[uint64]int32{}, parents: map[int32]parentWatch{},
		done: make(chan struct{}),
	}
	go w.read()
	return w, nil
}

// Gone delivers the ids of removed cgroups. It is closed by Close.
func (w *Watcher) Gone() <-chan uint64 { return w.gone }

type parentWatch struct {
	dir   string
	names map[string]bool
}

// Made delivers a path WatchMade watches each time it is made or written
// (coalesced: one pending at most). It is closed by Close.
func (w *Watcher) Made() <-chan string { return w.made }

// WatchMade watches the parent of path for path being made (a cgroup
// directory systemd makes anew) or written (a pid file slurmd writes at
// its start). Watches add up; watching a path twice is one watch.
func (w *Watcher) WatchMade(path string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	raw, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	parent, name := filepath.Dir(path), filepath.Base(path)
	var wd int
	var werr error
	if err := raw.Control(func(fd uintptr) {
		wd, werr = unix.InotifyAddWatch(int(fd), parent, unix.IN_CREATE|unix.IN_MODIFY|unix.IN_MOVED_TO|unix.IN_ONLYDIR)
	}); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("watch %s for %s: %w", parent, name, werr)
	}
	p, ok := w.parents[int32(wd)]
	if !ok {
		p = parentWatch{dir: parent, names: map[string]bool{}}
		w.parents[int32(wd)] = p
	}
	p.names[name] = true
	return nil
}

// Add watches dir, the cgroup id. A dir already gone is an error.
func (w *Watcher) Add(dir string, id uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.byID[id]; ok {
		return nil
	}
	raw, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	var wd int
	var werr error
	if err := raw.Control(func(fd uintptr) {
		wd, werr = unix.InotifyAddWatch(int(fd), dir, unix.IN_DELETE_SELF|unix.IN_ONLYDIR)
	}); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("watch cgroup %s: %w", dir, werr)
	}
	// A directory made again at the same path is another cgroup: the
	// watch is on the inode, so check it is still the one meant.
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Ino != id {
		w.rmLocked(int32(wd))
		if err == nil {
			err = fmt.Errorf("cgroup id %d, not %d", st.Ino, id)
		}
		return fmt.Errorf("watch cgroup %s: %w", dir, err)
	}
	w.byWD[int32(wd)] = id
	w.byID[id] = int32(wd)
	return nil
}

// Remove stops watching the cgroup id.
func (w *Watcher) Remove(id uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wd, ok := w.byID[id]
	if !ok {
		return
	}
	delete(w.byID, id)
	delete(w.byWD, wd)
	w.rmLocked(wd)
}

func (w *Watcher) rmLocked(wd int32) {
	if raw, err := w.f.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) { unix.InotifyRmWatch(int(fd), uint32(wd)) })
	}
}

// Len is how many cgroups are watched.
func (w *Watcher) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.byID)
}

// Close stops the watcher and closes Gone.
func (w *Watcher) Close() error {
	err := w.f.Close()
	<-w.done
	return err
}

func (w *Watcher) read() {
	defer close(w.done)
	defer close(w.gone)
	defer close(w.made)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			// Closed, or broken: the periodic reconcile still finds
			// what went.
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 && off+unix.SizeofInotifyEvent+int(ev.Len) <= n {
				b := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				name = string(bytes.TrimRight(b, "\x00"))
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&(unix.IN_CREATE|unix.IN_MODIFY|unix.IN_MOVED_TO) != 0 {
				w.mu.Lock()
				p, ok := w.parents[ev.Wd]
				ok = ok && p.names[name]
				w.mu.Unlock()
				if ok {
					select {
					case w.made <- filepath.Join(p.dir, name):
					default:
					}
				}
				continue
			}
			if ev.Mask&(unix.IN_DELETE_SELF|unix.IN_IGNORED) == 0 {
				continue
			}
			w.mu.Lock()
			id, ok := w.byWD[ev.Wd]
			if ok {
				delete(w.byWD, ev.Wd)
				delete(w.byID, id)
			}
			w.mu.Unlock()
			if ok {
				w.gone <- id
			}
		}
	}
}
