package audit

import (
	"fmt"
	"time"
)

// maxLimitKeys bounds the limiter's memory; past it, new keys are not limited.
const maxLimitKeys = 65536

type limitKey struct {
	job          uint32
	step         string
	cgroup       uint64
	major, minor uint32
	decision     string
}

type limitState struct {
	start      time.Time
	count      int
	suppressed uint64
	last       Record // the latest suppressed record, for the summary
}

// limiter passes RateBurst gpu_access records per key and interval and
// counts the rest. Only the dispatcher goroutine uses it.
type limiter struct {
	burst    int
	interval time.Duration
	keys     map[limitKey]*limitState
}

func newLimiter(burst int, interval time.Duration) *limiter {
	return &limiter{burst: burst, interval: interval, keys: map[limitKey]*limitState{}}
}

func keyOf(r *Record) limitKey {
	k := limitKey{job: r.JobID, step: r.StepID, cgroup: r.CgroupID, decision: r.Decision}
	if r.Device != nil {
		k.major, k.minor = r.Device.Major, r.Device.Minor
	}
	return k
}

// allow reports whether r is written; when it is, r.Suppressed is set to
// the identical records not written since the previous record of its key.
func (l *limiter) allow(r *Record) bool {
	if l.burst < 0 {
		return true
	}
	k := keyOf(r)
	st := l.keys[k]
	now := r.Time
	if st == nil {
		if len(l.keys) >= maxLimitKeys {
			return true
		}
		st = &limitState{start: now}
		l.keys[k] = st
	}
	if now.Sub(st.start) >= l.interval {
		st.start, st.count = now, 0
	}
	if st.count >= l.burst {
		st.suppressed++
		st.last = *r
		return false
	}
	st.count++
	r.Suppressed = st.suppressed
	st.suppressed = 0
	return true
}

// flush returns an access_suppressed summary for each key whose interval
// ended (every key when all) with records not yet reported, and forgets
// idle keys.
func (l *limiter) flush(now time.Time, all bool) []Record {
	var out []Record
	for k, st := range l.keys {
		if !all && now.Sub(st.start) < l.interval {
			continue
		}
		if st.suppressed > 0 {
			s := st.last
			s.Event = EventAccessSuppressed
			s.Time = now
			s.Seq = 0
			s.Suppressed = st.suppressed
			s.Message = fmt.Sprintf("%d more %s accesses like this one were not recorded (rate limit %d per %s)",
				st.suppressed, s.Decision, l.burst, l.interval)
			out = append(out, s)
		}
		delete(l.keys, k)
	}
	return out
}
