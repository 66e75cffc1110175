// SPDX-License-Identifier: Apache-2.0

// Package failopen reads the SPANK plugin's fail-open spool: the steps that
// failure=open let run WITHOUT GPU isolation because no agent answered.
// Each becomes a step_unfiltered audit record once an agent runs again.
package failopen

import (
	"bufio"
	"encoding/json"
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
// because no agent answered; spank/goclient/spool.go writes it.
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
// step that ran unfiltered is in the trail once an agent runs again. The
// file is renamed first, so the plugin's next append starts a new one and
// no line is read twice.
func (s *Spool) Ingest() {
	path := s.Path
	if path == "" {
		return
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return
	}
	// Only root (the plugin in slurmstepd) writes the spool. A file anyone
	// else made, or a link, would let them write audit records in the
	// agent's name: it is left alone and reported. (The agent's own uid is
	// accepted too, for tests run without root.)
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
		return
	}
	s.warned = false
	taken := fmt.Sprintf("%s.%d.ingest", path, time.Now().UnixNano())
	if err := os.Rename(path, taken); err != nil {
		s.Log.Error("take the fail-open spool", "file", path, "err", err)
		return
	}
	// An append that opened the file just before the rename lands in the
	// renamed file; let it finish.
	time.Sleep(100 * time.Millisecond)
	f, err := os.OpenFile(taken, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		s.Log.Error("read the fail-open spool", "file", taken, "err", err)
		return
	}
	defer f.Close()
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
		s.Log.Error("read the fail-open spool", "file", taken, "err", err)
		return
	}
	s.Log.Warn("steps that ran without GPU isolation were recorded", "count", n, "spool", path)
	if bad == 0 {
		f.Close()
		os.Remove(taken)
	}
}

func (s *Spool) emit(ev audit.Event, sev audit.Severity, msg string, fill func(*audit.Record)) {
	r := audit.Record{Event: ev, Severity: sev, Message: msg}
	fill(&r)
	s.Recorder.Emit(r)
}
