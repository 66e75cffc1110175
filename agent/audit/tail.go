// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Tail implements `gpufence audit tail` and returns the exit status.
func Tail(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpufence audit tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("file", DefaultFile, "audit file (JSON Lines)")
	job := fs.Uint("job", 0, "only records of this job id")
	user := fs.String("user", "", "only records of this user name or uid")
	denied := fs.Bool("denied", false, "only denied and would-deny accesses")
	event := fs.String("event", "", "only records of this event (gpu_access, job_adopted, policy_applied, ...; docs/audit.md)")
	asJSON := fs.Bool("json", false, "print the records as they are (JSON Lines)")
	var follow bool
	fs.BoolVar(&follow, "follow", false, "keep printing records as they are written")
	fs.BoolVar(&follow, "f", false, "same as --follow")
	n := fs.Int("n", 20, "print the last N matching records (0: all)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gpufence audit tail: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *event != "" && !knownEvent(Event(*event)) {
		fmt.Fprintf(stderr, "gpufence audit tail: --event %q: not an event gpufence writes (docs/audit.md lists them)\n", *event)
		return 2
	}
	match := func(r *Record) bool {
		if *event != "" && string(r.Event) != *event {
			return false
		}
		if *job != 0 && uint(r.JobID) != *job {
			return false
		}
		if *user != "" && r.User != *user && (r.UID == nil || strconv.FormatUint(uint64(*r.UID), 10) != *user) {
			return false
		}
		if *denied && r.Decision != DecisionDenied && r.Decision != DecisionWouldDeny {
			return false
		}
		return true
	}
	print := func(line []byte, r *Record) {
		if *asJSON {
			// The record as written, except that no character can drive
			// the terminal (the agent escapes hostile text already; a
			// record of another writer may not).
			stdout.Write(TerminalSafeJSON(line))
			io.WriteString(stdout, "\n")
			return
		}
		io.WriteString(stdout, FormatHuman(r)+"\n")
	}

	f, err := os.Open(*file)
	if err != nil {
		fmt.Fprintf(stderr, "gpufence audit tail: %v\n", err)
		return 1
	}
	defer func() { f.Close() }()
	type item struct {
		line []byte
		rec  Record
	}
	var last []item
	rd := bufio.NewReader(f)
	bad := 0
	readLines := func(emit func([]byte, *Record)) error {
		for {
			line, err := rd.ReadBytes('\n')
			if err != nil {
				if len(line) > 0 {
					// A partial last line: read it again once it is complete.
					if _, serr := f.Seek(-int64(len(line)), io.SeekCurrent); serr != nil {
						return serr
					}
					rd.Reset(f)
				}
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			line = bytes.TrimSpace(line)
			if len(line) == 0 {
				continue
			}
			var r Record
			if err := json.Unmarshal(line, &r); err != nil {
				bad++
				continue
			}
			if match(&r) {
				emit(line, &r)
			}
		}
	}
	err = readLines(func(line []byte, r *Record) {
		last = append(last, item{append([]byte(nil), line...), *r})
		if *n > 0 && len(last) > *n {
			last = last[1:]
		}
	})
	if err != nil {
		fmt.Fprintf(stderr, "gpufence audit tail: read %s: %v\n", *file, err)
		return 1
	}
	for _, it := range last {
		print(it.line, &it.rec)
	}
	if bad > 0 {
		fmt.Fprintf(stderr, "gpufence audit tail: skipped %d lines that are not audit records\n", bad)
	}
	if !follow {
		return 0
	}
	for {
		time.Sleep(250 * time.Millisecond)
		if err := readLines(print); err != nil {
			fmt.Fprintf(stderr, "gpufence audit tail: read %s: %v\n", *file, err)
			return 1
		}
		// logrotate moved the file: continue with the new one.
		cur, err1 := f.Stat()
		now, err2 := os.Stat(*file)
		if err1 == nil && err2 == nil && !os.SameFile(cur, now) {
			nf, err := os.Open(*file)
			if err == nil {
				f.Close()
				f = nf
				rd.Reset(f)
			}
		}
	}
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
