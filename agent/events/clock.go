// SPDX-License-Identifier: Apache-2.0

package events

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// monoClock turns the kernel's time of an access, CLOCK_MONOTONIC
// (bpf_ktime_get_ns, which stops during suspend), into wall-clock time: it
// adds the offset CLOCK_REALTIME - CLOCK_MONOTONIC, measured again at most
// refresh after the last measurement, so that a step of the wall clock
// (NTP, an admin) is followed within that time.
type monoClock struct {
	refresh time.Duration
	mu      sync.Mutex
	offset  int64 // ns, REALTIME - MONOTONIC
	at      time.Time
}

func newMonoClock() *monoClock { return &monoClock{refresh: time.Second} }

func (c *monoClock) wall(mono time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() || time.Since(c.at) >= c.refresh {
		if off, ok := measureOffset(); ok {
			c.offset, c.at = off, time.Now()
		}
	}
	if c.at.IsZero() {
		return time.Time{}
	}
	return time.Unix(0, int64(mono)+c.offset)
}

// measureOffset reads REALTIME, MONOTONIC, REALTIME and keeps the tightest
// of three tries: the offset is then off by at most half that gap.
func measureOffset() (int64, bool) {
	best, gap := int64(0), int64(-1)
	for i := 0; i < 3; i++ {
		var r1, m, r2 unix.Timespec
		if unix.ClockGettime(unix.CLOCK_REALTIME, &r1) != nil || unix.ClockGettime(unix.CLOCK_MONOTONIC, &m) != nil ||
			unix.ClockGettime(unix.CLOCK_REALTIME, &r2) != nil {
			return 0, false
		}
		g := r2.Nano() - r1.Nano()
		if gap < 0 || g < gap {
			best, gap = r1.Nano()+g/2-m.Nano(), g
		}
	}
	return best, true
}
