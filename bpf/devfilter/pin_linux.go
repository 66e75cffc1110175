// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/gpufence/gpufence/agent/cgroup"
	"golang.org/x/sys/unix"
)

// DefaultBPFFS is where EnsureBPFFS mounts bpffs when it is absent.
const DefaultBPFFS = "/sys/fs/bpf"

// testSpecHook lets tests change the collection New loads, to play an
// upgrade that changes a map.
var testSpecHook func(Mode, *ebpf.CollectionSpec)

// EnsureBPFFS makes dir a directory on a bpffs, mounting bpffs at
// /sys/fs/bpf first when dir is below it and nothing is mounted there. It
// does nothing to a mounted bpffs.
func EnsureBPFFS(dir string) error { return ensureBPFFS(dir, DefaultBPFFS) }

func ensureBPFFS(dir, mountPoint string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("bpffs dir %q: not an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	if isBPFFS(dir) {
		return nil
	}
	if within(mountPoint, dir) && !isBPFFS(mountPoint) {
		if err := os.MkdirAll(mountPoint, 0o700); err != nil {
			return fmt.Errorf("mount bpffs at %s: %w", mountPoint, err)
		}
		if err := unix.Mount("bpf", mountPoint, "bpf", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpffs at %s: %w", mountPoint, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bpffs dir %s: %w", dir, err)
	}
	if !isBPFFS(dir) {
		return fmt.Errorf("bpffs dir %s: not on a bpf file system", dir)
	}
	return nil
}

func isBPFFS(p string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(p, &fs) == nil && fs.Type == unix.BPF_FS_MAGIC
}

// pinned is what New found under PinDir that belongs to its mode and scope.
type pinned struct {
	dir   string
	state *ebpf.Map
	maps  map[string]*ebpf.Map
	// link is the scope link, or nil; slurmd the link on slurmd's cgroup
	// outside the scope, or nil.
	link   link.Link
	slurmd link.Link
	// cgroups are the per-cgroup links, by the id in their pin name.
	cgroups map[uint64]link.Link
}

// openPinned opens the pins of dir. Pins of another layout version, mode or
// scope (or without a state map) are stale: it detaches and removes them and
// returns nil, as it does when dir holds no pins.
func openPinned(dir string, mode Mode, scopeID uint64, log *slog.Logger) (_ *pinned, err error) {
	names, err := pinNames(dir)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	want := pinState{Version: pinVersion, Mode: pinModeCode(mode), ScopeID: scopeID}
	st, got, err := loadState(dir)
	if err != nil || got != want {
		log.Warn("removing stale device filter pins", "dir", dir, "pinned", fmt.Sprintf("%+v", got),
			"want", fmt.Sprintf("%+v", want), "error", err)
		if st != nil {
			st.Close()
		}
		return nil, removePins(dir, names)
	}
	p := &pinned{dir: dir, state: st, maps: map[string]*ebpf.Map{}, cgroups: map[uint64]link.Link{}}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	for _, n := range mapNames(mode) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinMapPrefix+n), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned device filter map %s: %w", n, err)
		}
		p.maps[n] = m
	}
	for _, n := range names {
		switch {
		case n == pinLinkName && mode == ModeScope:
			l, err := link.LoadPinnedLink(filepath.Join(dir, n), nil)
			if err != nil {
				return nil, fmt.Errorf("open pinned device filter link: %w", err)
			}
			p.link = l
		case n == pinSlurmdLink && mode == ModeScope:
			l, err := link.LoadPinnedLink(filepath.Join(dir, n), nil)
			if err != nil {
				return nil, fmt.Errorf("open pinned device filter link %s: %w", n, err)
			}
			p.slurmd = l
		case strings.HasPrefix(n, pinCgroupPref) && mode == ModePerCgroup:
			id, err := strconv.ParseUint(strings.TrimPrefix(n, pinCgroupPref), 10, 64)
			if err != nil {
				continue // a _new left by a crash: removed below
			}
			l, err := link.LoadPinnedLink(filepath.Join(dir, n), nil)
			if err != nil {
				return nil, fmt.Errorf("open pinned device filter link %s: %w", n, err)
			}
			p.cgroups[id] = l
		default:
			continue
		}
	}
	// Leftovers of an interrupted replacement.
	for _, n := range names {
		if strings.HasSuffix(n, pinTempSuffix) {
			if err := removePins(dir, []string{n}); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

func (p *pinned) close() {
	if p == nil {
		return
	}
	if p.state != nil {
		p.state.Close()
	}
	for _, m := range p.maps {
		m.Close()
	}
	if p.link != nil {
		p.link.Close()
	}
	if p.slurmd != nil {
		p.slurmd.Close()
	}
	for _, l := range p.cgroups {
		l.Close()
	}
}

// replacements are the pinned maps New reuses: those the spec can use as
// they are.
func (p *pinned) replacements(spec *ebpf.CollectionSpec, mode Mode, log *slog.Logger) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	if p == nil {
		return out
	}
	for _, n := range mapNames(mode) {
		m, ok := p.maps[n]
		if !ok {
			continue
		}
		if err := spec.Maps[n].Compatible(m); err != nil {
			log.Info("pinned device filter map changed; replacing it", "map", n, "change", err)
			continue
		}
		out[n] = m
	}
	return out
}

func loadState(dir string) (*ebpf.Map, pinState, error) {
	var st pinState
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinStateName), nil)
	if err != nil {
		return nil, st, fmt.Errorf("open pinned device filter state: %w", err)
	}
	if err := stateSpec.Compatible(m); err != nil {
		return m, st, fmt.Errorf("pinned device filter state: %w", err)
	}
	if err := m.Lookup(uint32(0), &st); err != nil {
		return m, st, fmt.Errorf("read pinned device filter state: %w", err)
	}
	return m, st, nil
}

// removePins detaches the links among names and removes the pins.
func removePins(dir string, names []string) error {
	var errs []error
	for _, n := range names {
		p := filepath.Join(dir, n)
		if isLinkPin(n) {
			errs = append(errs, detachPinned(p))
		}
		if err := unlinkPin(p); err != nil {
			errs = append(errs, fmt.Errorf("remove device filter pin: %w", err))
		}
	}
	return errors.Join(errs...)
}

// detachPinned detaches the link pinned at p, whoever else holds it.
func detachPinned(p string) error {
	l, err := link.LoadPinnedLink(p, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned device filter link %s: %w", p, err)
	}
	defer l.Close()
	if err := l.Detach(); err != nil && !errors.Is(err, link.ErrNotSupported) {
		return fmt.Errorf("detach pinned device filter link %s: %w", p, err)
	}
	return nil
}

// unlinkPin removes the pin at p, if any. (os.Remove is no use on bpffs,
// whose rmdir of a missing name fails with EPERM and hides the ENOENT.)
func unlinkPin(p string) error {
	if err := unix.Unlink(p); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "unlink", Path: p, Err: err}
	}
	return nil
}

// pinOver pins obj at dir/name, replacing what is there without a moment
// where the name is missing.
func pinOver(dir, name string, pin func(string) error) error {
	tmp := filepath.Join(dir, name+pinTempSuffix)
	if err := unlinkPin(tmp); err != nil {
		return fmt.Errorf("pin device filter %s: %w", name, err)
	}
	if err := pin(tmp); err != nil {
		return fmt.Errorf("pin device filter %s: %w", name, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		unlinkPin(tmp)
		return fmt.Errorf("pin device filter %s: %w", name, err)
	}
	return nil
}

// pinMaps pins the maps New created (not the reused ones, which are pinned
// already), after copying into them what the pinned maps they replace hold
// when the entries keep their layout (hash maps whose size or flags
// changed), then the state map.
func (f *Filter) pinMaps(dir string, prev *pinned, reused map[string]*ebpf.Map, scopeID uint64) error {
	for _, n := range mapNames(f.mode) {
		if reused[n] != nil {
			continue
		}
		m := f.mapByName(n)
		// A config map of another layout is not carried over: New wrote
		// the new one whole.
		if prev != nil && prev.maps[n] != nil && n != "config" {
			if err := copyEntries(prev.maps[n], m, policyMaps[n]); err != nil {
				f.log.Warn("device filter map entries not carried over", "map", n, "err", err)
			}
		}
		if err := pinOver(dir, pinMapPrefix+n, m.Pin); err != nil {
			return err
		}
	}
	st := pinState{Version: pinVersion, Mode: pinModeCode(f.mode), ScopeID: scopeID}
	if prev != nil && prev.state != nil {
		return prev.state.Put(uint32(0), &st)
	}
	m, err := ebpf.NewMap(stateSpec)
	if err != nil {
		return fmt.Errorf("device filter state map: %w", err)
	}
	defer m.Close()
	if err := m.Put(uint32(0), &st); err != nil {
		return fmt.Errorf("device filter state map: %w", err)
	}
	return pinOver(dir, pinStateName, m.Pin)
}

func (f *Filter) mapByName(n string) *ebpf.Map {
	switch n {
	case "config":
		return f.config
	case "policies":
		return f.policies
	case "storage":
		return f.storage
	case "events":
		return f.events
	case "lost":
		return f.lost
	case "rate":
		return f.rate
	case "rate_full":
		return f.rateFull
	}
	return nil
}

// copyEntries copies the entries of a hash map into a new one whose keys
// have the same size and whose values have the same size or, with extend,
// are an older, shorter layout of the same struct (zero-extended).
func copyEntries(from, to *ebpf.Map, extend bool) error {
	if from.Type() != ebpf.Hash || to.Type() != ebpf.Hash {
		return nil
	}
	if from.KeySize() != to.KeySize() || from.ValueSize() > to.ValueSize() ||
		(from.ValueSize() != to.ValueSize() && !extend) {
		return fmt.Errorf("key or value size changed")
	}
	k, v := make([]byte, from.KeySize()), make([]byte, from.ValueSize())
	nv := make([]byte, to.ValueSize())
	it := from.Iterate()
	for it.Next(k, v) {
		copy(nv, v)
		if err := to.Put(k, nv); err != nil {
			return err
		}
	}
	return it.Err()
}

// adoptCgroupLinks takes over the per-cgroup links of prev. When the
// storage map is the pinned one, each link gets the new program by
// bpf_link update. Otherwise the old links carry storage of the old map,
// which the new program cannot use: each cgroup gets a new link (and so
// new storage), its policy copied over, and only then is the old link
// detached. Between the attach and the copy the new link's storage is zero
// (no GPU), and both programs must allow while both are attached: that can
// deny the job's own GPU for an instant, never allow a foreign one.
func (f *Filter) adoptCgroupLinks(prev *pinned, storageReused bool) error {
	ids := make([]uint64, 0, len(prev.cgroups))
	for id := range prev.cgroups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		old := prev.cgroups[id]
		name := cgroupPinName(id)
		if storageReused {
			err := old.Update(f.program)
			if errors.Is(err, unix.ENOLINK) {
				// The cgroup is gone; its link is defunct.
				f.log.Info("removing device filter pin of a removed cgroup", "cgroup_id", id)
				if err := removePins(prev.dir, []string{name}); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("update device filter program of cgroup %d: %w", id, err)
			}
			f.attached[id] = old
			delete(prev.cgroups, id)
			continue
		}
		if info, err := old.Info(); err == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == 0 {
			f.log.Info("removing device filter pin of a removed cgroup", "cgroup_id", id)
			if err := removePins(prev.dir, []string{name}); err != nil {
				return err
			}
			continue
		}
		fd, err := cgroup.OpenByID(id)
		if errors.Is(err, unix.ESTALE) || errors.Is(err, unix.ENOENT) {
			if err := removePins(prev.dir, []string{name}); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("re-attach device filter to cgroup %d: %w", id, err)
		}
		l, err := attachFD(fd, f.program)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("re-attach device filter to cgroup %d: %w", id, err)
		}
		var v devfilterPolicy
		if om := prev.maps["storage"]; om != nil {
			old, err := lookupPolicy(om, storageKey(id))
			switch {
			case err == nil:
				v = old
			case !errors.Is(err, ebpf.ErrKeyNotExist):
				f.log.Warn("device policy not carried over; cgroup denied every GPU", "cgroup_id", id, "err", err)
			}
		}
		if err := f.storage.Update(storageKey(id), &v, ebpf.UpdateExist); err != nil {
			l.Close()
			return fmt.Errorf("re-attach device filter to cgroup %d: %w", id, err)
		}
		if err := pinOver(prev.dir, name, l.Pin); err != nil {
			l.Close()
			return err
		}
		if err := old.Detach(); err != nil {
			f.log.Warn("old device filter link not detached", "cgroup_id", id, "err", err)
		}
		f.attached[id] = l
	}
	return nil
}

// Adopted says whether New took over the pins of a previous filter.
func (f *Filter) Adopted() bool { return f.adopted }

// Unpin detaches the filter everywhere it is attached, removes every pin
// under PinDir (and PinDir when that leaves it empty) and closes the
// filter. Without PinDir it is Close.
func (f *Filter) Unpin() error {
	var errs []error
	if f.pinDir != "" {
		names, err := pinNames(f.pinDir)
		errs = append(errs, err, removePins(f.pinDir, names))
		if err := unix.Rmdir(f.pinDir); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTEMPTY) {
			errs = append(errs, fmt.Errorf("remove device filter pin dir: %w", err))
		}
	}
	errs = append(errs, f.Close())
	f.log.Info("device filter unpinned", "dir", f.pinDir)
	return errors.Join(errs...)
}

// CleanStale drops what the filter pinned in pinDir for cgroups for which
// live is false: their policies and rate entries (ModeScope), their links
// and rate entries (ModePerCgroup, where the cgroup storage dies with the
// cgroup). It returns the ids of those cgroups, sorted. Call it before New
// adopts pinDir, or drop the removed cgroups from the Filter with Remove.
func CleanStale(pinDir string, live func(cgroupID uint64) bool) (removed []uint64, err error) {
	names, err := pinNames(pinDir)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	st, state, err := loadState(pinDir)
	if st != nil {
		st.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("clean stale device filter entries: %w", err)
	}
	gone := map[uint64]bool{}
	isGone := func(id uint64) bool {
		if g, ok := gone[id]; ok {
			return g
		}
		gone[id] = !live(id)
		return gone[id]
	}
	var errs []error
	if state.Mode == pinModeScope {
		errs = append(errs, deleteKeys(filepath.Join(pinDir, pinMapPrefix+"policies"), func(k []byte) bool {
			return isGone(binary.NativeEndian.Uint64(k))
		}))
	} else {
		for _, n := range names {
			id, err := strconv.ParseUint(strings.TrimPrefix(n, pinCgroupPref), 10, 64)
			if !strings.HasPrefix(n, pinCgroupPref) || err != nil {
				continue
			}
			defunct := false
			if l, err := link.LoadPinnedLink(filepath.Join(pinDir, n), nil); err == nil {
				if info, err := l.Info(); err == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == 0 {
					defunct = true
				}
				l.Close()
			}
			if defunct {
				gone[id] = true
			}
			if isGone(id) {
				errs = append(errs, removePins(pinDir, []string{n}))
			}
		}
	}
	// The rate key starts with the cgroup id.
	errs = append(errs, deleteKeys(filepath.Join(pinDir, pinMapPrefix+"rate"), func(k []byte) bool {
		return isGone(binary.NativeEndian.Uint64(k))
	}))
	for id, g := range gone {
		if g {
			removed = append(removed, id)
		}
	}
	slices.Sort(removed)
	return removed, errors.Join(errs...)
}

// deleteKeys deletes the keys of the pinned hash map at p that match.
func deleteKeys(p string, match func(key []byte) bool) error {
	m, err := ebpf.LoadPinnedMap(p, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("clean stale device filter entries: %w", err)
	}
	defer m.Close()
	if m.KeySize() < 8 {
		return fmt.Errorf("clean stale device filter entries of %s: key of %d bytes", p, m.KeySize())
	}
	var keys [][]byte
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(k, v) {
		if match(k) {
			keys = append(keys, slices.Clone(k))
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("clean stale device filter entries of %s: %w", p, err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clean stale device filter entries of %s: %w", p, err)
		}
	}
	return nil
}
