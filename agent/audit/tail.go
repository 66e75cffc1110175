// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Formats of gpufence audit tail. formatRecord is the one place that
// knows them: a new format is one more case there.
const (
	FormatText = "text" // FormatHuman's aligned line
	FormatJSON = "json" // the record as written (terminal-safe)
	FormatOCSF = "ocsf" // the record as one OCSF event (OCSF; terminal-safe)
)

// TailOptions is what gpufence audit tail reads and prints.
type TailOptions struct {
	// File is the live audit file; its rotated siblings (File.N, File.N.gz,
	// File-YYYYMMDD[.gz], as logrotate names them) are read before it,
	// oldest first.
	File string
	// The filters; zero values filter nothing. Since and Until bound the
	// record's time field (when the agent wrote it), both included.
	JobID        uint32
	User         string // user name or uid
	Denied       bool   // denied and would-deny accesses only
	Event        string
	Since, Until time.Time
	// N is how many of the last matching records to print; 0 all.
	N      int
	Format string // FormatText (empty), FormatJSON or FormatOCSF
	// Follow keeps printing records as they are written to File, until
	// ctx ends.
	Follow bool
}

// errUnknownFormat is formatRecord's answer for a format it lacks.
var errUnknownFormat = errors.New("unknown format")

// formatRecord renders one record (line is the record as written) in
// format, without the newline.
func formatRecord(format string, line []byte, r *Record) ([]byte, error) {
	switch format {
	case FormatText, "":
		return []byte(FormatHuman(r)), nil
	case FormatJSON:
		// The record as written, except that no character can drive the
		// terminal (the agent escapes hostile text already; a record of
		// another writer may not).
		return TerminalSafeJSON(line), nil
	case FormatOCSF:
		// The same event audit.ocsf_file holds for this record.
		b, err := OCSF(r)
		if err != nil {
			return nil, err
		}
		return TerminalSafeJSON(b), nil
	}
	return nil, errUnknownFormat
}

// Check validates the options: an error names the option and its value.
func (o TailOptions) Check() error {
	if _, err := formatRecord(o.Format, []byte("{}"), &Record{}); errors.Is(err, errUnknownFormat) {
		return fmt.Errorf("--format %q: not a format (text, json or ocsf)", o.Format)
	}
	if o.Event != "" && !knownEvent(Event(o.Event)) {
		return fmt.Errorf("--event %q: not an event gpufence writes (docs/audit.md lists them)", o.Event)
	}
	if o.N < 0 {
		return fmt.Errorf("-n %d: must be 0 (all) or more", o.N)
	}
	if !o.Since.IsZero() && !o.Until.IsZero() && o.Until.Before(o.Since) {
		return fmt.Errorf("--until %s is before --since %s", o.Until.Format(time.RFC3339), o.Since.Format(time.RFC3339))
	}
	return nil
}

func (o TailOptions) match(r *Record) bool {
	switch {
	case o.Event != "" && string(r.Event) != o.Event,
		o.JobID != 0 && r.JobID != o.JobID,
		o.User != "" && r.User != o.User && (r.UID == nil || strconv.FormatUint(uint64(*r.UID), 10) != o.User),
		o.Denied && r.Decision != DecisionDenied && r.Decision != DecisionWouldDeny,
		!o.Since.IsZero() && r.Time.Before(o.Since),
		!o.Until.IsZero() && r.Time.After(o.Until):
		return false
	}
	return true
}

// ParseTimeBound reads --since and --until: an RFC 3339 time
// (2026-05-04T10:00:00Z, fractions and offsets allowed), a date
// (2026-05-04, midnight UTC), or a duration before now: Go's (90s, 30m,
// 1h30m) with d for days (2d, 1d12h).
func ParseTimeBound(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if d, ok := parseAgo(s); ok {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2006-01-02T15:04:05Z), a date (2006-01-02) nor a duration before now (30m, 1h, 2d)", s)
}

// parseAgo reads a positive duration with an optional leading days part.
func parseAgo(s string) (time.Duration, bool) {
	var days int64
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseInt(s[:i], 10, 32)
		if err != nil || n < 0 {
			return 0, false
		}
		days, s = n, s[i+1:]
	}
	var d time.Duration
	if s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d < 0 {
			return 0, false
		}
	}
	d += time.Duration(days) * 24 * time.Hour
	return d, d > 0
}

// RotatedFiles lists file's rotated siblings, oldest first (orderFiles'
// order): file.N.gz, file.N, file-YYYYMMDD[.gz], as logrotate names them
// (packaging/logrotate: file.1, then file.2.gz ...).
func RotatedFiles(file string) ([]string, error) {
	dir, base := filepath.Split(file)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), base)
		if !ok || e.IsDir() || !(rotatedNum.MatchString(rest) && rotatedNum.FindString(rest) == rest ||
			rotatedDate.MatchString(rest) && rotatedDate.FindString(rest) == rest) {
			continue
		}
		out = append(out, filepath.Join(dir, e.Name()))
	}
	return orderFiles(out), nil
}

// tailItem is one matching record kept for printing.
type tailItem struct {
	line []byte
	rec  Record
}

// Tail implements gpufence audit tail: the last o.N matching records of
// o.File's rotated files and o.File, then (o.Follow) every matching record
// written to o.File until ctx ends. Lines that are no record are counted
// on stderr. An error is a file that could not be read.
func Tail(ctx context.Context, o TailOptions, stdout, stderr io.Writer) error {
	if err := o.Check(); err != nil {
		return err
	}
	print := func(line []byte, r *Record) error {
		b, err := formatRecord(o.Format, line, r)
		if err != nil {
			return err
		}
		_, err = stdout.Write(append(b, '\n'))
		return err
	}
	f, err := os.Open(o.File)
	if err != nil {
		return err
	}
	live := &recordReader{f: f, rd: bufio.NewReader(f)}
	defer func() { live.f.Close() }()
	// --file naming a rotated, compressed file reads that file alone.
	compressed := isGzip(live.rd)
	if compressed && o.Follow {
		return fmt.Errorf("%s is gzip'd, a rotated file that no longer grows: --follow needs the live file", o.File)
	}
	var rotated []string
	if !compressed {
		if rotated, err = RotatedFiles(o.File); err != nil {
			return err
		}
	}
	bad := 0
	keep := func(all []tailItem, line []byte, r *Record) []tailItem {
		all = append(all, tailItem{append([]byte(nil), line...), *r})
		if o.N > 0 && len(all) > o.N {
			all = all[1:]
		}
		return all
	}
	var last []tailItem
	collect := func(line []byte, r *Record) error { last = keep(last, line, r); return nil }
	if compressed {
		if err := readClosedFile(o.File, o, &bad, collect); err != nil {
			return err
		}
	} else if err := live.read(o, &bad, collect); err != nil {
		return fmt.Errorf("read %s: %w", o.File, err)
	}
	// Newest rotated file first, each read whole, until N records are in
	// hand: tail -n 20 of a busy node need not unpack months of records.
	for i := len(rotated) - 1; i >= 0 && (o.N == 0 || len(last) < o.N); i-- {
		var older []tailItem
		if err := readClosedFile(rotated[i], o, &bad, func(line []byte, r *Record) error { older = keep(older, line, r); return nil }); err != nil {
			return err
		}
		last = append(older, last...)
		if o.N > 0 && len(last) > o.N {
			last = last[len(last)-o.N:]
		}
	}
	for _, it := range last {
		if err := print(it.line, &it.rec); err != nil {
			return err
		}
	}
	if bad > 0 {
		fmt.Fprintf(stderr, "gpufence audit tail: skipped %d lines that are not audit records\n", bad)
	}
	if !o.Follow {
		return nil
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := live.read(o, &bad, print); err != nil {
			return fmt.Errorf("read %s: %w", o.File, err)
		}
		// logrotate moved the file: continue with the new one.
		cur, err1 := live.f.Stat()
		now, err2 := os.Stat(o.File)
		if err1 == nil && err2 == nil && !os.SameFile(cur, now) {
			if nf, err := os.Open(o.File); err == nil {
				live.f.Close()
				live.f = nf
				live.rd.Reset(nf)
			}
		}
	}
}

// recordReader reads the live file: a partial last line is left to be
// read again once it is complete.
type recordReader struct {
	f  *os.File
	rd *bufio.Reader
}

func (lr *recordReader) read(o TailOptions, bad *int, emit func([]byte, *Record) error) error {
	for {
		line, err := lr.rd.ReadBytes('\n')
		if err != nil {
			if len(line) > 0 {
				if _, serr := lr.f.Seek(-int64(len(line)), io.SeekCurrent); serr != nil {
					return serr
				}
				lr.rd.Reset(lr.f)
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := emitLine(line, o, bad, emit); err != nil {
			return err
		}
	}
}

// readClosedFile reads a rotated file whole, gunzipped when it is gzip.
func readClosedFile(path string, o TailOptions, bad *int, emit func([]byte, *Record) error) error {
	rc, err := openMaybeGzip(path)
	if err != nil {
		return err
	}
	defer rc.Close()
	rd := bufio.NewReaderSize(rc, 1<<16)
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 {
			if err := emitLine(line, o, bad, emit); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
	}
}

func emitLine(line []byte, o TailOptions, bad *int, emit func([]byte, *Record) error) error {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return nil
	}
	var r Record
	if err := json.Unmarshal(line, &r); err != nil {
		*bad++
		return nil
	}
	if !o.match(&r) {
		return nil
	}
	return emit(line, &r)
}

// FormatHuman renders one record as an aligned line for a person. Every
// field is passed through Printable: the line holds no control character
// whatever the record says.
func FormatHuman(r *Record) string {
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return Printable(s)
	}
	jobStep := "-"
	if r.JobID != 0 {
		jobStep = strconv.FormatUint(uint64(r.JobID), 10)
		if r.StepID != "" {
			jobStep += "." + r.StepID
		}
	}
	who := r.User
	if r.UID != nil {
		who += "(" + strconv.FormatUint(uint64(*r.UID), 10) + ")"
	}
	proc := ""
	if r.PID != 0 {
		proc = strconv.FormatUint(uint64(r.PID), 10) + " " + r.Comm
	}
	dev := ""
	if r.Device != nil {
		dev = r.Device.Path
		if dev == "" {
			dev = fmt.Sprintf("%d:%d", r.Device.Major, r.Device.Minor)
		}
	}
	if r.GPU != nil {
		dev += fmt.Sprintf(" gpu%d", r.GPU.Index)
	}
	sup := "-"
	if r.Suppressed > 0 {
		sup = "+" + strconv.FormatUint(r.Suppressed, 10)
	}
	return Printable(strings.TrimRight(fmt.Sprintf("%-24s %-20s %-10s %-12s %-16s %-22s %-24s %-20s %-6s %s",
		r.Time.UTC().Format("2006-01-02T15:04:05.000Z"), dash(string(r.Event)), dash(r.Decision), dash(jobStep),
		dash(who), dash(proc), dash(exeLabel(r)), dash(strings.TrimSpace(dev)), sup, dash(r.Message)), " "))
}

// exeLabel is the exe column: the program of the access when it was
// verified, else what /proc showed afterwards, marked as such.
func exeLabel(r *Record) string {
	switch {
	case r.Exe != "":
		return r.Exe
	case r.ExeStatus == ExeChanged:
		return "[exec'd since] " + r.ExeNow
	case r.ExeStatus == ExeUnverified && r.ExeNow != "":
		return "[unverified] " + r.ExeNow
	case r.ExeStatus == ExeOtherNamespace:
		return "[other namespace] " + r.ExeNamespacePath
	case r.ExeStatus != "":
		return "[" + r.ExeStatus + "]"
	}
	return ""
}
