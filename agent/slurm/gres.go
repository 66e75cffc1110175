package slurm

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// GPU is one GPU as Slurm numbers it on this node: Index is the global index
// Slurm puts in SLURM_JOB_GPUS and SLURM_STEP_GPUS, Path its device file.
type GPU struct {
	Index int
	Path  string
	Type  string
}

// ErrNoGPUs is returned when gres.conf configures no GPU for this node.
var ErrNoGPUs = errors.New("no gpu with File= configured for this node")

// ReadGresGPUs returns the GPU table of node from gres.conf at path, in
// Slurm's own index order: records in file order, each File= range expanded
// (common_node_config_load in Slurm). With AutoDetect, Slurm sorts the merged
// list by device file name first, and so does this. GPUs that only
// AutoDetect would find (no File=) cannot be listed from the file.
func ReadGresGPUs(path, node string) ([]GPU, error) {
	lines, err := ReadLines(path)
	if err != nil {
		return nil, fmt.Errorf("read gres.conf: %w", err)
	}
	var gpus []GPU
	autodetect := false
	for _, l := range lines {
		if names, ok := l.Get("NodeName"); ok {
			match, err := hostMatches(names, node)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: NodeName: %w", l.File, l.No, err)
			}
			if !match {
				continue
			}
		}
		if v, ok := l.Get("AutoDetect"); ok && !strings.EqualFold(v, "off") {
			autodetect = true
		}
		name, _ := l.Get("Name")
		if !strings.EqualFold(name, "gpu") {
			continue
		}
		file, ok := l.Get("File")
		if !ok {
			file, ok = l.Get("Files")
		}
		if !ok {
			continue
		}
		files, err := ExpandHostlist(file)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: File: %w", l.File, l.No, err)
		}
		typ, _ := l.Get("Type")
		for _, f := range files {
			gpus = append(gpus, GPU{Path: f, Type: typ})
		}
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("%s (node %s): %w", path, node, ErrNoGPUs)
	}
	if autodetect {
		sort.SliceStable(gpus, func(i, j int) bool { return natLess(gpus[i].Path, gpus[j].Path) })
	}
	seen := map[string]bool{}
	for i := range gpus {
		if seen[gpus[i].Path] {
			return nil, fmt.Errorf("%s: device file %s listed twice", path, gpus[i].Path)
		}
		seen[gpus[i].Path] = true
		gpus[i].Index = i
	}
	return gpus, nil
}

func hostMatches(expr, node string) (bool, error) {
	if strings.EqualFold(expr, "ALL") {
		return true, nil
	}
	hosts, err := ExpandHostlist(expr)
	if err != nil {
		return false, err
	}
	for _, h := range hosts {
		if h == node {
			return true, nil
		}
	}
	return false, nil
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
