// SPDX-License-Identifier: Apache-2.0

package handler

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/agent/verifycgroup"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// maxVerify bounds the verify cgroups registered at once.
const maxVerify = 8

// verifyStart gives the verify cgroup the peer runs in one GPU, the way a
// step gets its GPUs (one kernel entry, or in per-cgroup mode the filter
// attached there), after checking that the cgroup is exactly a verify
// cgroup below the scope the filter guards. It repairs nothing: what it
// finds wrong with the filter is reported for verify to name.
func (h *Handler) verifyStart(p peer.Peer, m *pb.VerifyStart) (*pb.Response, error) {
	found := h.Enforcer.FindScope()
	live := found.Scope
	if live == "" {
		live = h.Enforcer.Scope()
	}
	if live == "" {
		return nil, errors.New("verify: Slurm's slurmstepd scope does not exist on this node (slurmd not started?)")
	}
	rel, err := h.cgroups().PathOf(p.PID)
	if err == nil {
		err = p.Verify()
	}
	if err != nil {
		return nil, fmt.Errorf("verify: cannot read the cgroup of the verify process: %w", err)
	}
	dir := filepath.Join(h.Mount, rel)
	loc, err := jobcgroup.Parse(h.Mount, rel, live)
	if err != nil || loc.Step != dir || !verifycgroup.IsDir(filepath.Base(loc.Job)) || filepath.Base(loc.Step) != verifycgroup.Given {
		return nil, fmt.Errorf("verify: cgroup %s is not a gpufence verify cgroup (%s/%s<pid>/%s); only that cgroup may be given a GPU this way", rel, live, verifycgroup.Prefix, verifycgroup.Given)
	}
	for _, d := range []string{loc.Job, loc.Step} {
		if uid, err := h.cgroups().Owner(d); err != nil || uid != 0 {
			return nil, fmt.Errorf("verify: cgroup %s is not root's", d)
		}
	}
	id, err := h.cgroups().ID(loc.Step)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	cg := cgroup.Cgroup{ID: id, Path: loc.Step}
	if h.Registry.Owned(id) {
		return nil, fmt.Errorf("verify: cgroup %s is registered to a step", loc.Step)
	}
	if why := h.Table.Untrusted(); why != "" {
		return nil, fmt.Errorf("verify: the node's GPU table is not trusted, so no step gets a GPU: %s", why)
	}
	gpus := h.Table.GPUs()
	if len(gpus) == 0 {
		return nil, errors.New("verify: this node's GPU table has no GPU")
	}
	g := gpus[0].Index
	if m.Gpu != nil {
		g = int(m.GetGpu())
		if _, bad := h.Table.Unknown([]int{g}); bad {
			return nil, fmt.Errorf("verify: GPU %d is not in this node's GPU table", g)
		}
	}
	set, err := h.Table.Devices([]int{g})
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	mode, scope, problem := h.Enforcer.Guards(live)
	if found.Err != nil {
		// The filter may be where it was; that it cannot be shown to be
		// on Slurm's scope is what verify must fail on.
		problem = strings.TrimPrefix(problem+"; ", "; ") + found.Err.Error()
	}

	h.verifyMu.Lock()
	for vid, v := range h.verifying {
		if now, err := h.cgroups().ID(v.cg.Path); err != nil || now != vid {
			// Its verify died before VerifyEnd: the kernel entry goes
			// with the orphan sweep once the cgroup is gone.
			delete(h.verifying, vid)
		}
	}
	_, dup := h.verifying[id]
	full := len(h.verifying) >= maxVerify
	if !dup && !full {
		if h.verifying == nil {
			h.verifying = map[uint64]verifying{}
		}
		h.verifying[id] = verifying{cg: cg, gpu: g}
	}
	h.verifyMu.Unlock()
	switch {
	case dup:
		return nil, fmt.Errorf("verify: cgroup %s is already registered", loc.Step)
	case full:
		return nil, fmt.Errorf("verify: %d self-tests are running already", maxVerify)
	}
	if err := h.Enforcer.Set(cg, devfilter.Policy{GPUMinors: set.GPUMinors, CapsMinors: set.CapsMinors}); err != nil {
		h.verifyMu.Lock()
		delete(h.verifying, id)
		h.verifyMu.Unlock()
		return nil, fmt.Errorf("verify: cannot give cgroup %s its GPU: %w", loc.Step, err)
	}
	h.Log.Info("verify cgroup given a GPU", "cgroup", loc.Step, "gpu", g, "filter_problem", problem)
	info := &pb.VerifyInfo{Mode: string(mode), PolicyMode: h.Mode.String(), Scope: scope, FilterProblem: problem,
		Cgroup: "/" + strings.TrimPrefix(rel, "/"), CgroupId: id, Gpu: uint32(g)}
	for _, t := range gpus {
		files := t.Files
		if len(files) == 0 {
			files = []string{t.Path}
		}
		info.Gpus = append(info.Gpus, &pb.VerifyGPU{Index: uint32(t.Index), Files: files})
	}
	return &pb.Response{Verify: info}, nil
}

// verifyEnd takes the verify cgroup's entry away (verify removed the
// cgroup first), reports whether any is left and audits the self-test.
func (h *Handler) verifyEnd(m *pb.VerifyEnd) (*pb.Response, error) {
	id := m.GetCgroupId()
	h.verifyMu.Lock()
	v, ok := h.verifying[id]
	delete(h.verifying, id)
	cg := v.cg
	h.verifyMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("verify: cgroup %d is not a verify cgroup the agent registered", id)
	}
	if err := h.Enforcer.Release(cg, registry.Owner{}); err != nil {
		h.Log.Error("verify: remove the verify cgroup's entry", "cgroup", cg.Path, "err", err)
	}
	// Per-cgroup mode: the filter comes off the cgroup once it is gone.
	h.Enforcer.ForgetEnded()
	left := uint32(0)
	if f := h.Enforcer.Filter(); f != nil {
		entries, err := f.Policies()
		if err != nil {
			return nil, fmt.Errorf("verify: list kernel entries: %w", err)
		}
		if _, ok := entries[id]; ok {
			left = 1
		}
	}
	failed := m.GetFailed()
	if left > 0 {
		failed = append(failed, fmt.Sprintf("the kernel entry of verify cgroup %d is left behind", id))
	}
	took := (time.Duration(m.GetElapsedUs()) * time.Microsecond).Round(100 * time.Microsecond)
	rel := strings.TrimPrefix(cg.Path, h.Mount)
	sev, msg := audit.SeverityInfo, fmt.Sprintf("gpufence verify passed: a throw-away cgroup given one GPU opened it and was refused the others (%v)", took)
	if len(failed) > 0 {
		sev, msg = audit.SeverityError, fmt.Sprintf("gpufence verify failed (%v): %s", took, strings.Join(failed, "; "))
	}
	h.Log.Info("verify ended", "cgroup", cg.Path, "failed", len(failed), "took", took)
	h.emit(audit.EventVerify, sev, msg, func(r *audit.Record) {
		r.Cgroup, r.CgroupID, r.PolicyMode = rel, id, h.Mode.String()
		r.UID, r.GPUs = audit.UID(0), []int{v.gpu}
		if len(failed) > 0 {
			r.Error = strings.Join(failed, "; ")
		}
	})
	return &pb.Response{Verify: &pb.VerifyInfo{CgroupId: id, EntriesLeft: left}}, nil
}

// verifying is a verify cgroup registered and the GPU it was given.
type verifying struct {
	cg  cgroup.Cgroup
	gpu int
}

// VerifyRegistered is how many verify cgroups are registered now.
func (h *Handler) VerifyRegistered() int {
	h.verifyMu.Lock()
	defer h.verifyMu.Unlock()
	return len(h.verifying)
}
