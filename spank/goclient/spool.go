// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
	"unicode/utf8"
)

// failOpen is one line of the fail-open spool (plugstack spool=, default
// /var/spool/gpufence/failopen.jsonl): a step that ran WITHOUT GPU isolation
// because failure=open let it run while the agent was unreachable. The file
// is JSON Lines, root-only (folder 0700, file 0600), appended one line per
// step:
//
//	{"time":"2025-05-01T12:00:00Z","job_id":7,"step_id":"0","uid":2001,"node":"gpu01","reason":"connect: no such file or directory"}
//
// step_id is the step number, or batch, extern or interactive. reason is why
// the agent could not be reached. docs/configuration.md documents this
// format for administrators; keep the two in step.
type failOpen struct {
	Time   string // RFC 3339, local time with offset
	JobID  uint32
	StepID string
	UID    uint32
	Node   string // the host name
	Reason string
}

// line renders rec as one JSON object and a newline. (encoding/json's init
// would be paid by every slurmstepd for a line most never write.)
func (rec failOpen) line() []byte {
	b := []byte(`{"time":`)
	b = appendJSONString(b, rec.Time)
	b = append(b, `,"job_id":`...)
	b = strconv.AppendUint(b, uint64(rec.JobID), 10)
	b = append(b, `,"step_id":`...)
	b = appendJSONString(b, rec.StepID)
	b = append(b, `,"uid":`...)
	b = strconv.AppendUint(b, uint64(rec.UID), 10)
	b = append(b, `,"node":`...)
	b = appendJSONString(b, rec.Node)
	b = append(b, `,"reason":`...)
	b = appendJSONString(b, rec.Reason)
	return append(b, "}\n"...)
}

// appendJSONString quotes s as a JSON string: control characters, quotes
// and backslashes escaped, invalid UTF-8 replaced.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r < 0x20 || r == 0x7f || r == 0x2028 || r == 0x2029:
			b = append(b, '\\', 'u', hex[r>>12&15], hex[r>>8&15], hex[r>>4&15], hex[r&15])
		case r == utf8.RuneError:
			b = append(b, "\ufffd"...)
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

// appendFailOpen appends rec to the spool at path, creating its folder
// (0700) and the file (0600) when missing. It refuses a folder that others
// can write to or that belongs to another user, and a file that is not a
// regular file of ours, because slurmstepd runs this as root.
func appendFailOpen(path string, rec failOpen) error {
	if !filepath.IsAbs(path) {
		return errors.New("spool " + strconv.Quote(path) + ": not an absolute path")
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errors.New("spool folder: " + err.Error())
	}
	if err := checkDir(dir); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return errors.New("open spool: " + err.Error())
	}
	err = checkFile(f)
	if err == nil {
		// One write of one line: O_APPEND keeps lines from two
		// slurmstepds whole.
		_, err = f.Write(rec.line())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errors.New("write spool " + path + ": " + err.Error())
	}
	return nil
}

func checkDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return errors.New("spool folder: " + err.Error())
	}
	if !fi.IsDir() {
		return errors.New("spool folder " + dir + ": not a folder")
	}
	return checkOwner(dir, fi)
}

func checkFile(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return errors.New("not a regular file")
	}
	return checkOwner(f.Name(), fi)
}

// checkOwner wants what slurmstepd writes as root to be ours and writable
// by no one else.
func checkOwner(path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() {
		return errors.New(path + ": not owned by uid " + strconv.Itoa(os.Geteuid()))
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return errors.New(path + ": writable by others (mode 0" + strconv.FormatUint(uint64(fi.Mode().Perm()), 8) + ")")
	}
	return nil
}

// newFailOpen fills in the time and the node.
func newFailOpen(jobID uint32, stepID string, uid uint32, reason string) failOpen {
	node, err := os.Hostname()
	if err != nil {
		node = "unknown"
	}
	return failOpen{Time: time.Now().Format(time.RFC3339), JobID: jobID, StepID: stepID, UID: uid, Node: node, Reason: reason}
}
