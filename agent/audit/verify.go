// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
)

// Exit statuses of gpufence audit verify.
const (
	VerifyOK     = 0 // every chain is whole
	VerifyBroken = 1 // a record is edited, missing, out of order or cut short
	VerifyUsage  = 2 // bad arguments, or a file could not be read
)

// chained is one line of the files, as verify sees it.
type chained struct {
	file      string
	line      int
	run       string
	seq       uint64
	prev      string
	hash      string
	unchained bool // no run_id and no hash: an older agent's record
}

func (c *chained) where() string {
	if c.unchained || c.run == "" {
		return fmt.Sprintf("%s:%d", c.file, c.line)
	}
	return fmt.Sprintf("%s:%d (run %s seq %d)", c.file, c.line, c.run, c.seq)
}

// VerifyError is the first break verify found.
type VerifyError struct{ Msg string }

func (e *VerifyError) Error() string { return e.Msg }

// VerifySummary is what a whole set of files held.
type VerifySummary struct {
	Records, Runs, Unchained int
	// OpenStart is the run whose first records are not in the files (they
	// were rotated away): its earliest record here is not a run start.
	OpenStart string
}

// rotated matches logrotate's names: base.N, base.N.gz, base-YYYYMMDD[.gz].
var rotatedNum = regexp.MustCompile(`\.([0-9]+)(\.gz)?$`)
var rotatedDate = regexp.MustCompile(`-([0-9]{8,10})(\.gz)?$`)

// orderFiles puts rotated files oldest first: base.12.gz ... base.2.gz,
// base.1, base (dateext: by date), keeping the given order otherwise.
func orderFiles(files []string) []string {
	type key struct {
		class int
		n     int64
		i     int
	}
	keys := make([]key, len(files))
	for i, f := range files {
		base := filepath.Base(f)
		switch {
		case rotatedNum.MatchString(base):
			n, _ := strconv.ParseInt(rotatedNum.FindStringSubmatch(base)[1], 10, 64)
			keys[i] = key{0, -n, i}
		case rotatedDate.MatchString(base):
			n, _ := strconv.ParseInt(rotatedDate.FindStringSubmatch(base)[1], 10, 64)
			keys[i] = key{1, n, i}
		default:
			keys[i] = key{2, 0, i}
		}
	}
	idx := make([]int, len(files))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		ka, kb := keys[idx[a]], keys[idx[b]]
		if ka.class != kb.class {
			return ka.class < kb.class
		}
		if ka.n != kb.n {
			return ka.n < kb.n
		}
		return ka.i < kb.i
	})
	out := make([]string, len(files))
	for i, j := range idx {
		out[i] = files[j]
	}
	return out
}

// isGzip reports whether what br reads next starts with gzip's magic.
func isGzip(br *bufio.Reader) bool {
	magic, _ := br.Peek(2)
	return len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b
}

// openMaybeGzip opens a file of records, gunzipping it when it starts
// with gzip's magic (logrotate's compress), whatever its name.
func openMaybeGzip(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(f)
	if isGzip(br) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return &gzipFile{zr, f}, nil
	}
	return &bufferedFile{br, f}, nil
}

type gzipFile struct {
	*gzip.Reader
	f *os.File
}

func (g *gzipFile) Close() error { return errors.Join(g.Reader.Close(), g.f.Close()) }

type bufferedFile struct {
	*bufio.Reader
	f *os.File
}

func (b *bufferedFile) Close() error { return b.f.Close() }

// readChained reads one file (gzip'd when it starts with gzip's magic).
func readChained(path string) ([]chained, *VerifyError, error) {
	rc, err := openMaybeGzip(path)
	if err != nil {
		return nil, nil, err
	}
	defer rc.Close()
	lr := bufio.NewReaderSize(rc, 1<<16)
	var out []chained
	for n := 1; ; n++ {
		line, err := lr.ReadBytes('\n')
		if len(line) == 0 && err == io.EOF {
			return out, nil, nil
		}
		if err != nil && err != io.EOF {
			return nil, nil, fmt.Errorf("%s: line %d: %w", path, n, err)
		}
		c := chained{file: path, line: n}
		if err == io.EOF {
			return out, &VerifyError{fmt.Sprintf("%s: cut short: the last line has no newline (a record cut off, or the file truncated in a record)", c.where())}, nil
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		body, hash, ok := splitHash(line)
		var head struct {
			RunID    string `json:"run_id"`
			Seq      uint64 `json:"seq"`
			PrevHash string `json:"prev_hash"`
		}
		if !ok {
			if json.Unmarshal(line, &head) != nil {
				return out, &VerifyError{fmt.Sprintf("%s: not a JSON record", c.where())}, nil
			}
			if head.RunID != "" || head.PrevHash != "" {
				return out, &VerifyError{fmt.Sprintf("%s: record of run %s seq %d has no hash as its last member: edited", c.where(), head.RunID, head.Seq)}, nil
			}
			c.unchained = true
			out = append(out, c)
			continue
		}
		if err := json.Unmarshal(body, &head); err != nil {
			return out, &VerifyError{fmt.Sprintf("%s: not a JSON record: %v", c.where(), err)}, nil
		}
		c.run, c.seq, c.prev, c.hash = head.RunID, head.Seq, head.PrevHash, hash
		if hashOf(body) != hash {
			return out, &VerifyError{fmt.Sprintf("%s: edited: the record's hash does not match its contents", c.where())}, nil
		}
		if !validRunID(c.run) || len(c.prev) != hashLen || !isHex(c.prev) {
			return out, &VerifyError{fmt.Sprintf("%s: run_id or prev_hash missing or malformed", c.where())}, nil
		}
		out = append(out, c)
	}
}

// VerifyFiles checks the hash chains of the records in files (any order:
// rotated names are put oldest first). It returns the first break, or a
// summary; err is for a file that could not be read.
func VerifyFiles(files []string) (VerifySummary, *VerifyError, error) {
	var sum VerifySummary
	var all []chained
	var firstBad *VerifyError
	for _, f := range orderFiles(files) {
		recs, bad, err := readChained(f)
		if err != nil {
			return sum, nil, err
		}
		all = append(all, recs...)
		if bad != nil {
			// Check the chain up to the bad line: an earlier break comes first.
			firstBad = bad
			break
		}
	}
	byHash := map[string]int{}
	for i := range all {
		if !all[i].unchained {
			if j, dup := byHash[all[i].hash]; dup {
				return sum, &VerifyError{fmt.Sprintf("%s: the same record as %s: duplicated", all[i].where(), all[j].where())}, nil
			}
			byHash[all[i].hash] = i
		}
	}
	last := map[string]int{} // run -> index of its latest record
	seenChained := false
	for i := range all {
		c := &all[i]
		if c.unchained {
			if seenChained {
				return sum, &VerifyError{fmt.Sprintf("%s: a record without run_id and hash after chained records: edited, or written by another program", c.where())}, nil
			}
			sum.Unchained++
			continue
		}
		sum.Records++
		if j, ok := last[c.run]; ok {
			p := &all[j]
			if c.prev != p.hash {
				if k, ok := byHash[c.prev]; ok {
					return sum, &VerifyError{fmt.Sprintf("%s: out of order: it follows seq %d (%s) but its predecessor is seq %d at %s", c.where(), p.seq, p.where(), all[k].seq, all[k].where())}, nil
				}
				if c.prev == RunStartHash(c.run) {
					return sum, &VerifyError{fmt.Sprintf("%s: links to the start of its run, which began before it at %s: moved or duplicated", c.where(), all[firstOf(all, c.run)].where())}, nil
				}
				return sum, &VerifyError{fmt.Sprintf("%s: the record before it is missing or was altered: its prev_hash names no record in the files (the run's previous record here is seq %d at %s)", c.where(), p.seq, p.where())}, nil
			}
		} else {
			switch {
			case c.prev == RunStartHash(c.run):
				sum.Runs++
			case !seenChained:
				// The oldest run here may have begun in a file rotated away.
				if k, ok := byHash[c.prev]; ok {
					return sum, &VerifyError{fmt.Sprintf("%s: out of order: its predecessor is seq %d at %s, later in the files", c.where(), all[k].seq, all[k].where())}, nil
				}
				sum.Runs++
				sum.OpenStart = c.run
			default:
				if k, ok := byHash[c.prev]; ok {
					return sum, &VerifyError{fmt.Sprintf("%s: out of order: its predecessor is seq %d at %s, later in the files", c.where(), all[k].seq, all[k].where())}, nil
				}
				return sum, &VerifyError{fmt.Sprintf("%s: the record before it is missing or was altered: the first record of run %s here does not start the run", c.where(), c.run)}, nil
			}
		}
		last[c.run] = i
		seenChained = true
	}
	return sum, firstBad, nil
}

func firstOf(all []chained, run string) int {
	for i := range all {
		if all[i].run == run {
			return i
		}
	}
	return 0
}

// Verify checks the hash chains of files (rotated ones too, .gz included,
// in any order) as gpufence audit verify does, writes its one-line verdict
// ("ok: ..." or "BROKEN: ...") to w and returns VerifyOK or VerifyBroken;
// a file that could not be read is VerifyUsage and the error.
func Verify(files []string, w io.Writer) (int, error) {
	sum, bad, err := VerifyFiles(files)
	if err != nil {
		return VerifyUsage, err
	}
	if bad != nil {
		fmt.Fprintf(w, "BROKEN: %s\n", bad.Msg)
		return VerifyBroken, nil
	}
	fmt.Fprintf(w, "ok: %d chained records in %d runs", sum.Records, sum.Runs)
	if sum.Unchained > 0 {
		fmt.Fprintf(w, "; %d earlier records without a chain (an older agent)", sum.Unchained)
	}
	if sum.OpenStart != "" {
		fmt.Fprintf(w, "; run %s began before the oldest file given", sum.OpenStart)
	}
	fmt.Fprintln(w)
	return VerifyOK, nil
}
