// SPDX-License-Identifier: Apache-2.0

// Package failopen reads the SPANK plugin's fail-open spool: the steps that
// failure=open let run WITHOUT GPU isolation because no agent answered.
// Each becomes a step_unfiltered audit record once an agent runs again.
package failopen

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/users"
)

// failOpenLine is one line the SPANK plugin appends to its fail-open spool
// (plugstack failure=open) when it let a step run WITHOUT GPU isolation
// because no agent answered; spank/plugin/spool.c writes it.
type failOpenLine struct {
	Time   string `json:"time"`
	JobID  uint32 `json:"job_id"`
	StepID string `json:"step_id"`
	UID    uint32 `json:"uid"`
	Node   string `json:"node"`
	Reason string `json:"reason"`
}

// Recorder receives the records.
type Recorder interface {
	Emit(r audit.Record)
}

// Spool is the plugin's spool at Path.
type Spool struct {
	Path     string
	Log      *slog.Logger
	Recorder Recorder
	Users    *users.Cache
	// warned: the spool's bad ownership was reported; only one goroutine
	// (reconcile's) reads the spool.
	warned bool
}

// Ingest turns the spool's lines into step_unfiltered audit records, so a
// step that ran unfiltered is in the trail once an agent runs again.
//
// No line is lost or read twice (spank/plugin/spool.h): the file is renamed
// to Path+".ingest" first, so the plugin's next append starts a new one;
// then Ingest takes an exclusive flock on it, which waits for every writer
// that opened it before the rename and still holds its shared lock for its
// one write. A writer that locks it later sees the name lead elsewhere and
// opens the new file. A taken file whose lock could not be had in time is
// read by the next Ingest, before the spool is taken again.
func (s *Spool) Ingest() {
	path := s.Path
	if path == "" {
		return
	}
	taken := path + ".ingest"
	if _, err := os.Lstat(taken); err != nil {
		if !s.trusted(path) {
			return
		}
		if err := os.Rename(path, taken); err != nil {
			s.Log.Error("take the fail-open spool", "file", path, "err", err)
			return
		}
	}
	if !s.trusted(taken) {
		return
	}
	s.read(path, taken)
}

// lockWait bounds how long Ingest waits for the plugin's writers, each of
// which holds its lock for one write(2) of one line.
var lockWait = 5 * time.Second

// read turns the lines of taken (the renamed spool) into records and
// removes it; a file with a bad line is kept under another name for a
// person to look at.
func (s *Spool) read(path, taken string) {
	f, err := os.OpenFile(taken, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		s.Log.Error("read the fail-open spool", "file", taken, "err", err)
		return
	}
	defer f.Close()
	for deadline := time.Now().Add(lockWait); ; time.Sleep(2 * time.Millisecond) {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			s.Log.Error("lock the fail-open spool", "file", taken, "err", err)
			return
		}
		if time.Now().After(deadline) {
			s.Log.Error("a writer holds the fail-open spool's lock; it is read on the next pass", "file", taken, "waited", lockWait)
			return
		}
	}
	sc := bufio.NewScanner(f)
	n, bad := 0, 0
	for sc.Scan() {
		var l failOpenLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.JobID == 0 {
			s.Log.Error("bad line in the fail-open spool; the file is kept", "file", taken, "line", sc.Text())
			bad++
			continue
		}
		n++
		s.emit(audit.EventStepUnfiltered, audit.SeverityError,
			fmt.Sprintf("job %d step %s ran WITHOUT GPU isolation at %s on %s: failure=open and the agent was unreachable (%s)", l.JobID, l.StepID, l.Time, l.Node, l.Reason),
			func(r *audit.Record) {
				r.JobID, r.StepID, r.UID, r.User, r.Reason = l.JobID, l.StepID, audit.UID(l.UID), s.Users.Name(l.UID), l.Reason
			})
	}
	if err := sc.Err(); err != nil {
		// Its lines so far are recorded; keep it aside, not to be read twice.
		bad++
		s.Log.Error("read the fail-open spool; the file is kept", "file", taken, "err", err)
	}
	if n > 0 {
		s.Log.Warn("steps that ran without GPU isolation were recorded", "count", n, "spool", path)
	}
	if bad == 0 {
		err = os.Remove(taken)
	} else {
		kept := fmt.Sprintf("%s.%d.bad", path, time.Now().UnixNano())
		if err = os.Rename(taken, kept); err == nil {
			s.Log.Error("fail-open spool kept for a person to read", "file", kept, "bad_lines", bad)
		}
	}
	if err != nil {
		s.Log.Error("put the read fail-open spool away", "file", taken, "err", err)
	}
}

// trusted says whether path is the plugin's: only root (the plugin in
// slurmstepd) writes the spool. A file anyone else made, or a link, would
// let them write audit records in the agent's name: it is left alone and
// reported once. (The agent's own uid is accepted too, for tests run
// without root.)
func (s *Spool) trusted(path string) bool {
	fi, err := os.Lstat(path)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || !ok || (st.Uid != 0 && st.Uid != uint32(os.Geteuid())) || fi.Mode().Perm()&0o022 != 0 {
		if !s.warned {
			s.warned = true
			owner := -1
			if ok {
				owner = int(st.Uid)
			}
			s.Log.Error("fail-open spool not read: it must be a regular file owned by root and writable only by it; steps it may list are not in the audit trail",
				"file", path, "mode", fi.Mode().String(), "owner_uid", owner)
		}
		return false
	}
	s.warned = false
	return true
}

func (s *Spool) emit(ev audit.Event, sev audit.Severity, msg string, fill func(*audit.Record)) {
	r := audit.Record{Event: ev, Severity: sev, Message: msg}
	fill(&r)
	s.Recorder.Emit(r)
}
