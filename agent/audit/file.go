// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// fileSink appends one JSON object per line. A write that fails half way
// (disk full) is cut back, so the file only ever holds whole lines.
type fileSink struct {
	path string
	mu   sync.Mutex
	f    *os.File
	size int64
	// chain links each record to the one written before it in the same
	// run (chain.go); it survives Reopen, so a run spans rotated files.
	chain chainState
}

func openFile(path string) (*fileSink, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create directory of %s: %w", path, err)
	}
	s := &fileSink{path: path}
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
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o640)
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
	// The umask may have narrowed the mode; an existing file keeps 0640 too.
	if err := f.Chmod(0o640); err != nil {
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

func (s *fileSink) Name() string { return "file" }

func (s *fileSink) Write(r *Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, hash, err := chainLine(r, s.chain.prev(r.RunID))
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
	s.chain.advance(r.RunID, hash)
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
