// SPDX-License-Identifier: Apache-2.0

package events

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpufence/gpufence/bpf/devfilter"
)

// resumeFile is Reported on disk: what the agent that stopped had
// reported of the pinned counters.
type resumeFile struct {
	Suppressed []resumeKey      `json:"suppressed"`
	Lost       uint64           `json:"lost"`
	RateFull   map[uint8]uint64 `json:"rate_full"`
}

type resumeKey struct {
	CgroupID uint64 `json:"cgroup_id"`
	Major    uint32 `json:"major"`
	Minor    uint32 `json:"minor"`
	Decision uint8  `json:"decision"`
	Reported uint64 `json:"reported"`
}

// SaveReported writes r to path (a temporary file renamed over it), for
// the next agent's Options.Resume.
func SaveReported(path string, r Reported) error {
	f := resumeFile{Lost: r.Lost, RateFull: map[uint8]uint64{}}
	for k, v := range r.Suppressed {
		f.Suppressed = append(f.Suppressed, resumeKey{k.CgroupID, k.Major, k.Minor, uint8(k.Decision), v})
	}
	for d, v := range r.RateFull {
		f.RateFull[uint8(d)] = v
	}
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".audit-counts-*")
	if err != nil {
		return err
	}
	if _, err = tmp.Write(b); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// LoadReported reads what SaveReported wrote; nil, nil when there is no
// file (first start, or the last agent did not stop cleanly).
func LoadReported(path string) (*Reported, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f resumeFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r := &Reported{Suppressed: map[devfilter.RateKey]uint64{}, Lost: f.Lost, RateFull: map[devfilter.Decision]uint64{}}
	for _, k := range f.Suppressed {
		r.Suppressed[devfilter.RateKey{CgroupID: k.CgroupID, Major: k.Major, Minor: k.Minor, Decision: devfilter.Decision(k.Decision)}] = k.Reported
	}
	for d, v := range f.RateFull {
		r.RateFull[devfilter.Decision(d)] = v
	}
	return r, nil
}
