// SPDX-License-Identifier: Apache-2.0

package events

import (
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/audit/audittest"
	"github.com/gpufence/gpufence/agent/registry"
	"github.com/gpufence/gpufence/bpf/devfilter"
	"golang.org/x/sys/unix"
)

// TestAccessTimeFromKernelClock: an event stamped with CLOCK_MONOTONIC
// (what bpf_ktime_get_ns returns) 250 ms ago gets that wall-clock time as
// access_time, while the record's time is when it was handled.
func TestAccessTimeFromKernelClock(t *testing.T) {
	e := newStage(&audittest.Recorder{})
	defer e.Close()
	var m unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &m); err != nil {
		t.Fatal(err)
	}
	want := time.Now().Add(-250 * time.Millisecond)
	ev := devfilter.Event{Time: time.Duration(m.Nano()) - 250*time.Millisecond, Major: 195, Minor: 1, Decision: devfilter.DecisionDenied}
	r := e.accessRecord(ev, registry.Owner{}, false, 0)
	if d := r.AccessTime.Sub(want); d < -20*time.Millisecond || d > 20*time.Millisecond {
		t.Fatalf("access_time %s, want about %s (off by %s)", r.AccessTime, want, d)
	}
	ev.Time = 0
	if r := e.accessRecord(ev, registry.Owner{}, false, 0); !r.AccessTime.IsZero() {
		t.Errorf("an event without kernel time got access_time %s", r.AccessTime)
	}
}

// TestMonoClockFollowsRefresh: the offset is measured again once refresh
// has passed, not per event.
func TestMonoClockFollowsRefresh(t *testing.T) {
	c := &monoClock{refresh: time.Hour}
	c.wall(1)
	c.offset += int64(time.Hour) // a stale offset stays within refresh
	if got := c.wall(0); got.Sub(time.Unix(0, c.offset)) != 0 {
		t.Fatalf("re-measured before refresh: %s", got)
	}
	c.refresh = 0
	var m unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &m)
	if d := time.Since(c.wall(time.Duration(m.Nano()))); d < -50*time.Millisecond || d > 50*time.Millisecond {
		t.Fatalf("after refresh, wall(now) is %s from now", d)
	}
}
