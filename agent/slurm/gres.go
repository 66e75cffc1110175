// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/gpufence/gpufence/agent/gpulist"
)

// GPU is one GPU as Slurm numbers it on this node: Index is the global index
// Slurm puts in SLURM_JOB_GPUS and SLURM_STEP_GPUS, Path its device file.
//
// A MIG slice is one gres record with MultipleFiles= (Slurm >= 21.08): the
// parent GPU's /dev/nvidiaN and the nvidia-caps files of its GPU and compute
// instances, all under one index. Slices of one GPU share its /dev/nvidiaN;
// what keeps them apart is the caps files.
type GPU struct {
	Index int
	// Path is the record's first file: the GPU, or for a MIG slice normally
	// its parent GPU (devices.Resolve tells the files apart by device).
	Path string
	Type string
	// Files are every device file of the record: Path alone for File=, all
	// of MultipleFiles=.
	Files []string
	// MIG marks a MultipleFiles= record.
	MIG bool
	// Source is "file:line" of the record, for messages.
	Source string

	sortKey string
}

// maxGPUs is as many GPUs as a GPU list can name (gpulist.MaxIndex).
const maxGPUs = gpulist.MaxIndex + 1

// maxMIGFiles bounds one MultipleFiles= record: a MIG slice is its parent
// GPU and the caps files of its GPU and compute instances (three).
const maxMIGFiles = 64

// ErrNoGPUs is returned when gres.conf configures no GPU for this node.
var ErrNoGPUs = errors.New("no gpu with File= or MultipleFiles= configured for this node")

// GresConf is what gres.conf says of one node's GPUs.
type GresConf struct {
	// GPUs are the File= and MultipleFiles= GPUs, in Slurm's index order
	// as far as the file tells it (see ReadGres).
	GPUs []GPU
	// AutoDetect is the AutoDetect= value in force for the node ("" when
	// none, or "off"): then slurmd adds the GPUs it finds, and orders them
	// by what the driver reports, which the file does not say.
	AutoDetect string
	// Shares places the devices of the shared GRES gres.conf gives the
	// node on its GPUs: slurmd makes one shard (mps) device per GPU, in
	// the GPUs' order, whatever files the shared lines name (gres_c_s.c's
	// _merge_lists, 22.05 to 26.05), so device k is GPU k.
	Shares Shares
}

// ReadGres reads node's GPUs from gres.conf at path, in Slurm's own index
// order (common_node_config_load in Slurm): records in file order, each
// file of a File= range one index, each MultipleFiles= record one index.
// With AutoDetect, Slurm sorts the merged list by the records' file
// strings first, and so does this; it then sorts by the driver's links,
// which only slurmd -G shows, and adds GPUs that only AutoDetect finds (no
// File= or MultipleFiles=). A node with no GPU record is ErrNoGPUs, with
// AutoDetect still set.
func ReadGres(path, node string) (GresConf, error) {
	return readGres(osFiles{}, path, node)
}

func readGres(fsys fileSystem, path, node string) (GresConf, error) {
	var conf GresConf
	lines, err := readLines(fsys, path)
	if err != nil {
		return conf, fmt.Errorf("read gres.conf: %w", err)
	}
	var gpus []GPU
	kinds := map[string]bool{}
	for _, l := range lines {
		if names, ok := l.Get("NodeName"); ok {
			match, err := hostMatches(names, node)
			if err != nil {
				return conf, fmt.Errorf("%s:%d: NodeName: %w", l.File, l.No, err)
			}
			if !match {
				continue
			}
		}
		if v, ok := l.Get("AutoDetect"); ok {
			conf.AutoDetect = v
			if strings.EqualFold(v, "off") {
				conf.AutoDetect = ""
			}
		}
		name, _ := l.Get("Name")
		if kind, ok := shareKind(name); ok {
			kinds[kind] = true
			continue
		}
		if !strings.EqualFold(name, "gpu") {
			continue
		}
		src := fmt.Sprintf("%s:%d", l.File, l.No)
		typ, _ := l.Get("Type")
		file, hasFile := l.Get("File")
		if !hasFile {
			file, hasFile = l.Get("Files")
		}
		multi, hasMulti := l.Get("MultipleFiles")
		switch {
		case hasFile && hasMulti:
			return conf, fmt.Errorf("%s: File and MultipleFiles are mutually exclusive (as in Slurm)", src)
		case hasMulti:
			files, err := ExpandHostlist(multi)
			if err != nil {
				return conf, fmt.Errorf("%s: MultipleFiles: %w", src, err)
			}
			if len(files) < 2 {
				return conf, fmt.Errorf("%s: MultipleFiles=%s names one file; Slurm refuses that (use File=)", src, multi)
			}
			if len(files) > maxMIGFiles {
				return conf, fmt.Errorf("%s: MultipleFiles names %d files; a MIG slice has its GPU and a few nvidia-caps files, at most %d", src, len(files), maxMIGFiles)
			}
			gpus = append(gpus, GPU{Path: files[0], Type: typ, Files: files, MIG: true, Source: src, sortKey: multi})
		case hasFile:
			files, err := ExpandHostlist(file)
			if err != nil {
				return conf, fmt.Errorf("%s: File: %w", src, err)
			}
			for _, f := range files {
				gpus = append(gpus, GPU{Path: f, Type: typ, Files: []string{f}, Source: src, sortKey: f})
			}
		}
		if len(gpus) > maxGPUs {
			return conf, fmt.Errorf("%s: more than %d GPUs for node %s; gpufence names GPUs 0 to %d", src, maxGPUs, node, gpulist.MaxIndex)
		}
	}
	if len(gpus) == 0 {
		return conf, fmt.Errorf("%s (node %s): %w", path, node, ErrNoGPUs)
	}
	if conf.AutoDetect != "" {
		sort.SliceStable(gpus, func(i, j int) bool { return natLess(gpus[i].sortKey, gpus[j].sortKey) })
	}
	if conf.GPUs, err = numberGPUs(gpus); err != nil {
		return GresConf{AutoDetect: conf.AutoDetect}, err
	}
	for _, k := range ShareKinds {
		if !kinds[k] {
			continue
		}
		if conf.Shares == nil {
			conf.Shares = Shares{}
		}
		for _, g := range conf.GPUs {
			conf.Shares[k] = append(conf.Shares[k], g.Index)
		}
	}
	return conf, nil
}

// numberGPUs gives records in Slurm's order their indices and refuses what
// Slurm refuses, and what would make a device belong to two indices.
func numberGPUs(gpus []GPU) ([]GPU, error) {
	// Slurm refuses a File= device listed twice; the files of a MIG record
	// (its parent GPU above all) are exempt, but a GPU given out whole
	// cannot also be split.
	whole := map[string]string{}
	for i, g := range gpus {
		gpus[i].Index = i
		if g.MIG {
			continue
		}
		if prev, dup := whole[g.Path]; dup {
			return nil, fmt.Errorf("%s: device file %s listed twice (first at %s)", g.Source, g.Path, prev)
		}
		whole[g.Path] = g.Source
	}
	for _, g := range gpus {
		if !g.MIG {
			continue
		}
		seen := map[string]bool{}
		for _, f := range g.Files {
			if seen[f] {
				return nil, fmt.Errorf("%s: MultipleFiles lists %s twice", g.Source, f)
			}
			seen[f] = true
			if prev, ok := whole[f]; ok {
				return nil, fmt.Errorf("%s: %s is a whole GPU at %s and part of a MIG slice here; a GPU is either given out whole or split into slices", g.Source, f, prev)
			}
		}
	}
	return gpus, nil
}

func hostMatches(expr, node string) (bool, error) {
	if strings.EqualFold(expr, "ALL") {
		return true, nil
	}
	return hostlistContains(expr, node)
}

// natLess compares strings with digit runs compared as numbers, as Slurm's
// strnatcmp does ("nvidia2" < "nvidia10").
func natLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digitPrefix(a), digitPrefix(b)
		if da != "" && db != "" {
			na, nb := strings.TrimLeft(da, "0"), strings.TrimLeft(db, "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digitPrefix(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}
