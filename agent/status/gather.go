// SPDX-License-Identifier: Apache-2.0

package status

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/policy"
	"github.com/gpufence/gpufence/agent/slurm"
	"github.com/gpufence/gpufence/agent/statefile"
	"github.com/gpufence/gpufence/agent/users"
	"github.com/gpufence/gpufence/agent/version"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// Gather reads what Build needs from this node. agentUID is the uid the
// agent runs as (0): a socket or a listener of another uid is not the
// agent's, and nothing about it is trusted.
func Gather(cfg config.Config, agentUID uint32) Input {
	in := Input{
		Version: version.Version, PinDir: cfg.PinDir, StateFile: cfg.StateFile,
		Agent:       agentReport(ProbeSocket(cfg.Socket), agentUID),
		CgroupAlive: map[uint64]bool{}, CgroupIDs: map[string]uint64{}, Exempt: map[uint64]string{},
		UserName: (&users.Cache{}).Name,
	}
	in.State, in.StateExists, in.StateErr = statefile.Read(cfg.StateFile)
	if in.State != nil {
		for _, j := range in.State.Jobs {
			for _, s := range j.Steps {
				var st unix.Stat_t
				if err := unix.Stat(s.Cgroup, &st); err == nil {
					in.CgroupIDs[s.Cgroup] = st.Ino
				}
			}
		}
	}
	if cfg.PinDir != "" {
		in.Kernel, in.KernelErr = devfilter.InspectPins(cfg.PinDir)
		if in.KernelErr == nil {
			for id := range in.Kernel.Entries {
				if alive, err := cgroup.Exists(id); err == nil {
					in.CgroupAlive[id] = alive
				}
			}
		}
	}
	if in.State != nil && in.State.GPUTable != nil {
		if devs, err := tableDevices(in.State.GPUTable, in.Kernel); err != nil {
			in.DevicesErr = err.Error()
		} else {
			in.Devices = devs
		}
	}
	// Slurm's scope, by the agent's own rule.
	var candidates []string
	if mnt, err := jobcgroup.Mountpoint(); err == nil {
		w := jobcgroup.Where{Mount: mnt, Configured: cfg.Scope, Node: cfg.NodeName}
		st, _ := slurm.ReadSettings(cfg.SlurmConf)
		w.Slice = st.CgroupSlice
		found := jobcgroup.Find(w)
		if found.Err != nil {
			in.ScopeErr = found.Err.Error()
		}
		in.SlurmScope, in.IgnoredScopes = found.Scope, found.Ignored()
		if found.Scope != "" {
			in.SlurmScopeID, _ = jobcgroup.ID(found.Scope)
		}
		sd, err := found.Slurmd(mnt, st.SlurmdPid(cfg.NodeName))
		if err != nil {
			in.SlurmdErr = err.Error()
		}
		if sd != "" {
			if id, err := jobcgroup.ID(sd); err == nil {
				in.Slurmd, in.SlurmdID = sd, id
				// Its entry is the agent's, for root only: an exempt one.
				if rel, err := filepath.Rel(mnt, sd); err == nil {
					in.Exempt[id] = rel
				}
			}
		}
	}
	// The scope shown: the one the pinned state names, else the state
	// file's, the configured one or Slurm's.
	if in.State != nil && in.State.Scope != "" {
		candidates = append(candidates, in.State.Scope)
	}
	if cfg.Scope != "" {
		candidates = append(candidates, cfg.Scope)
	}
	if in.SlurmScope != "" {
		candidates = append(candidates, in.SlurmScope)
	}
	for _, c := range candidates {
		id, err := jobcgroup.ID(c)
		if err != nil {
			continue
		}
		if in.Kernel != nil && in.Kernel.ScopeID != 0 {
			if id == in.Kernel.ScopeID {
				in.Scope = c
				break
			}
			continue
		}
		in.Scope = c
		break
	}
	if in.Scope != "" && in.Kernel != nil && in.Kernel.Mode == devfilter.ModeScope {
		for _, name := range cfg.ExemptCgroups {
			if id, err := jobcgroup.ID(filepath.Join(in.Scope, name)); err == nil {
				in.Exempt[id] = name
			}
		}
	}
	return in
}

// agentReport is the socket as status reports it, the listener checked
// against uid, the one the agent runs as.
func agentReport(s Socket, uid uint32) AgentReport {
	a := AgentReport{Socket: s.Path, SocketExists: s.IsSocket, Listening: s.Listening, WantUID: uid}
	switch {
	case s.StatErr != nil && !errors.Is(s.StatErr, unix.ENOENT):
		a.Error = s.StatErr.Error()
	case s.StatErr == nil && !s.IsSocket:
		a.Error = "not a socket"
	case s.DialErr != nil:
		a.Error = s.DialErr.Error()
	}
	if s.IsSocket {
		owner := s.UID
		a.OwnerUID = &owner
	}
	if s.Listening {
		a.PID = int(s.PeerPID)
		if s.PeerKnown {
			peer := s.PeerUID
			a.ListenerUID = &peer
		}
		var why []string
		for _, err := range []error{s.OwnerErr(uid), s.ListenerErr(uid)} {
			if err != nil {
				why = append(why, err.Error())
			}
		}
		a.Untrusted = strings.Join(why, "; ")
	}
	return a
}

// tableDevices resolves the device numbers of the state's GPU table, as
// the agent resolved them from the same files (devices.Resolve): the
// nvidia major the pinned filter narrows, else the default, and the
// nvidia-caps major of /proc/devices.
func tableDevices(t *statefile.GPUTable, kernel *devfilter.PinnedView) (map[int]policy.Devices, error) {
	major, capsMajor := uint32(devfilter.DefaultNvidiaMajor), uint32(0)
	if kernel != nil && kernel.Config != nil {
		major, capsMajor = kernel.Config.NvidiaMajor, kernel.Config.CapsMajor
	}
	if capsMajor == 0 {
		if m, found, err := devices.CapsMajor(); err == nil && found {
			capsMajor = m
		}
	}
	gpus := make([]slurm.GPU, 0, len(t.GPUs))
	for _, g := range t.GPUs {
		if len(g.Files) == 0 {
			return nil, fmt.Errorf("GPU %d has no device file", g.Index)
		}
		gpus = append(gpus, slurm.GPU{Index: g.Index, Type: g.Type, Path: g.Files[0], Files: g.Files, MIG: len(g.Files) > 1})
	}
	resolved, err := devices.Resolve(gpus, major, capsMajor)
	if err != nil {
		return nil, err
	}
	out := make(map[int]policy.Devices, len(resolved))
	for _, g := range resolved {
		out[g.Index] = policy.Devices{GPUMinor: g.Minor, CapsMinors: g.CapsMinors()}
	}
	return out, nil
}
