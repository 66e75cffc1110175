// SPDX-License-Identifier: Apache-2.0

// Package jobmap keeps dcgm-exporter's HPC job mapping files: a directory
// (dcgm-exporter's --hpc-job-mapping-dir) with one file per GPU, named by
// the GPU's number as dcgm-exporter labels it (gpu="N"), holding the ids of
// the jobs on that GPU, one per line. dcgm-exporter then adds an hpc_job
// label to that GPU's series (internal/pkg/transformation/hpc.go upstream),
// so existing DCGM dashboards gain job labels without prolog scripts.
//
// A MIG slice's series are looked up under "N.G" instead (GPU N, GPU
// instance id G; dcgm-exporter 4.5.3 and later, #602), so a job on a slice
// is listed in both: "N.G" for the slice's own series, and "N" for the
// GPU's (and for releases before 4.5.3, which read "N" only).
package jobmap

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
)

// Key names one mapping file: a GPU by dcgm-exporter's number, or with
// MIG set one of its MIG slices by GPU instance id.
type Key struct {
	GPU int
	MIG bool
	GI  uint32
}

// Name is the file's name: "N", or "N.G" for a MIG slice.
func (k Key) Name() string {
	if k.MIG {
		return strconv.Itoa(k.GPU) + "." + strconv.FormatUint(uint64(k.GI), 10)
	}
	return strconv.Itoa(k.GPU)
}

// mappingName is a name dcgm-exporter reads as a mapping file (its
// validGPUFile): every other file in the directory is left alone.
var mappingName = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// Dir is one mapping directory that gpufence owns: Sync removes the files
// of GPUs no job holds.
type Dir struct {
	path string
}

// New creates the directory (0755: dcgm-exporter may run as another user)
// when it does not exist.
func New(path string) (*Dir, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("dcgm job mapping dir %q: not an absolute path", path)
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, fmt.Errorf("dcgm job mapping dir: %w", err)
	}
	return &Dir{path: path}, nil
}

// Path is the directory.
func (d *Dir) Path() string { return d.path }

// Sync makes the directory hold exactly one file per key in jobs (GPU or
// MIG slice → job ids), and no other mapping file. A GPU's file is removed,
// never left empty, when its jobs end: dcgm-exporter drops every series of
// a GPU whose file lists no job. Each file is replaced atomically (a
// temporary file whose name is not a number, which dcgm-exporter skips,
// then rename), and only when its content changes.
func (d *Dir) Sync(jobs map[Key][]uint32) error {
	var errs []error
	names := make(map[string]bool, len(jobs))
	for k, ids := range jobs {
		if k.GPU < 0 {
			errs = append(errs, fmt.Errorf("dcgm job mapping: GPU number %d", k.GPU))
			continue
		}
		names[k.Name()] = true
		ids = slices.Clone(ids)
		slices.Sort(ids)
		ids = slices.Compact(ids)
		var b bytes.Buffer
		for _, id := range ids {
			fmt.Fprintf(&b, "%d\n", id)
		}
		if err := d.write(k.Name(), b.Bytes()); err != nil {
			errs = append(errs, err)
		}
	}
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("dcgm job mapping: %w", err))...)
	}
	for _, e := range entries {
		if !mappingName.MatchString(e.Name()) || e.IsDir() {
			continue // not a mapping file (dcgm-exporter skips it too)
		}
		if names[e.Name()] {
			continue
		}
		if err := os.Remove(filepath.Join(d.path, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("dcgm job mapping: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (d *Dir) write(name string, content []byte) error {
	final := filepath.Join(d.path, name)
	if old, err := os.ReadFile(final); err == nil && bytes.Equal(old, content) {
		return nil
	}
	// No fsync: a mapping lost in a crash is rewritten when the agent
	// starts again, from the jobs it restores.
	tmp := filepath.Join(d.path, ".gpufence-"+name+".tmp")
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("dcgm job mapping file for GPU %s: %w", name, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("dcgm job mapping file for GPU %s: %w", name, err)
	}
	return nil
}
