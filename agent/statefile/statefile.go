// SPDX-License-Identifier: Apache-2.0

// Package statefile is the agent's saved state: which job, step and user
// each kernel entry belongs to, kept across agent restarts. The agent
// writes it; `gpufence status` reads it.
package statefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
)

// Version is bumped when the file's meaning changes; an unknown version is
// not read.
const Version = 1

// File is the state file's content.
type File struct {
	Version int    `json:"version"`
	Scope   string `json:"scope,omitempty"`
	Jobs    []Job  `json:"jobs"`
	// GPUTable is the GPU table the agent uses and where it came from.
	GPUTable *GPUTable `json:"gpu_table,omitempty"`
}

// GPUTable is the agent's GPU table: its source (slurmd -G or gres.conf),
// why, and whether it gives GPUs out.
type GPUTable struct {
	Source     string `json:"source"`
	Detail     string `json:"detail,omitempty"`
	Slurmd     string `json:"slurmd,omitempty"`
	GresConf   string `json:"gres_conf,omitempty"`
	AutoDetect string `json:"autodetect,omitempty"`
	// Untrusted is why no step gets a GPU ("" when GPUs are given out).
	Untrusted string     `json:"untrusted,omitempty"`
	GPUs      []TableGPU `json:"gpus"`
}

// TableGPU is one of Slurm's GPU indices and its device files.
type TableGPU struct {
	Index int      `json:"index"`
	Type  string   `json:"type,omitempty"`
	Files []string `json:"files"`
}

// Job is one job on the node.
type Job struct {
	ID       uint32 `json:"id"`
	UID      uint32 `json:"uid"`
	GPUs     []int  `json:"gpus"`
	Broken   string `json:"broken,omitempty"`
	NoProlog bool   `json:"no_prolog,omitempty"`
	// Recovered names the slurmctld output the list came from, when not
	// the prolog; Adopted, for a job found running at agent start, what
	// slurmctld said; Unconfirmed how such a job is handled when slurmctld
	// did not confirm it (audit-only, deny).
	Recovered   string    `json:"recovered,omitempty"`
	Adopted     string    `json:"adopted,omitempty"`
	Unconfirmed string    `json:"unconfirmed,omitempty"`
	Dir         string    `json:"dir,omitempty"`
	Created     time.Time `json:"created"`
	Steps       []Step    `json:"steps,omitempty"`
	// Shares are the shard and mps shares slurmctld says the job holds
	// (agent/shares); informational, never a GPU the job may open.
	Shares []audit.Share `json:"shares,omitempty"`
}

// Step is one registered step and the cgroup its kernel entry is keyed by.
type Step struct {
	ID       uint32 `json:"id"`
	UID      uint32 `json:"uid"`
	CgroupID uint64 `json:"cgroup_id"`
	Cgroup   string `json:"cgroup"`
	GPUs     []int  `json:"gpus"`
	// AuditOnly: the kernel entry allows what GPUs does not and reports it.
	AuditOnly bool `json:"audit_only,omitempty"`
	Adopted   bool `json:"adopted,omitempty"`
}

// Read reads path; exists is false (and err nil) when there is no file.
func Read(path string) (f *File, exists bool, err error) {
	if path == "" {
		return nil, false, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	var st File
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, true, fmt.Errorf("%s: %w", path, err)
	}
	if st.Version != Version {
		return nil, true, fmt.Errorf("%s: state version %d, this gpufence reads %d", path, st.Version, Version)
	}
	return &st, true, nil
}

// Write replaces path atomically (temp file, fsync, rename), so a crash
// leaves either the old or the new file.
func Write(path string, f File) error {
	f.Version = Version
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".state-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
