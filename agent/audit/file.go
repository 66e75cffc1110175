// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// fileSink appends one JSON object per line. A write that fails half way
// (disk full) is cut back, so the file only ever holds whole lines.
type fileSink struct {
	name string
	path string
	// ocsf: the lines are OCSF events (OCSF), not chained records.
	ocsf bool
	// mode and gid are what the file gets at every open (gid -1: root's
	// group, as created).
	mode os.FileMode
	gid  int
	mu   sync.Mutex
	f    *os.File
	size int64
	// chain links each record to the one written before it in the same
	// run (chain.go); it survives Reopen, so a run spans rotated files.
	chain chainState
}

// DefaultFileMode is the audit file's mode unless configured otherwise.
const DefaultFileMode os.FileMode = 0o640

// CheckFileMode refuses modes that would let anyone but root change the
// audit file, run it, or let every user read it (user names, commands):
// 0600 or 0640 (gpufence doctor flags a world-readable file too).
func CheckFileMode(m os.FileMode) error {
	if m&^0o640 != 0 || m&0o600 != 0o600 {
		return fmt.Errorf("mode %04o: the audit file must be 0600 or 0640: readable by its group at most, never writable by another or executable", uint32(m))
	}
	return nil
}

// Sink names of the JSON Lines file and the OCSF file.
const (
	sinkFile     = "file"
	sinkOCSFFile = "ocsf_file"
)

func openFile(path string, mode os.FileMode, gid int) (*fileSink, error) {
	return openLineFile(sinkFile, path, mode, gid, false)
}

// openOCSFFile opens the OCSF file: the same handling as the JSON Lines
// file (mode, group, O_NOFOLLOW, reopen), one OCSF event per line, no
// chain (gpufence audit verify checks the JSON Lines file).
func openOCSFFile(path string, mode os.FileMode, gid int) (*fileSink, error) {
	return openLineFile(sinkOCSFFile, path, mode, gid, true)
}

func openLineFile(name, path string, mode os.FileMode, gid int, ocsf bool) (*fileSink, error) {
	if mode == 0 {
		mode = DefaultFileMode
	}
	if err := CheckFileMode(mode); err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create directory of %s: %w", path, err)
	}
	if gid >= 0 && mode&0o040 != 0 {
		if err := groupReachable(dir, gid); err != nil {
			return nil, err
		}
	}
	s := &fileSink{name: name, path: path, ocsf: ocsf, mode: mode, gid: gid}
	if err := s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

// open opens the file without following a symbolic link: whoever could
// plant one at the path would have the agent (root) append to, and chmod,
// a file of their choosing. A path that is not a regular file is refused
// too.
func (s *fileSink) open() error {
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, s.mode)
	if errors.Is(err, syscall.ELOOP) {
		return fmt.Errorf("open %s: it is a symbolic link; the audit file must be a regular file, not a link (refused: O_NOFOLLOW)", s.path)
	}
	if err != nil {
		if st, lerr := os.Lstat(s.path); lerr == nil && !st.Mode().IsRegular() {
			return fmt.Errorf("open %s: it is a %s, not a regular file: %w", s.path, fileKind(st.Mode()), err)
		}
		return fmt.Errorf("open %s: %w", s.path, err)
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		if err != nil {
			return fmt.Errorf("stat %s: %w", s.path, err)
		}
		return fmt.Errorf("open %s: it is a %s, not a regular file", s.path, fileKind(st.Mode()))
	}
	// The umask may have narrowed the mode; an existing file (logrotate's
	// create) gets the mode and group too.
	if s.gid >= 0 {
		if err := f.Chown(-1, s.gid); err != nil {
			f.Close()
			return fmt.Errorf("chown %s to group %d: %w", s.path, s.gid, err)
		}
	}
	if err := f.Chmod(s.mode); err != nil {
		f.Close()
		return fmt.Errorf("chmod %s: %w", s.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("stat %s: %w", s.path, err)
	}
	s.f, s.size = f, st.Size()
	return nil
}

// groupReachable lets group gid into dir, the audit file's folder, unless
// anyone may pass it already: a folder owned by root gets that group and
// g+rx (0750 as the agent creates it). A folder owned by another user is
// refused rather than changed.
func groupReachable(dir string, gid int) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st.Mode().Perm()&0o001 != 0 || (int(sys.Gid) == gid && st.Mode().Perm()&0o050 == 0o050) {
		return nil
	}
	if sys.Uid != 0 {
		return fmt.Errorf("the audit folder %s belongs to uid %d, not root: not changing its group to %d (give it group %d and g+rx, or o+x, yourself)", dir, sys.Uid, gid, gid)
	}
	if err := os.Chown(dir, 0, gid); err != nil {
		return fmt.Errorf("chown %s to root:%d: %w", dir, gid, err)
	}
	if err := os.Chmod(dir, (st.Mode().Perm()|0o050)&^0o020); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	return nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeDevice != 0:
		return "device"
	case m.IsDir():
		return "directory"
	}
	return "special file (" + m.String() + ")"
}

func (s *fileSink) Name() string { return s.name }

func (s *fileSink) Write(r *Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b []byte
	var hash string
	var err error
	if s.ocsf {
		b, err = OCSF(r)
		b = append(b, '\n')
	} else {
		b, hash, err = chainLine(r, s.chain.prev(r.RunID))
	}
	if err != nil {
		return fmt.Errorf("encode record %d: %w", r.Seq, err)
	}
	if s.f == nil {
		if err := s.open(); err != nil {
			return err
		}
	}
	n, err := s.f.Write(b)
	if err != nil {
		if n > 0 {
			// Keep whole lines only; a truncate needs no free space.
			_ = s.f.Truncate(s.size)
		}
		return fmt.Errorf("write %s: %w", s.path, err)
	}
	s.size += int64(n)
	if !s.ocsf {
		s.chain.advance(r.RunID, hash)
	}
	return nil
}

// Reopen closes the file and opens the path again, for logrotate.
func (s *fileSink) Reopen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
	return s.open()
}

func (s *fileSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}

// lookupGroup resolves a group name (through NSS) or number.
func lookupGroup(name string) (int, error) {
	if n, err := strconv.ParseUint(name, 10, 31); err == nil {
		return int(n), nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("group %q: %w", Printable(name), err)
	}
	n, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("group %q has gid %q", Printable(name), g.Gid)
	}
	return n, nil
}
