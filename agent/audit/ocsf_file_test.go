// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// readOCSF reads an OCSF file, validating every line against the pinned
// schema, and returns each event's metadata.uid.
func readOCSF(t *testing.T, path string) []string {
	t.Helper()
	s := pinnedOCSF(t)
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	var uids []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if errs := s.Validate(sc.Bytes()); len(errs) > 0 {
			t.Fatalf("%s: an event does not validate: %v\n%s", path, errs, sc.Bytes())
		}
		var ev struct {
			Metadata struct{ UID string } `json:"metadata"`
		}
		must(t, json.Unmarshal(sc.Bytes(), &ev))
		uids = append(uids, ev.Metadata.UID)
	}
	must(t, sc.Err())
	return uids
}

// The OCSF file gets every record the JSON Lines file gets, as valid OCSF
// events, with the file's mode; SIGHUP's reopen follows a rotation, and the
// JSON Lines file's chain stays whole beside it.
func TestOCSFFileSink(t *testing.T) {
	opts := testOptions(t)
	opts.RunID = testRunID
	opts.FileMode = 0o600
	opts.OCSFFile = filepath.Join(filepath.Dir(opts.File), "audit.ocsf.jsonl")
	p, err := New(opts, nil)
	must(t, err)
	recs := everyKindRecords()
	for _, r := range recs[:5] {
		p.Emit(r)
	}
	waitFor(t, "OCSF records", func() bool { return p.Stats().Sinks["ocsf_file"].Written == 5 })
	rotated := opts.OCSFFile + ".1"
	must(t, os.Rename(opts.OCSFFile, rotated))
	must(t, os.Rename(opts.File, opts.File+".1"))
	must(t, p.Reopen())
	for _, r := range recs[5:] {
		p.Emit(r)
	}
	must(t, p.Close())
	old, cur := readOCSF(t, rotated), readOCSF(t, opts.OCSFFile)
	if len(old) != 5 || len(old)+len(cur) != len(recs) {
		t.Fatalf("OCSF files hold %d and %d events, want 5 and %d", len(old), len(cur), len(recs)-5)
	}
	for i, uid := range append(old, cur...) {
		if want := testRunID + ":" + strconv.Itoa(i+1); uid != want {
			t.Errorf("event %d: metadata.uid %q, want %q", i, uid, want)
		}
	}
	for _, f := range []string{rotated, opts.OCSFFile} {
		if st, _ := os.Stat(f); st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600 (audit.file_mode)", f, st.Mode().Perm())
		}
	}
	if st := p.Stats().Sinks["ocsf_file"]; st.Written != uint64(len(recs)) || st.Failed != 0 {
		t.Errorf("ocsf_file sink stats %+v", st)
	}
	if _, verr, err := VerifyFiles([]string{opts.File + ".1", opts.File}); err != nil || verr != nil {
		t.Errorf("the JSON Lines chain beside the OCSF file: %v %v", err, verr)
	}
}

func TestOCSFFileRefused(t *testing.T) {
	opts := testOptions(t)
	opts.OCSFFile = filepath.Join(filepath.Dir(opts.File), ".", "audit.jsonl")
	if _, err := New(opts, nil); err == nil || !strings.Contains(err.Error(), "is the JSON Lines file too") {
		t.Errorf("OCSF file = JSON file: %v", err)
	}
	opts = testOptions(t)
	opts.OCSFFile = filepath.Join(t.TempDir(), "audit.ocsf.jsonl")
	must(t, os.Symlink("/etc/passwd", opts.OCSFFile))
	if _, err := New(opts, nil); err == nil || !strings.Contains(err.Error(), "audit OCSF file sink: open "+opts.OCSFFile+": it is a symbolic link") {
		t.Errorf("symlink: %v", err)
	}
}

func TestPrivilegedOCSFFileGroup(t *testing.T) {
	group, gid, inUID, outUID := throwawayUser(t)
	base := t.TempDir()
	must(t, os.Chmod(base, 0o711))
	must(t, os.Chmod(filepath.Dir(base), 0o711))
	opts := testOptions(t)
	opts.File = ""
	opts.OCSFFile = filepath.Join(base, "gpufence", "audit.ocsf.jsonl")
	opts.FileGroup = group
	p, err := New(opts, nil)
	must(t, err)
	p.Emit(sampleRecords()[0])
	waitFor(t, "record", func() bool { return p.Stats().Sinks["ocsf_file"].Written == 1 })
	check := func() {
		t.Helper()
		st, err := os.Stat(opts.OCSFFile)
		must(t, err)
		sys := st.Sys().(*syscall.Stat_t)
		if st.Mode().Perm() != 0o640 || sys.Uid != 0 || int(sys.Gid) != gid {
			t.Errorf("%s: %v %d:%d, want 0640 0:%d", opts.OCSFFile, st.Mode().Perm(), sys.Uid, sys.Gid, gid)
		}
	}
	check()
	// logrotate's create: root:root 0600; the reopen restores group and mode.
	must(t, os.Rename(opts.OCSFFile, opts.OCSFFile+".1"))
	must(t, os.WriteFile(opts.OCSFFile, nil, 0o600))
	must(t, p.Reopen())
	check()
	p.Emit(sampleRecords()[1])
	must(t, p.Close())
	if out, err := readAs(opts.OCSFFile, inUID); err != nil || !strings.Contains(out, `"class_uid":6002`) {
		t.Fatalf("a user of group %s cannot read the OCSF file: %v %s", group, err, out)
	}
	if out, err := readAs(opts.OCSFFile, outUID); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("a user outside group %s read the OCSF file: %v %s", group, err, out)
	}
}

// gpufence audit tail --format ocsf prints, for the JSON Lines file, the
// events the OCSF file holds: the same lines, each valid against the
// pinned schema.
func TestTailOCSF(t *testing.T) {
	opts := testOptions(t)
	opts.OCSFFile = filepath.Join(filepath.Dir(opts.File), "audit.ocsf.jsonl")
	p, err := New(opts, nil)
	must(t, err)
	for _, r := range sampleRecords() {
		p.Emit(r)
	}
	must(t, p.Close())
	var out, errb strings.Builder
	must(t, Tail(context.Background(), TailOptions{File: opts.File, Format: FormatOCSF}, &out, &errb))
	if errb.Len() > 0 {
		t.Errorf("stderr: %s", errb.String())
	}
	want, err := os.ReadFile(opts.OCSFFile)
	must(t, err)
	if out.String() != string(want) {
		t.Errorf("tail --format ocsf differs from the OCSF file:\n%s\nfile:\n%s", out.String(), want)
	}
	if uids := readOCSF(t, opts.OCSFFile); len(uids) < len(sampleRecords()) || len(uids) != strings.Count(out.String(), "\n") {
		t.Errorf("%d OCSF events in the file, %d lines printed, for %d records", len(uids), strings.Count(out.String(), "\n"), len(sampleRecords()))
	}
}
