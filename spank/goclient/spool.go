package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
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
	Time   string `json:"time"` // RFC 3339, local time with offset
	JobID  uint32 `json:"job_id"`
	StepID string `json:"step_id"`
	UID    uint32 `json:"uid"`
	Node   string `json:"node"` // the host name
	Reason string `json:"reason"`
}

// appendFailOpen appends rec to the spool at path, creating its folder
// (0700) and the file (0600) when missing. It refuses a folder that others
// can write to or that belongs to another user, and a file that is not a
// regular file of ours, because slurmstepd runs this as root.
func appendFailOpen(path string, rec failOpen) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("spool %q: not an absolute path", path)
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("spool %s: %w", path, err)
	}
	line = append(line, '\n')
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("spool folder: %w", err)
	}
	if err := checkDir(dir); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("open spool: %w", err)
	}
	err = checkFile(f)
	if err == nil {
		// One write of one line: O_APPEND keeps lines from two
		// slurmstepds whole.
		_, err = f.Write(line)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write spool %s: %w", path, err)
	}
	return nil
}

func checkDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("spool folder: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("spool folder %s: not a folder", dir)
	}
	return checkOwner(dir, fi)
}

func checkFile(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file")
	}
	return checkOwner(f.Name(), fi)
}

// checkOwner wants what slurmstepd writes as root to be ours and writable
// by no one else.
func checkOwner(path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s: not owned by uid %d", path, os.Geteuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s: writable by others (mode %#o)", path, fi.Mode().Perm())
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
