// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestReopenAfterRename(t *testing.T) {
	opts := testOptions(t)
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Emit(sampleRecords()[0])
	waitFor(t, "first record", func() bool { return p.Stats().Sinks["file"].Written == 1 })
	rotated := opts.File + ".1"
	if err := os.Rename(opts.File, rotated); err != nil {
		t.Fatal(err)
	}
	if err := p.Reopen(); err != nil {
		t.Fatal(err)
	}
	p.Emit(sampleRecords()[1])
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	old, cur := readRecords(t, rotated), readRecords(t, opts.File)
	if len(old) != 1 || old[0].Seq != 1 || len(cur) != 1 || cur[0].Seq != 2 {
		t.Fatalf("rotated file %v, new file %v", old, cur)
	}
	if st, _ := os.Stat(opts.File); st.Mode().Perm() != 0o640 {
		t.Errorf("reopened file mode %v", st.Mode().Perm())
	}
}

func TestPrivilegedFullFilesystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	if err := unix.Mount("gpufence-audit-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64k,mode=0755"); err != nil {
		t.Skipf("cannot mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	// A filler leaves a little room, so the audit file fills up fast.
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, bytes.Repeat([]byte{'x'}, 48<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := testOptions(t)
	opts.File = filepath.Join(dir, "audit", "audit.jsonl")
	opts.RetryInterval = time.Nanosecond
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	emitted := 0
	start := time.Now()
	for p.Stats().Sinks["file"].Failed < 20 {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no write failed on a 64 KiB filesystem: %+v", p.Stats())
		}
		r := sampleRecords()[3]
		r.PID = uint32(1000 + emitted)
		t0 := time.Now()
		p.Emit(r)
		if d := time.Since(t0); d > 100*time.Millisecond {
			t.Fatalf("Emit blocked for %v on a full filesystem", d)
		}
		emitted++
		time.Sleep(time.Millisecond)
	}
	// Enforcement goes on: more records while full must not block either.
	for i := 0; i < 50; i++ {
		r := sampleRecords()[3]
		r.PID = uint32(1000 + i)
		p.Emit(r)
	}
	waitFor(t, "the sink to try the last records", func() bool {
		s := p.Stats()
		f := s.Sinks["file"]
		return f.Written+f.Failed+f.Dropped == s.Emitted
	})
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	p.Emit(sampleRecords()[10])
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	stats := p.Stats()
	recs := readRecords(t, opts.File)
	lost := checkSeqs(t, recs, "file")
	f := stats.Sinks["file"]
	if uint64(len(lost)) != f.Failed+f.Dropped {
		t.Errorf("audit_loss lists %d seqs, sink counted %d failed + %d dropped", len(lost), f.Failed, f.Dropped)
	}
	if uint64(len(recs))+uint64(len(lost)) != stats.Emitted {
		t.Errorf("%d written + %d lost != %d emitted", len(recs), len(lost), stats.Emitted)
	}
	// Each recovery starts with the audit_loss record, then the record that
	// was written first after it; the record emitted after space returned is last.
	losses := 0
	for i, r := range recs {
		if r.Event != EventAuditLoss || r.Loss.Sink != "file" {
			continue
		}
		losses++
		if !strings.Contains(r.Error, syscall.ENOSPC.Error()) {
			t.Errorf("loss record does not name the error: %q", r.Error)
		}
		if i == len(recs)-1 || recs[i+1].Event == EventAuditLoss {
			t.Errorf("audit_loss record %d is not followed by the record it precedes", r.Seq)
		}
	}
	if losses == 0 || recs[len(recs)-1].Event != EventConfigReload {
		t.Fatalf("%d file audit_loss records; last record %s, want config_reload", losses, recs[len(recs)-1].Event)
	}
	t.Logf("emitted %d, written %d, lost %d (failed %d, dropped %d)", stats.Emitted, len(recs), len(lost), f.Failed, f.Dropped)
}

func TestFileWriteErrorKeepsWholeLines(t *testing.T) {
	s, err := openFile(filepath.Join(t.TempDir(), "a.jsonl"), 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	r := sampleRecords()[0]
	r.Seq, r.SchemaVersion, r.Time = 1, "1", time.Now()
	if err := s.Write(&r); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := s.Reopen(); err != nil {
		t.Fatal(err)
	}
	s.f.Close() // next write fails with "file already closed"
	if err := s.Write(&r); err == nil || !errors.Is(err, os.ErrClosed) {
		t.Fatalf("write on a closed file: %v", err)
	}
	s.f = nil
}

// TestFileRefusesSymlink: a symbolic link at the audit path (planted before
// the start, or after logrotate moved the file away) is refused with an
// error that says so, and its target is never written to nor chmod'ed.
func TestFileRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := testOptions(t)
	opts.File = filepath.Join(dir, "audit.jsonl")
	if err := os.Symlink(target, opts.File); err != nil {
		t.Fatal(err)
	}
	_, err := New(opts, nil)
	if err == nil || !strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), opts.File) {
		t.Fatalf("New with a symlink at %s: %v, want an error naming the path and the link", opts.File, err)
	}

	// Reopen after a rotation: the new name is a link now.
	if err := os.Remove(opts.File); err != nil {
		t.Fatal(err)
	}
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := os.Rename(opts.File, opts.File+".1"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, opts.File); err != nil {
		t.Fatal(err)
	}
	if err := p.Reopen(); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("Reopen with a symlink at the path: %v, want the link refused", err)
	}
	p.Emit(sampleRecords()[0])
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(target)
	if err != nil || string(b) != "precious\n" {
		t.Errorf("link target now holds %q (%v)", b, err)
	}
	if st, err := os.Stat(target); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("link target mode %v (%v), want 0600 untouched", st.Mode().Perm(), err)
	}

	// A named pipe is refused too, without blocking on it.
	fifo := filepath.Join(dir, "fifo.jsonl")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	opts.File = fifo
	if _, err := New(opts, nil); err == nil || !strings.Contains(err.Error(), fifo) || !strings.Contains(err.Error(), "named pipe") {
		t.Errorf("New with a FIFO at the path: %v, want it refused", err)
	}
}
