// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpufence/gpufence/agent/gpulist"
)

// Slurmd asks this node's slurmd for the GPU table it uses: `slurmd -G`
// reads slurm.conf and gres.conf as slurmd does at start, merges what
// AutoDetect (NVML, the nvidia driver, fake_gpus.conf) finds, prints one
// line per gres record in the order Slurm numbers them, and exits. It
// starts no daemon and contacts no other node; it does initialize slurmd's
// plugins: it writes the hardware topology into SlurmdSpoolDir, may log to
// slurmd's log and syslog, and with cgroup/v2 joins (creating it if
// missing) the slurmstepd scope's slurmd cgroup for the moment it runs,
// as a slurmd started by hand does.
type Slurmd struct {
	// Bin is the slurmd binary; see SlurmdPath.
	Bin string
	// SlurmConf is the node's slurm.conf (-f).
	SlurmConf string
	// Node is this node's name (-N).
	Node string
	// Timeout bounds one run; 0 is DefaultSlurmdTimeout.
	Timeout time.Duration
}

// DefaultSlurmdTimeout bounds `slurmd -G`: it waits up to 20 s for a
// gres.conf device file that does not exist yet before it gives up.
const DefaultSlurmdTimeout = 30 * time.Second

// maxSlurmdOutput caps what is read of one `slurmd -G`: a line per gres
// record, a few hundred bytes each.
const maxSlurmdOutput = 4 << 20

// SlurmdView is slurmd's GPU table and how it was read.
type SlurmdView struct {
	// GPUs are the node's GPUs in Slurm's index order (empty: none).
	GPUs []GPU
	// Shares places the devices of the node's shared GRES on its GPUs.
	Shares Shares
	// Command is what was run, for messages.
	Command string
	// Took is how long it ran.
	Took time.Duration
}

// GPUs runs `slurmd -G` and parses its table. The binary must be the
// node's own (TrustedBinary); the environment is the agent's own
// minimal one, so that no variable of a caller changes what it reads.
func (s *Slurmd) GPUs(ctx context.Context) (SlurmdView, error) {
	v := SlurmdView{Command: fmt.Sprintf("%s -G -L /dev/null -f %s -N %s", s.Bin, s.SlurmConf, s.Node)}
	if err := TrustedBinary(s.Bin); err != nil {
		return v, fmt.Errorf("slurmd -G: %w", err)
	}
	// slurmd waits up to a minute for a missing slurm.conf.
	if fi, err := os.Stat(s.SlurmConf); err != nil {
		return v, fmt.Errorf("slurmd -G: %w", err)
	} else if !fi.Mode().IsRegular() {
		return v, fmt.Errorf("slurmd -G: %s is not a regular file", s.SlurmConf)
	}
	if s.Node == "" || strings.HasPrefix(s.Node, "-") {
		return v, fmt.Errorf("slurmd -G: node name %q is not usable as slurmd -N", s.Node)
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultSlurmdTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// -L /dev/null: slurmd would open slurm.conf's SlurmdLogFile, which
	// the packaged unit (ProtectSystem=strict) keeps read-only; the table
	// goes to stderr all the same (measured on 22.05 in the VM node).
	cmd := exec.CommandContext(ctx, s.Bin, "-G", "-L", "/dev/null", "-f", s.SlurmConf, "-N", s.Node)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C", "LC_ALL=C"}
	cmd.Dir = "/"
	// Its own process group, so that whatever it started dies with it.
	// Killed with the agent too (kill -9, OOM): a slurmd -G that hangs must
	// not outlive it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	var out capped
	out.max = maxSlurmdOutput
	// Slurm logs the table to stderr; stdout is empty, kept in case.
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	v.Took = time.Since(start)
	if ctx.Err() != nil {
		return v, fmt.Errorf("%s did not finish within %s (last line: %s)", v.Command, timeout, lastLine(out.Bytes()))
	}
	if out.over {
		return v, fmt.Errorf("%s printed more than %d bytes", v.Command, maxSlurmdOutput)
	}
	if err != nil {
		return v, fmt.Errorf("%s: %w: %s", v.Command, err, slurmdFailure(out.Bytes()))
	}
	gpus, shares, err := ParseSlurmdTable(out.Bytes())
	if err != nil {
		return v, fmt.Errorf("%s: %w", v.Command, err)
	}
	v.GPUs, v.Shares = gpus, shares
	return v, nil
}

// slurmdFailure is the line that says why slurmd stopped: its fatal, else
// its last error, else its last line.
func slurmdFailure(b []byte) string {
	var lastErr string
	for _, l := range strings.Split(string(b), "\n") {
		m := stripLogPrefix(strings.TrimSpace(l))
		switch {
		case strings.HasPrefix(m, "fatal: "):
			return m
		case strings.HasPrefix(m, "error: "):
			lastErr = m
		}
	}
	if lastErr != "" {
		return lastErr
	}
	if l := lastLine(b); l != "" {
		return l
	}
	return "no output"
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return stripLogPrefix(strings.TrimSpace(lines[len(lines)-1]))
}

// logPrefix is what Slurm puts before a message on stderr: "slurmd: "
// (22.05 to 25.11) or "[2026-12-01T11:28:37.391] " (26.05).
var logPrefix = regexp.MustCompile(`^(\[[0-9T:.+-]{10,40}\] )?(slurmd: )?`)

func stripLogPrefix(l string) string { return l[len(logPrefix.FindString(l)):] }

// maxSlurmdLine bounds one line of slurmd -G output.
const maxSlurmdLine = 1 << 20

// Shares places the devices of a node's shared GRES on its GPUs:
// Shares["shard"][k] is the GPU index of the k-th gres/shard device as
// slurmctld numbers them in a job's gres_detail, -1 where that device is
// no GPU of the table. Kinds are "shard" and "mps".
type Shares map[string][]int

// ShareKinds are the shared GRES Slurm offers on a GPU.
var ShareKinds = []string{"shard", "mps"}

func shareKind(name string) (string, bool) {
	for _, k := range ShareKinds {
		if strings.EqualFold(name, k) {
			return k, true
		}
	}
	return "", false
}

// GPU returns the GPU index of kind's device dev.
func (s Shares) GPU(kind string, dev int) (int, bool) {
	devs := s[kind]
	if dev < 0 || dev >= len(devs) || devs[dev] < 0 {
		return 0, false
	}
	return devs[dev], true
}

// ParseSlurmdTable reads the GPU table from `slurmd -G` output (stderr),
// 22.05 to 26.05:
//
//	slurmd: Gres Name=gpu Type=(null) Count=4 Index=0 ID=7696487 File=/dev/nvidia[0-3] (null)
//	[2026-12-01T11:28:37.391] Gres Name=gpu Type=a100 Count=1 Index=0 ID=7696487 File=/dev/nvidia0 Links=(null) Flags=HAS_FILE,...
//
// Each record is what gres.conf and AutoDetect merged into, in the order
// slurmd numbers devices: a File= range of Count files is Count GPUs, one
// per file; a record of Count=1 with several files is one MultipleFiles=
// MIG slice (its GPU first). Index= is the device number from the file's
// last digits, not Slurm's index, and is not used. Other gres (mps, shard,
// nic) are skipped; other lines (warnings) ignored. Output with no gpu
// record is an empty table.
//
// It also places the shared GRES: slurmd
// prints one shard (mps) record per GPU, Count=0 where gres.conf gives that
// GPU none, each with its GPU's File= (gres_c_s.c's _merge_lists, 22.05 to
// 26.05); slurmctld numbers a shared GRES's devices in the order of those
// records. Each is placed on the GPU whose device files are its File=.
func ParseSlurmdTable(out []byte) ([]GPU, Shares, error) {
	var gpus []GPU
	var shared []sharedRec
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 4096), maxSlurmdLine)
	no := 0
	for sc.Scan() {
		no++
		msg := stripLogPrefix(strings.TrimSpace(sc.Text()))
		rest, ok := strings.CutPrefix(msg, "Gres ")
		if !ok || !strings.HasPrefix(rest, "Name=") {
			if strings.HasPrefix(msg, "fatal: ") {
				return nil, nil, fmt.Errorf("line %d: slurmd failed: %s", no, msg)
			}
			continue
		}
		src := fmt.Sprintf("slurmd -G line %d", no)
		rec, err := parseGresRecord(rest)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", src, err)
		}
		if kind, ok := shareKind(rec["Name"]); ok {
			file := rec["File"]
			if file == "" || file == "(null)" {
				return nil, nil, fmt.Errorf("%s: %s record without File= (slurmd gives every one its GPU's file; this output is not understood)", src, kind)
			}
			files, err := ExpandHostlist(file)
			if err != nil || len(files) == 0 {
				return nil, nil, fmt.Errorf("%s: %s File=%q names no device file", src, kind, file)
			}
			if len(shared) >= maxGPUs*len(ShareKinds) {
				return nil, nil, fmt.Errorf("%s: more shared GRES records than GPUs gpufence can name", src)
			}
			shared = append(shared, sharedRec{kind: kind, files: files})
			continue
		}
		if !strings.EqualFold(rec["Name"], "gpu") {
			continue
		}
		typ := rec["Type"]
		if typ == "(null)" {
			typ = ""
		}
		file, ok := rec["File"]
		if !ok || file == "" || file == "(null)" {
			return nil, nil, fmt.Errorf("%s: gpu record without File= (slurmd removes those; this output is not understood)", src)
		}
		count, err := strconv.ParseUint(rec["Count"], 10, 31)
		if err != nil || count == 0 {
			return nil, nil, fmt.Errorf("%s: Count=%q is not a positive number", src, rec["Count"])
		}
		files, err := ExpandHostlist(file)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: File: %w", src, err)
		}
		if len(files) == 0 {
			return nil, nil, fmt.Errorf("%s: File=%q names no device file", src, file)
		}
		for _, f := range files {
			if !filepath.IsAbs(f) {
				return nil, nil, fmt.Errorf("%s: device file %q is not an absolute path", src, f)
			}
		}
		if uint64(len(files)) != count && count != 1 {
			return nil, nil, fmt.Errorf("%s: Count=%d with %d device files: neither one GPU per file nor one MIG slice", src, count, len(files))
		}
		if len(gpus)+int(count) > maxGPUs {
			return nil, nil, fmt.Errorf("%s: more than %d GPUs; gpufence names GPUs 0 to %d", src, maxGPUs, gpulist.MaxIndex)
		}
		switch {
		case uint64(len(files)) == count:
			for _, f := range files {
				gpus = append(gpus, GPU{Path: f, Type: typ, Files: []string{f}, Source: src})
			}
		case len(files) > maxMIGFiles:
			return nil, nil, fmt.Errorf("%s: one GPU with %d files; a MIG slice has its GPU and a few nvidia-caps files, at most %d", src, len(files), maxMIGFiles)
		default:
			gpus = append(gpus, GPU{Path: files[0], Type: typ, Files: files, MIG: true, Source: src})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read slurmd -G output: %w", err)
	}
	if len(gpus) == 0 {
		return []GPU{}, placeShares(nil, shared), nil
	}
	gpus, err := numberGPUs(gpus)
	if err != nil {
		return nil, nil, err
	}
	return gpus, placeShares(gpus, shared), nil
}

// sharedRec is one shard or mps record of slurmd -G.
type sharedRec struct {
	kind  string
	files []string
}

// placeShares puts each kind's devices, in slurmd's order, on the GPU
// whose files they name; -1 where none does (Slurm discards a shared
// record without a GPU of its file, so this is output not understood, and
// a job on that device gets no GPU).
func placeShares(gpus []GPU, recs []sharedRec) Shares {
	if len(recs) == 0 {
		return nil
	}
	out := Shares{}
	for _, r := range recs {
		at := -1
		for _, g := range gpus {
			if slices.Equal(g.Files, r.files) {
				at = g.Index
				break
			}
		}
		out[r.kind] = append(out[r.kind], at)
	}
	return out
}

// gresKeys are the fields slurmd prints for a record.
var gresKeys = map[string]bool{"Name": true, "Type": true, "Count": true, "Index": true, "ID": true, "File": true,
	"Cores": true, "CoreCnt": true, "Links": true, "Flags": true}

// parseGresRecord splits "Name=gpu Type=... File=... (null)" into its
// fields. A field twice, an unknown field or a stray word is an error:
// the agent does not guess at a format it was not written for.
func parseGresRecord(s string) (map[string]string, error) {
	rec := map[string]string{}
	for _, tok := range strings.Fields(s) {
		k, v, ok := strings.Cut(tok, "=")
		if !ok {
			// 22.05 ends a record without links in "(null)".
			if tok == "(null)" {
				continue
			}
			return nil, fmt.Errorf("unexpected %q in a gres record", tok)
		}
		if !gresKeys[k] {
			return nil, fmt.Errorf("unknown field %q in a gres record", k)
		}
		if _, dup := rec[k]; dup {
			return nil, fmt.Errorf("field %s twice in a gres record", k)
		}
		rec[k] = v
	}
	return rec, nil
}

// SlurmdPath is the node's slurmd: in binDir's sbin sibling (or binDir
// itself) when slurm_bin_dir is set; else <prefix>/sbin/slurmd when
// slurm.conf is <prefix>/etc/slurm.conf and it is there (ParallelCluster's
// /opt/slurm); else the first of /usr/sbin, /usr/local/sbin that has one.
// PATH is not searched: the agent runs it as root.
func SlurmdPath(binDir, slurmConf string) (string, error) {
	var cands []string
	if binDir != "" {
		cands = []string{filepath.Join(filepath.Dir(binDir), "sbin", "slurmd"), filepath.Join(binDir, "slurmd")}
	} else {
		if etc := filepath.Dir(slurmConf); slurmConf != "" && filepath.Base(etc) == "etc" {
			cands = append(cands, filepath.Join(filepath.Dir(etc), "sbin", "slurmd"))
		}
		cands = append(cands, "/usr/sbin/slurmd", "/usr/local/sbin/slurmd")
	}
	for _, c := range cands {
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() {
			return c, nil
		}
	}
	return "", fmt.Errorf("no slurmd found (looked for %s); set slurmd to its path (or slurm_bin_dir to the folder of Slurm's commands)", strings.Join(cands, ", "))
}

// FindSlurmd is the slurmd binary to run: slurmd when the configuration
// names one (the agent's slurmd key), else SlurmdPath(binDir, slurmConf).
func FindSlurmd(slurmd, binDir, slurmConf string) (string, error) {
	if slurmd != "" {
		return slurmd, nil
	}
	return SlurmdPath(binDir, slurmConf)
}

// maxSymlinks bounds the links followed when checking a path.
const maxSymlinks = 40

// TrustedBinary checks that path, every symbolic link on the way to the
// file and every folder above them can be changed by root only: owned by
// root and not writable by group or others, except a sticky folder (such
// as /tmp) above an entry root owns. Otherwise anyone who could replace
// slurmd would choose the GPU table.
func TrustedBinary(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%s is not an absolute path", path)
	}
	links := 0
	todo := strings.Split(strings.TrimPrefix(filepath.Clean(path), "/"), "/")
	cur := "/"
	fi, err := os.Lstat(cur)
	if err != nil {
		return err
	}
	if err := rootOnly(cur, fi); err != nil {
		return err
	}
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			// cur has no links left in it: its parent is lexical.
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		if err := rootOnly(next, fi); err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			if links++; links > maxSymlinks {
				return fmt.Errorf("%s: more than %d symbolic links", path, maxSymlinks)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			if filepath.IsAbs(target) {
				cur = "/"
			}
			todo = append(strings.Split(target, "/"), todo...)
			continue
		}
		if len(todo) > 0 {
			if !fi.IsDir() {
				return fmt.Errorf("%s is not a folder", next)
			}
			cur = next
			continue
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", next)
		}
		if fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s is not executable", next)
		}
	}
	return nil
}

// rootOnly checks one entry of a path: owned by root, and not writable by
// group or others (a symbolic link's own mode does not matter), unless it
// is a sticky folder, in which others may add entries but not replace
// root's (every entry below is checked to be root's).
func rootOnly(path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner information", path)
	}
	if st.Uid != 0 {
		return fmt.Errorf("%s is owned by uid %d, not root: only root may be able to change the slurmd the agent runs", path, st.Uid)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return nil
	}
	if fi.Mode().Perm()&0o022 != 0 {
		if fi.IsDir() && fi.Mode()&os.ModeSticky != 0 {
			return nil
		}
		return fmt.Errorf("%s is writable by group or others (mode %s): only root may be able to change the slurmd the agent runs", path, fi.Mode().Perm())
	}
	return nil
}
