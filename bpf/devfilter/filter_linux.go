// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/gpufence/gpufence/agent/cgroup"
	"golang.org/x/sys/unix"
)

// Helpers each program calls beyond the map, ring buffer, time and uid
// helpers that every kernel with ring buffers offers to cgroup device
// programs (TestProbedHelpersCoverPrograms keeps these lists complete). Both
// read the task (process, executable) through the helpers that
// bpf_base_func_proto offers a CAP_PERFMON loader; what sets the modes apart
// is bpf_get_current_ancestor_cgroup_id and cgroup storage.
var (
	taskHelpers  = []asm.BuiltinFunc{asm.FnGetCurrentTask, asm.FnProbeReadKernel, asm.FnProbeReadKernelStr}
	scopeHelpers = append([]asm.BuiltinFunc{asm.FnGetCurrentAncestorCgroupId, asm.FnGetCurrentCgroupId}, taskHelpers...)

	perCgroupHelpers = append([]asm.BuiltinFunc{asm.FnGetLocalStorage}, taskHelpers...)
)

// Probe reports the best mode this kernel supports, or an error naming the
// missing feature. It needs the privileges New needs.
func Probe() (Mode, error) {
	if err := features.HaveProgramType(ebpf.CGroupDevice); err != nil {
		return "", fmt.Errorf("probe CGROUP_DEVICE programs: %w", err)
	}
	if err := features.HaveMapType(ebpf.RingBuf); err != nil {
		return "", fmt.Errorf("probe ring buffer maps: %w", err)
	}
	// Both programs read the task with CO-RE relocations.
	if _, err := btf.LoadKernelSpec(); err != nil {
		return "", fmt.Errorf("probe kernel BTF (/sys/kernel/btf/vmlinux, for the programs' CO-RE reads of the task): %w", err)
	}
	scopeErr := haveHelpers(scopeHelpers)
	if scopeErr == nil {
		return ModeScope, nil
	}
	perCgroupErr := features.HaveMapType(ebpf.CGroupStorage)
	if perCgroupErr != nil {
		perCgroupErr = fmt.Errorf("probe cgroup storage maps: %w", perCgroupErr)
	} else {
		perCgroupErr = haveHelpers(perCgroupHelpers)
	}
	if perCgroupErr == nil {
		return ModePerCgroup, nil
	}
	return "", fmt.Errorf("no device filter mode supported: %s: %w; %s: %w", ModeScope, scopeErr, ModePerCgroup, perCgroupErr)
}

func haveHelpers(helpers []asm.BuiltinFunc) error {
	for _, h := range helpers {
		if err := features.HaveProgramHelper(ebpf.CGroupDevice, h); err != nil {
			return fmt.Errorf("probe helper %s for CGROUP_DEVICE programs: %w", h, err)
		}
	}
	return nil
}

// scopeObjects are what ModeScope loads from the collection.
type scopeObjects struct {
	Program  *ebpf.Program `ebpf:"devfilter_scope"`
	Config   *ebpf.Map     `ebpf:"config"`
	Policies *ebpf.Map     `ebpf:"policies"`
	Events   *ebpf.Map     `ebpf:"events"`
	Lost     *ebpf.Map     `ebpf:"lost"`
	Rate     *ebpf.Map     `ebpf:"rate"`
	RateFull *ebpf.Map     `ebpf:"rate_full"`
}

// perCgroupObjects are what ModePerCgroup loads from the collection.
type perCgroupObjects struct {
	Program  *ebpf.Program `ebpf:"devfilter_cgroup"`
	Config   *ebpf.Map     `ebpf:"config"`
	Storage  *ebpf.Map     `ebpf:"storage"`
	Events   *ebpf.Map     `ebpf:"events"`
	Lost     *ebpf.Map     `ebpf:"lost"`
	Rate     *ebpf.Map     `ebpf:"rate"`
	RateFull *ebpf.Map     `ebpf:"rate_full"`
}

// Filter is a loaded device filter. Its methods are safe for concurrent use.
type Filter struct {
	mode Mode
	log  *slog.Logger

	program  *ebpf.Program
	config   *ebpf.Map
	policies *ebpf.Map // ModeScope
	storage  *ebpf.Map // ModePerCgroup
	events   *ebpf.Map
	lost     *ebpf.Map
	rate     *ebpf.Map
	rateFull *ebpf.Map
	reader   *ringbuf.Reader
	// draining is set by Drain: the ring buffer's flush marker then ends
	// ReadEvent instead of being read past.
	draining atomic.Bool

	// pinDir is Options.PinDir; adopted says New took its pins over.
	pinDir  string
	adopted bool

	mu     sync.Mutex
	closed bool
	// cfg is what the config map holds.
	cfg devfilterFilterConfig
	// scopeLink is the scope's attachment of ModeScope; slurmdLink the one
	// on slurmd's own cgroup outside the scope, nil when there is none.
	scopeLink  link.Link
	slurmdLink link.Link
	// attached are the attachments of ModePerCgroup, by cgroup id.
	attached map[uint64]link.Link
}

// New loads the program for opts.Mode, configures it and, in ModeScope,
// attaches it to opts.ScopeDir.
//
// With opts.PinDir, New first adopts what a previous filter pinned there
// for the same mode and scope: the maps it can use as they are (policies
// survive), the scope link or the per-cgroup links, into which it swaps the
// new program by bpf_link update (the kernel replaces the program
// atomically: the cgroup is never without a filter). A map whose layout
// changed is created anew, its entries copied when they keep their layout.
// Pins of another mode or scope are stale: detached and removed first.
// Everything New and Set create is pinned.
func New(opts Options) (_ *Filter, err error) {
	opts, err = opts.validate()
	if err != nil {
		return nil, err
	}
	if opts.Mode == ModeAuto {
		if opts.Mode, err = Probe(); err != nil {
			return nil, err
		}
	}
	var (
		level   int
		scopeID uint64
	)
	if opts.Mode == ModeScope {
		if level, err = scopeLevel(opts.ScopeDir); err != nil {
			return nil, fmt.Errorf("device filter scope: %w", err)
		}
		var st unix.Stat_t
		if err := unix.Stat(opts.ScopeDir, &st); err != nil {
			return nil, fmt.Errorf("device filter scope: %w", err)
		}
		scopeID = st.Ino
	}
	// Only needed before Linux 5.11, which charged BPF memory to RLIMIT_MEMLOCK.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("device filter: %w", err)
	}

	f := &Filter{mode: opts.Mode, log: opts.Logger, attached: map[uint64]link.Link{}, pinDir: opts.PinDir}
	spec, err := loadDevfilter()
	if err != nil {
		return nil, err
	}
	if testSpecHook != nil {
		testSpecHook(opts.Mode, spec)
	}
	var prev *pinned
	if opts.PinDir != "" {
		if err := EnsureBPFFS(opts.PinDir); err != nil {
			return nil, fmt.Errorf("device filter: %w", err)
		}
		if prev, err = openPinned(opts.PinDir, opts.Mode, scopeID, f.log); err != nil {
			return nil, fmt.Errorf("device filter: %w", err)
		}
		// Closes the fds of the pinned objects not taken over; the pins
		// keep them.
		defer prev.close()
	}
	reused := prev.replacements(spec, opts.Mode, f.log)
	// The CO-RE reads only name vmlinux types. Without KernelTypes the
	// library would load every module's BTF too, and fail the load when a
	// module goes away meanwhile (seen at boot: powernow_k8 unloading).
	kernelTypes, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("load device filter (%s): kernel BTF: %w", opts.Mode, err)
	}
	loadOpts := &ebpf.CollectionOptions{MapReplacements: reused, Programs: ebpf.ProgramOptions{KernelTypes: kernelTypes}}
	switch opts.Mode {
	case ModeScope:
		var objs scopeObjects
		err = spec.LoadAndAssign(&objs, loadOpts)
		f.program, f.config, f.policies, f.events, f.lost = objs.Program, objs.Config, objs.Policies, objs.Events, objs.Lost
		f.rate, f.rateFull = objs.Rate, objs.RateFull
	case ModePerCgroup:
		var objs perCgroupObjects
		err = spec.LoadAndAssign(&objs, loadOpts)
		f.program, f.config, f.storage, f.events, f.lost = objs.Program, objs.Config, objs.Storage, objs.Events, objs.Lost
		f.rate, f.rateFull = objs.Rate, objs.RateFull
	}
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load device filter (%s): %w\nverifier log:\n%+v", opts.Mode, err, verr)
		}
		return nil, fmt.Errorf("load device filter (%s): %w", opts.Mode, err)
	}

	f.cfg = devfilterFilterConfig{
		ScopeLevel:   uint32(level),
		NvidiaMajor:  opts.NvidiaMajor,
		AuditOnly:    boolU32(opts.AuditOnly),
		AuditAllowed: uint32(auditAllowedCodes[opts.AuditAllowed]),
		RateWindowNs: uint64(opts.RateWindow),
		RateBurst:    opts.RateBurst,
		CapsMajor:    opts.CapsMajor,
		// The fabric and IMEX majors are the last words of the config: a
		// pinned config map of an older program is shorter and was
		// replaced.
		NvswitchMajor: opts.NVSwitchMajor,
		NvlinkMajor:   opts.NVLinkMajor,
		ImexMajor:     opts.IMEXMajor,
	}
	// An adopted config map is read by the running program; it keeps its
	// layout (else it is not adopted: the new program gets a new one), and
	// only the option words change.
	if err := putConfig(f.config, f.cfg); err != nil {
		return nil, errors.Join(fmt.Errorf("configure device filter: %w", err), f.closeObjects())
	}
	if f.reader, err = ringbuf.NewReader(f.events); err != nil {
		return nil, errors.Join(fmt.Errorf("device filter events: %w", err), f.closeObjects())
	}
	defer func() {
		if err != nil {
			// Closes fds only for what is pinned, detaches the rest.
			err = errors.Join(err, f.Close())
		}
	}()
	if opts.PinDir != "" {
		if err := f.pinMaps(opts.PinDir, prev, reused, scopeID); err != nil {
			return nil, err
		}
	}
	if opts.Mode == ModeScope && opts.BeforeAttach != nil {
		if err := opts.BeforeAttach(f); err != nil {
			return nil, fmt.Errorf("device filter: before attaching: %w", err)
		}
	}
	switch {
	case opts.Mode == ModeScope && prev != nil && prev.link != nil:
		// BPF_LINK_UPDATE: the kernel swaps the program of the attachment
		// in place (the bpf_link counterpart of BPF_F_REPLACE).
		if info, err := prev.link.Info(); err == nil && info.Cgroup() != nil && info.Cgroup().CgroupId != scopeID {
			return nil, fmt.Errorf("pinned device filter link is on cgroup %d, not the scope %d", info.Cgroup().CgroupId, scopeID)
		}
		if err := prev.link.Update(f.program); err != nil {
			return nil, fmt.Errorf("update device filter program on the scope: %w", err)
		}
		f.scopeLink, prev.link = prev.link, nil
	case opts.Mode == ModeScope:
		if f.scopeLink, err = attach(opts.ScopeDir, 0, f.program); err != nil {
			return nil, err
		}
		if opts.PinDir != "" {
			if err := pinOver(opts.PinDir, pinLinkName, f.scopeLink.Pin); err != nil {
				return nil, err
			}
		}
	case prev != nil:
		if err := f.adoptCgroupLinks(prev, reused["storage"] != nil); err != nil {
			return nil, err
		}
	}
	if opts.Mode == ModeScope && prev != nil {
		if err := f.adoptSlurmdLink(prev); err != nil {
			return nil, err
		}
	}
	f.adopted = prev != nil
	if opts.Mode == ModePerCgroup && opts.BeforeAttach != nil {
		if err := opts.BeforeAttach(f); err != nil {
			return nil, fmt.Errorf("device filter: after taking over pinned links: %w", err)
		}
	}
	f.log.Info("device filter loaded", "mode", string(f.mode), "scope", opts.ScopeDir,
		"pin_dir", opts.PinDir, "adopted", f.adopted, "adopted_links", len(f.attached),
		"scope_level", level, "nvidia_major", opts.NvidiaMajor, "caps_major", opts.CapsMajor,
		"nvswitch_major", opts.NVSwitchMajor, "nvlink_major", opts.NVLinkMajor, "imex_major", opts.IMEXMajor, "audit_only", opts.AuditOnly,
		"audit_allowed", string(opts.AuditAllowed), "rate_window", opts.RateWindow, "rate_burst", opts.RateBurst)
	return f, nil
}

var auditAllowedCodes = map[AuditAllowed]devfilterAuditAllowed{
	AuditAllowedNone:  devfilterAuditAllowedAUDIT_ALLOWED_NONE,
	AuditAllowedFirst: devfilterAuditAllowedAUDIT_ALLOWED_FIRST,
	AuditAllowedAll:   devfilterAuditAllowedAUDIT_ALLOWED_ALL,
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// attach links prog to the cgroup dir, checking its id when id is not 0.
// A bpf_link always attaches with BPF_F_ALLOW_MULTI semantics, so it never
// replaces nor overrides a program someone else attached (Slurm's).
func attach(dir string, id uint64, prog *ebpf.Program) (link.Link, error) {
	if err := cgroup.CheckDir(dir, id); err != nil {
		return nil, fmt.Errorf("attach device filter to %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("attach device filter to %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if id != 0 {
		// The path may have been replaced since checkCgroup2Dir.
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, fmt.Errorf("attach device filter to %s: %w", dir, err)
		}
		if st.Ino != id {
			return nil, fmt.Errorf("attach device filter to %s: cgroup id %d, not %d", dir, st.Ino, id)
		}
	}
	l, err := attachFD(fd, prog)
	if err != nil {
		return nil, fmt.Errorf("attach device filter to %s: %w", dir, err)
	}
	return l, nil
}

// attachFD links prog to the cgroup directory open at fd.
func attachFD(fd int, prog *ebpf.Program) (link.Link, error) {
	// AttachCgroup would fall back to a plain attach without bpf_link, which
	// cannot be pinned nor updated; a raw link fails instead.
	raw, err := link.AttachRawLink(link.RawLinkOptions{Target: fd, Program: prog, Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		return nil, err
	}
	// A raw link's Info leaves out which cgroup it is on; the typed link
	// (what a pinned link loads as) tells it, which the scope check needs.
	dup, err := unix.FcntlInt(uintptr(raw.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("dup link fd: %w", err), raw.Close())
	}
	typed, err := link.NewFromFD(dup)
	if err != nil {
		unix.Close(dup)
		return nil, errors.Join(err, raw.Close())
	}
	if err := raw.Close(); err != nil {
		return nil, errors.Join(err, typed.Close())
	}
	return typed, nil
}

// Mode is the mode the filter runs in.
func (f *Filter) Mode() Mode { return f.mode }

func encodePolicy(cg cgroup.Cgroup, p Policy) (devfilterPolicy, error) {
	if cg.ID == 0 {
		return devfilterPolicy{}, errors.New("cgroup id 0")
	}
	gpus, caps, err := p.bitmaps()
	if err != nil {
		return devfilterPolicy{}, err
	}
	imex, err := p.imexWord()
	if err != nil {
		return devfilterPolicy{}, err
	}
	return devfilterPolicy{CgroupId: cg.ID, Flags: p.flags(), ImexChannel: imex, Minors: gpus, Caps: caps}, nil
}

func decodePolicy(v devfilterPolicy) Policy {
	return policyFromBitmaps(v.Flags, v.Minors[:], v.Caps[:], v.ImexChannel)
}

func storageKey(id uint64) devfilterBpfCgroupStorageKey {
	return devfilterBpfCgroupStorageKey{CgroupInodeId: id, AttachType: uint32(ebpf.AttachCGroupDevice)}
}

// Set gives cg the policy p, replacing any previous one. In ModePerCgroup it
// attaches the program to cg.Path the first time.
func (f *Filter) Set(cg cgroup.Cgroup, p Policy) error {
	v, err := encodePolicy(cg, p)
	if err != nil {
		return fmt.Errorf("set device policy of cgroup %d: %w", cg.ID, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("set device policy of cgroup %d: %w", cg.ID, ErrClosed)
	}
	if f.mode == ModeScope {
		if err := f.policies.Update(cg.ID, &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("set device policy of cgroup %d: %w", cg.ID, err)
		}
		f.log.Debug("device policy set", "cgroup", cg.Path, "cgroup_id", cg.ID, "allow_all", p.AllowAll, "gpu_minors", p.GPUMinors, "caps_minors", p.CapsMinors)
		return nil
	}

	if _, ok := f.attached[cg.ID]; !ok {
		if cg.Path == "" {
			return fmt.Errorf("set device policy of cgroup %d: no path", cg.ID)
		}
		l, err := attach(cg.Path, cg.ID, f.program)
		if err != nil {
			return err
		}
		if f.pinDir != "" {
			if err := pinOver(f.pinDir, cgroupPinName(cg.ID), l.Pin); err != nil {
				return errors.Join(err, l.Close())
			}
		}
		f.attached[cg.ID] = l
		f.log.Debug("device filter attached", "cgroup", cg.Path, "cgroup_id", cg.ID)
	}
	// Until this write the attachment's storage is zero: no GPU.
	if err := f.storage.Update(storageKey(cg.ID), &v, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("set device policy of cgroup %d: %w", cg.ID, err)
	}
	f.log.Debug("device policy set", "cgroup", cg.Path, "cgroup_id", cg.ID, "allow_all", p.AllowAll, "gpu_minors", p.GPUMinors, "caps_minors", p.CapsMinors)
	return nil
}

// Remove takes the policy of cg away. In ModeScope the cgroup is then denied
// every GPU; in ModePerCgroup the program is detached from it, which leaves
// it unnarrowed (Remove is for cgroups that are going away).
func (f *Filter) Remove(cg cgroup.Cgroup) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("remove device policy of cgroup %d: %w", cg.ID, ErrClosed)
	}
	if f.mode == ModeScope {
		err := f.policies.Delete(cg.ID)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove device policy of cgroup %d: %w", cg.ID, err)
		}
		f.log.Debug("device policy removed", "cgroup", cg.Path, "cgroup_id", cg.ID)
		return nil
	}

	l, ok := f.attached[cg.ID]
	if !ok {
		return nil
	}
	// Storage outlives the attachment (Linux >= 5.9 keeps it until the
	// cgroup dies); zero it so a later attach starts with no GPU.
	var zero devfilterPolicy
	err := f.storage.Update(storageKey(cg.ID), &zero, ebpf.UpdateExist)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove device policy of cgroup %d: %w", cg.ID, err)
	}
	if f.pinDir != "" {
		// The pin holds the link: detach it explicitly.
		if err := l.Detach(); err != nil {
			return fmt.Errorf("detach device filter from cgroup %d: %w", cg.ID, err)
		}
		p := filepath.Join(f.pinDir, cgroupPinName(cg.ID))
		if err := unlinkPin(p); err != nil {
			return fmt.Errorf("unpin device filter of cgroup %d: %w", cg.ID, err)
		}
	}
	if err := l.Close(); err != nil {
		return fmt.Errorf("detach device filter from cgroup %d: %w", cg.ID, err)
	}
	delete(f.attached, cg.ID)
	f.log.Debug("device filter detached", "cgroup", cg.Path, "cgroup_id", cg.ID)
	return nil
}

// Policies returns the policies in the kernel, by cgroup id. In
// ModePerCgroup, cgroups removed since Set are left out.
func (f *Filter) Policies() (map[uint64]Policy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, fmt.Errorf("list device policies: %w", ErrClosed)
	}
	out := map[uint64]Policy{}
	if f.mode == ModeScope {
		var (
			id uint64
			v  devfilterPolicy
		)
		it := f.policies.Iterate()
		for it.Next(&id, &v) {
			out[id] = decodePolicy(v)
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("list device policies: %w", err)
		}
		return out, nil
	}
	for id := range f.attached {
		var v devfilterPolicy
		err := f.storage.Lookup(storageKey(id), &v)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list device policies: cgroup %d: %w", id, err)
		}
		out[id] = decodePolicy(v)
	}
	return out, nil
}

// ReadEvent blocks until the program reports an access, and returns
// ErrClosed once the filter is closed.
func (f *Filter) ReadEvent() (Event, error) {
	for {
		rec, err := f.reader.Read()
		switch {
		case err == nil:
			return decodeEvent(rec.RawSample)
		case errors.Is(err, os.ErrClosed):
			return Event{}, ErrClosed
		case errors.Is(err, ringbuf.ErrFlushed) && f.draining.Load():
			return Event{}, ErrClosed
		case errors.Is(err, ringbuf.ErrFlushed):
			// Only Drain flushes; a marker without it is read past.
			continue
		}
		return Event{}, fmt.Errorf("read device filter event: %w", err)
	}
}

// Drain makes ReadEvent return every event the ring buffer holds now and
// then ErrClosed, so that an agent that stops reports what the kernel
// recorded while it ran. Closing the reader instead interrupts it at once:
// the records left then wait in the pinned ring buffer for the next agent,
// which may never read them (an uninstall) or be stopped before it does.
func (f *Filter) Drain() error {
	f.draining.Store(true)
	if err := f.reader.Flush(); err != nil {
		return fmt.Errorf("drain device filter events: %w", err)
	}
	return nil
}

// eventLayout1Size is the size of struct event before the executable's
// identity was added at its end; a program of that layout may still have
// records in the adopted ring buffer after an upgrade.
const eventLayout1Size = 72

func decodeEvent(raw []byte) (Event, error) {
	var e devfilterEvent
	size := binary.Size(e)
	if len(raw) < eventLayout1Size {
		return Event{}, fmt.Errorf("decode device filter event of %d bytes: want %d (or %d, the first layout)", len(raw), size, eventLayout1Size)
	}
	if len(raw) < size {
		// Zero-extended: an older record says nothing about the executable.
		raw = append(raw[:len(raw):len(raw)], make([]byte, size-len(raw))...)
	}
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, &e); err != nil {
		return Event{}, fmt.Errorf("decode device filter event of %d bytes: %w", len(raw), err)
	}
	comm := make([]byte, 0, len(e.Comm))
	for _, c := range e.Comm {
		if c == 0 {
			break
		}
		comm = append(comm, byte(c))
	}
	return Event{
		CgroupID:   e.CgroupId,
		Time:       time.Duration(e.KtimeNs),
		PID:        e.Pid,
		TGID:       e.Tgid,
		UID:        e.Uid,
		GID:        e.Gid,
		Major:      e.Major,
		Minor:      e.Minor,
		Access:     Access(e.Access),
		Decision:   Decision(e.Decision),
		Comm:       string(comm),
		Suppressed: e.Suppressed,
		Exe:        exeOf(e.ExeIno, e.ExeDev),
		Start:      time.Duration(e.StartBoottime),
	}, nil
}

// exeOf turns the kernel's inode number and dev_t (major << 20 | minor) into
// an ExeID; no inode means unknown.
func exeOf(ino uint64, kdev uint32) ExeID {
	if ino == 0 {
		return ExeID{}
	}
	return ExeID{Ino: ino, Major: kdev >> 20, Minor: kdev & (1<<20 - 1)}
}

// Lost is the number of events dropped because the ring buffer was full.
func (f *Filter) Lost() (uint64, error) {
	perCPU, err := f.LostPerCPU()
	return sum(perCPU), err
}

// LostPerCPU is the number of events dropped because the ring buffer was
// full, by CPU.
func (f *Filter) LostPerCPU() ([]uint64, error) {
	var perCPU []uint64
	if err := f.lost.Lookup(uint32(0), &perCPU); err != nil {
		return nil, fmt.Errorf("read lost device filter events: %w", err)
	}
	return perCPU, nil
}

// RateFull returns, by decision, how many accesses were neither reported
// nor counted under a rate key because the rate map was full. The counts
// only grow; with the events and Suppressed they add up to the accesses.
func (f *Filter) RateFull() (map[Decision]uint64, error) {
	out := map[Decision]uint64{}
	for _, d := range []Decision{DecisionDenied, DecisionAllowed, DecisionWouldDeny} {
		var perCPU []uint64
		if err := f.rateFull.Lookup(uint32(d), &perCPU); err != nil {
			return nil, fmt.Errorf("read device filter rate map overflows: %w", err)
		}
		if n := sum(perCPU); n > 0 {
			out[d] = n
		}
	}
	return out, nil
}

func sum(vs []uint64) uint64 {
	var n uint64
	for _, v := range vs {
		n += v
	}
	return n
}

// Suppressed returns, by rate key, how many accesses were not reported since
// the key was first seen (or ForgetRate). The totals only grow, so the
// accesses of a key are its events plus its total plus what was lost.
func (f *Filter) Suppressed() (map[RateKey]uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, fmt.Errorf("read suppressed device filter events: %w", ErrClosed)
	}
	out := map[RateKey]uint64{}
	var (
		k devfilterRateKey
		v devfilterRateValue
	)
	it := f.rate.Iterate()
	for it.Next(&k, &v) {
		out[RateKey{CgroupID: k.CgroupId, Major: k.Major, Minor: k.Minor, Decision: Decision(k.Decision)}] = v.SuppressedTotal
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read suppressed device filter events: %w", err)
	}
	return out, nil
}

// ForgetRate deletes the rate limit entries of a cgroup that is gone, after
// their last Suppressed read; a later access starts its keys from zero.
func (f *Filter) ForgetRate(cgroupID uint64) error {
	var (
		k    devfilterRateKey
		v    devfilterRateValue
		keys []devfilterRateKey
	)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("forget device filter rate of cgroup %d: %w", cgroupID, ErrClosed)
	}
	it := f.rate.Iterate()
	for it.Next(&k, &v) {
		if k.CgroupId == cgroupID {
			keys = append(keys, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("forget device filter rate of cgroup %d: %w", cgroupID, err)
	}
	for _, k := range keys {
		if err := f.rate.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget device filter rate of cgroup %d: %w", cgroupID, err)
		}
	}
	return nil
}

// SetAuditOnly switches audit-only mode on or off in the running program.
func (f *Filter) SetAuditOnly(on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("set device filter audit-only: %w", ErrClosed)
	}
	cfg := f.cfg
	cfg.AuditOnly = boolU32(on)
	// The program reads the config field by field; only this word changes.
	if err := putConfig(f.config, cfg); err != nil {
		return fmt.Errorf("set device filter audit-only: %w", err)
	}
	f.cfg = cfg
	f.log.Info("device filter audit-only mode set", "audit_only", on)
	return nil
}

// Close detaches everything the filter attached and frees its objects.
// With Options.PinDir it only closes its file descriptors: the pins keep
// the program attached and the policies in force (Unpin removes them).
func (f *Filter) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	var errs []error
	if err := f.reader.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close device filter events: %w", err))
	}
	if f.scopeLink != nil {
		if err := f.scopeLink.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach device filter from scope: %w", err))
		}
	}
	if f.slurmdLink != nil {
		if err := f.slurmdLink.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach device filter from slurmd's cgroup: %w", err))
		}
	}
	ids := make([]uint64, 0, len(f.attached))
	for id := range f.attached {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := f.attached[id].Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach device filter from cgroup %d: %w", id, err))
		}
		delete(f.attached, id)
	}
	errs = append(errs, f.closeObjects())
	f.log.Info("device filter closed", "mode", string(f.mode), "pinned", f.pinDir != "")
	return errors.Join(errs...)
}

func (f *Filter) closeObjects() error {
	var errs []error
	if f.program != nil {
		errs = append(errs, f.program.Close())
	}
	for _, m := range []*ebpf.Map{f.config, f.policies, f.storage, f.events, f.lost, f.rate, f.rateFull} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// putConfig writes cfg into the config map. A map of an older, shorter
// layout (only a program of that layout reads it: tests that play an older
// agent) gets the fields it has, and refuses a value whose dropped tail is
// not zero: a setting that program cannot apply. A map of any other size
// is refused, never written misaligned.
func putConfig(m *ebpf.Map, cfg devfilterFilterConfig) error {
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.NativeEndian, &cfg); err != nil {
		return err
	}
	raw := buf.Bytes()
	n := int(m.ValueSize())
	if !slices.Contains(configLayoutSizes, n) {
		return fmt.Errorf("config map of %d bytes: not a layout of %v bytes", n, configLayoutSizes)
	}
	if n < len(raw) {
		if slices.ContainsFunc(raw[n:], func(b byte) bool { return b != 0 }) {
			return fmt.Errorf("config map of %d bytes (an older layout) cannot hold the options set past them (NVSwitch major %d, NVLink major %d, IMEX major %d)",
				n, cfg.NvswitchMajor, cfg.NvlinkMajor, cfg.ImexMajor)
		}
		raw = raw[:n]
	}
	return m.Put(uint32(0), raw)
}
