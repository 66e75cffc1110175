// SPDX-License-Identifier: Apache-2.0

// Package slurm reads what gpufence needs from Slurm's own configuration on a
// node: the task plugins and ConstrainDevices (which decide how Slurm numbers
// CUDA_VISIBLE_DEVICES) and the node's GPU table from gres.conf.
package slurm

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Line is one configuration line split into key=value pairs; keys keep their
// spelling, lookups ignore case as Slurm does.
type Line struct {
	File  string
	No    int
	Pairs [][2]string
}

// Get returns the value of key on this line.
func (l Line) Get(key string) (string, bool) {
	for _, p := range l.Pairs {
		if strings.EqualFold(p[0], key) {
			return p[1], true
		}
	}
	return "", false
}

// Bounds of one configuration read, includes and all: Slurm's own files
// are far smaller, and a tree of includes (each file including the next
// several times, or globs matching many) would otherwise be read
// exponentially often within the depth bound.
const (
	maxIncludeDepth = 8
	maxConfFiles    = 256
	maxConfBytes    = 16 << 20
)

// fileSystem is where configuration files are read from: the machine
// (osFiles), or in tests files held in memory.
type fileSystem interface {
	Open(name string) (io.ReadCloser, error)
	Glob(pattern string) ([]string, error)
}

type osFiles struct{}

func (osFiles) Open(name string) (io.ReadCloser, error) { return os.Open(name) }
func (osFiles) Glob(pattern string) ([]string, error)   { return filepath.Glob(pattern) }

// ReadLines parses a Slurm-style configuration file, following `include`
// lines (relative paths are relative to the including file's folder, as Slurm
// resolves them against the configuration directory). At most 256 files and
// 16 MiB are read, includes and all.
func ReadLines(path string) ([]Line, error) {
	return readLines(osFiles{}, path)
}

func readLines(fsys fileSystem, path string) ([]Line, error) {
	r := &confReader{fsys: fsys}
	return r.read(path, 0)
}

// confReader reads one file and its includes within the bounds.
type confReader struct {
	fsys  fileSystem
	files int
	bytes int
}

func (r *confReader) read(path string, depth int) ([]Line, error) {
	if depth > maxIncludeDepth {
		return nil, fmt.Errorf("%s: includes nested deeper than %d", path, maxIncludeDepth)
	}
	if r.files++; r.files > maxConfFiles {
		return nil, fmt.Errorf("%s: more than %d files read (includes included again?)", path, maxConfFiles)
	}
	f, err := r.fsys.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []Line
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 1<<20)
	no := 0
	for sc.Scan() {
		no++
		if r.bytes += len(sc.Bytes()) + 1; r.bytes > maxConfBytes {
			return nil, fmt.Errorf("%s:%d: more than %d bytes of configuration read, includes and all", path, no, maxConfBytes)
		}
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		if fields := strings.Fields(text); strings.EqualFold(fields[0], "include") {
			if len(fields) != 2 {
				return nil, fmt.Errorf("%s:%d: include needs exactly one path", path, no)
			}
			inc := fields[1]
			if !filepath.IsAbs(inc) {
				inc = filepath.Join(filepath.Dir(path), inc)
			}
			matches, err := r.fsys.Glob(inc)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, no, err)
			}
			if len(matches) == 0 && !strings.ContainsAny(inc, "*?[") {
				return nil, fmt.Errorf("%s:%d: include %s: %w", path, no, inc, os.ErrNotExist)
			}
			for _, m := range matches {
				sub, err := r.read(m, depth+1)
				if err != nil {
					return nil, fmt.Errorf("%s:%d: %w", path, no, err)
				}
				lines = append(lines, sub...)
			}
			continue
		}
		line := Line{File: path, No: no}
		for _, tok := range tokens(text) {
			k, v, ok := strings.Cut(tok, "=")
			if !ok {
				return nil, fmt.Errorf("%s:%d: %q is not key=value", path, no, tok)
			}
			line.Pairs = append(line.Pairs, [2]string{k, strings.Trim(v, `"`)})
		}
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return lines, nil
}

// tokens splits on blanks outside double quotes.
func tokens(s string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case (r == ' ' || r == '\t') && !quoted:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// Settings is what gpufence takes from slurm.conf and cgroup.conf.
type Settings struct {
	SlurmConf        string
	ClusterName      string
	TaskPlugin       string
	ConstrainDevices bool
	// SwitchType and SwitchParameters are slurm.conf's (switch/nvidia_imex
	// gives each job an IMEX channel).
	SwitchType, SwitchParameters string
	// GresConf is the gres.conf beside slurm.conf.
	GresConf string
	// CgroupSlice is cgroup.conf's (Slurm 25.11): the slice slurmd makes
	// its scope in; "" = system.slice.
	CgroupSlice string
	// SlurmdPidFile is slurm.conf's, as written ("" = Slurm's default);
	// SlurmdPid resolves it.
	SlurmdPidFile string
}

// DefaultSlurmdPidFile is Slurm's SlurmdPidFile when slurm.conf sets none.
const DefaultSlurmdPidFile = "/var/run/slurmd.pid"

// SlurmdPid is the file slurmd of node writes its pid to: SlurmdPidFile
// with %n (the node name) and %h (the host name) replaced, as slurmd does
// for multiple-slurmd nodes, or Slurm's default.
func (s Settings) SlurmdPid(node string) string {
	p := s.SlurmdPidFile
	if p == "" {
		return DefaultSlurmdPidFile
	}
	host, _ := os.Hostname()
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	return strings.NewReplacer("%n", node, "%h", host).Replace(p)
}

// LocalGPUIndices reports whether Slurm itself numbers CUDA_VISIBLE_DEVICES
// from 0 inside each step, which it does exactly when task/cgroup constrains
// devices (gres_use_local_device_index in Slurm's gres.c).
func (s Settings) LocalGPUIndices() bool {
	return strings.Contains(s.TaskPlugin, "cgroup") && s.ConstrainDevices
}

// NvidiaIMEX reports whether Slurm gives each job an IMEX channel.
func (s Settings) NvidiaIMEX() bool { return s.SwitchType == "switch/nvidia_imex" }

// IMEXDevMajor is SwitchParameters' imex_dev_major=, the IMEX channel
// major Slurm uses instead of /proc/devices'; 0 when not set. A value that
// is not a char major is an error naming it.
func (s Settings) IMEXDevMajor() (uint32, error) {
	for _, p := range strings.Split(s.SwitchParameters, ",") {
		v, ok := strings.CutPrefix(strings.TrimSpace(p), "imex_dev_major=")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 || n > 4095 {
			return 0, fmt.Errorf("slurm.conf SwitchParameters imex_dev_major=%q: not a char major (1-4095)", v)
		}
		return uint32(n), nil
	}
	return 0, nil
}

// ReadSettings reads slurm.conf at path and the cgroup.conf beside it (a
// missing cgroup.conf means Slurm's defaults).
func ReadSettings(path string) (Settings, error) {
	return readSettings(osFiles{}, path)
}

func readSettings(fsys fileSystem, path string) (Settings, error) {
	s := Settings{SlurmConf: path, GresConf: filepath.Join(filepath.Dir(path), "gres.conf")}
	lines, err := readLines(fsys, path)
	if err != nil {
		return s, fmt.Errorf("read slurm.conf: %w", err)
	}
	for _, l := range lines {
		if v, ok := l.Get("TaskPlugin"); ok {
			s.TaskPlugin = v
		}
		if v, ok := l.Get("ClusterName"); ok {
			s.ClusterName = v
		}
		if v, ok := l.Get("SwitchType"); ok {
			s.SwitchType = v
		}
		if v, ok := l.Get("SwitchParameters"); ok {
			s.SwitchParameters = v
		}
		if v, ok := l.Get("SlurmdPidFile"); ok {
			s.SlurmdPidFile = v
		}
	}
	cg := filepath.Join(filepath.Dir(path), "cgroup.conf")
	lines, err = readLines(fsys, cg)
	switch {
	case os.IsNotExist(err):
	case err != nil:
		return s, fmt.Errorf("read cgroup.conf: %w", err)
	default:
		for _, l := range lines {
			if v, ok := l.Get("ConstrainDevices"); ok {
				s.ConstrainDevices = strings.EqualFold(v, "yes")
			}
			if v, ok := l.Get("CgroupSlice"); ok {
				s.CgroupSlice = v
			}
		}
	}
	return s, nil
}
