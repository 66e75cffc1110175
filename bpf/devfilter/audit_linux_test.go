// SPDX-License-Identifier: Apache-2.0

package devfilter

import (
	"bufio"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpufence/gpufence/agent/cgroup"
	"golang.org/x/sys/unix"
)

// stormEnv makes the test binary a child that opens one device node in a
// tight loop, "<path>:<count>", and prints "<errno> <times>" per errno seen.
const stormEnv = "GPUFENCE_DEVFILTER_TEST_CHILD_STORM"

var stormN = flag.Int("devfilter.storm", 200_000,
	"opens per storm in TestPrivilegedAuditStorm (the acceptance figure is 1000000)")

func childStorm(spec string) int {
	i := strings.LastIndexByte(spec, ':')
	n, err := strconv.Atoi(spec[i+1:])
	if i < 0 || err != nil {
		fmt.Fprintf(os.Stderr, "bad %s %q\n", stormEnv, spec)
		return 2
	}
	path := spec[:i]
	counts := map[unix.Errno]int{}
	for range n {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
			counts[0]++
			continue
		}
		var errno unix.Errno
		if !errors.As(err, &errno) {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		counts[errno]++
	}
	for errno, c := range counts {
		fmt.Println(int(errno), c)
	}
	return 0
}

// storm runs a child in the cgroup rel that opens node n times and returns
// how often each errno came back.
func (fx *fixture) storm(t *testing.T, rel, node string, n int) map[unix.Errno]int {
	t.Helper()
	fd, err := unix.Open(fx.path(rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d", stormEnv, filepath.Join(fx.devDir, node), n))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("storm child in %s: %v", rel, err)
	}
	got := map[unix.Errno]int{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var errno, c int
		if _, err := fmt.Sscan(sc.Text(), &errno, &c); err != nil {
			t.Fatalf("storm child output %q: %v", sc.Text(), err)
		}
		got[unix.Errno(errno)] = c
	}
	return got
}

func wantOnly(t *testing.T, what string, got map[unix.Errno]int, errno unix.Errno, n int) {
	t.Helper()
	if len(got) != 1 || got[errno] != n {
		t.Errorf("%s: errno counts %v, want %d times %d (%v)", what, got, n, int(errno), errno)
	}
}

// eventReader reads all events of a filter until drained.
type eventReader struct {
	f      *Filter
	events []Event
	done   chan error
}

func startReader(f *Filter) *eventReader {
	r := &eventReader{f: f, done: make(chan error, 1)}
	go func() {
		for {
			e, err := f.ReadEvent()
			if err != nil {
				r.done <- err
				return
			}
			r.events = append(r.events, e)
		}
	}()
	return r
}

// drain returns every event submitted so far and stops the reader.
func (r *eventReader) drain(t *testing.T) []Event {
	t.Helper()
	if err := r.f.Drain(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("reading events: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("event reader did not drain the ring buffer")
	}
	if n := r.f.reader.AvailableBytes(); n != 0 {
		t.Fatalf("%d bytes left in the ring buffer after draining", n)
	}
	return r.events
}

func keyOf(e Event) RateKey {
	return RateKey{CgroupID: e.CgroupID, Major: e.Major, Minor: e.Minor, Decision: e.Decision}
}

func countByKey(events []Event) map[RateKey]int {
	out := map[RateKey]int{}
	for _, e := range events {
		out[keyOf(e)]++
	}
	return out
}

// forEachMode runs fn on a fresh fixture in each mode the kernel supports.
func forEachMode(t *testing.T, fn func(t *testing.T, fx *fixture, mode Mode)) {
	for _, mode := range []Mode{ModeScope, ModePerCgroup} {
		t.Run(string(mode), func(t *testing.T) {
			fx := newFixture(t)
			requireMode(t, mode)
			fn(t, fx, mode)
		})
	}
}

func (fx *fixture) options(mode Mode, o Options) Options {
	o.Mode = mode
	if mode == ModeScope {
		o.ScopeDir = fx.scope
	}
	return o
}

func suppressed(t *testing.T, f *Filter) map[RateKey]uint64 {
	t.Helper()
	s, err := f.Suppressed()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPrivilegedAuditStorm checks the audit trail's books: every one of a
// storm of denied opens is an event, a suppressed count or a lost event.
func TestPrivilegedAuditStorm(t *testing.T) {
	n := *stormN
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		for _, tc := range []struct {
			name    string
			window  time.Duration
			burst   uint32
			reading bool
		}{
			{name: "default rate, reading", reading: true},
			{name: "1ms windows of 50, reading", window: time.Millisecond, burst: 50, reading: true},
			{name: "no rate limit, not reading", burst: math.MaxUint32},
			{name: "1ms windows of 50, not reading", window: time.Millisecond, burst: 50},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newFilter(t, fx.options(mode, Options{RateWindow: tc.window, RateBurst: tc.burst}))
				step := fx.cgroup(t, "job_1/step_0")
				if err := f.Set(step, Policy{GPUMinors: []uint32{0}}); err != nil {
					t.Fatal(err)
				}
				var r *eventReader
				if tc.reading {
					r = startReader(f)
				}
				start := time.Now()
				got := fx.storm(t, "job_1/step_0/user/task_0", "nvidia1", n)
				elapsed := time.Since(start)
				if !tc.reading {
					r = startReader(f)
				}
				events := r.drain(t)
				wantOnly(t, "storm of denied opens", got, unix.EPERM, n)

				key := RateKey{CgroupID: step.ID, Major: 195, Minor: 1, Decision: DecisionDenied}
				byKey := countByKey(events)
				if len(byKey) > 1 || (len(byKey) == 1 && byKey[key] == 0) {
					t.Errorf("events by key = %v, want only %+v", byKey, key)
				}
				supp := suppressed(t, f)[key]
				lostPerCPU, err := f.LostPerCPU()
				if err != nil {
					t.Fatal(err)
				}
				lost := sum(lostPerCPU)
				if total, err := f.Lost(); err != nil || total != lost {
					t.Errorf("Lost() = %d, %v; want the per-CPU sum %d", total, err, lost)
				}
				full, err := f.RateFull()
				if err != nil || len(full) != 0 {
					t.Errorf("RateFull() = %v, %v; want none (one key, the map has room)", full, err)
				}
				emitted := uint64(byKey[key])
				if emitted+supp+lost != uint64(n) {
					t.Errorf("events %d + suppressed %d + lost %d = %d, want the %d attempts", emitted, supp, lost, emitted+supp+lost, n)
				}
				// One thread opened: in time order, the totals events carry
				// never go down and never pass the final one.
				slices.SortFunc(events, func(a, b Event) int { return cmp.Compare(a.Time, b.Time) })
				var prev uint64
				for _, e := range events {
					if e.Suppressed < prev || e.Suppressed > supp {
						t.Errorf("event at %s carries suppressed %d after %d (final %d)", e.Time, e.Suppressed, prev, supp)
						break
					}
					prev = e.Suppressed
				}
				switch {
				case tc.burst == math.MaxUint32:
					if lost == 0 || supp != 0 {
						t.Errorf("without rate limit nor reader: lost %d, suppressed %d; want some lost, none suppressed", lost, supp)
					}
				case tc.window == 0:
					// 5 a second, and nothing lost with so few.
					maxEvents := 5 * (uint64(elapsed/time.Second) + 1)
					if emitted < 5 || emitted > maxEvents || lost != 0 {
						t.Errorf("default rate: %d events (want 5..%d), %d lost", emitted, maxEvents, lost)
					}
				default:
					if supp == 0 {
						t.Error("1ms windows of 50: nothing suppressed")
					}
				}
				t.Logf("%s: %d denied opens in %s (%.0f/s): %d events, %d suppressed, %d lost (per CPU %v)",
					mode, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), emitted, supp, lost, nonZero(lostPerCPU))
			})
		}
	})
}

// nonZero keeps the CPUs that counted something, by CPU number.
func nonZero(perCPU []uint64) map[int]uint64 {
	out := map[int]uint64{}
	for cpu, v := range perCPU {
		if v != 0 {
			out[cpu] = v
		}
	}
	return out
}

func TestPrivilegedAuditOnly(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		f := newFilter(t, fx.options(mode, Options{AuditOnly: true}))
		step := fx.cgroup(t, "job_1/step_0")
		if err := f.Set(step, Policy{GPUMinors: []uint32{0}}); err != nil {
			t.Fatal(err)
		}
		r := startReader(f)
		pid := fx.expectGPUs(t, "job_1/step_0/user/task_0", 0, 1, 2, 3)
		events := r.drain(t)
		var got []string
		for _, e := range events {
			if int(e.TGID) != pid || e.CgroupID != step.ID || e.Major != 195 {
				t.Errorf("event %+v not of child %d in cgroup %d", e, pid, step.ID)
			}
			got = append(got, fmt.Sprintf("%s %d", e.Decision, e.Minor))
		}
		slices.Sort(got)
		want := []string{"allowed 0", "would-deny 1", "would-deny 2", "would-deny 3"}
		if !slices.Equal(got, want) {
			t.Errorf("audit-only events = %q, want %q", got, want)
		}

		if err := f.SetAuditOnly(false); err != nil {
			t.Fatal(err)
		}
		r = startReader(f)
		pid = fx.expectGPUs(t, "job_1/step_0/user/task_0", 0)
		denied := 0
		for _, e := range r.drain(t) {
			if e.Decision == DecisionDenied && int(e.TGID) == pid {
				denied++
			}
		}
		if denied != 3 {
			t.Errorf("after SetAuditOnly(false): %d denied events, want 3", denied)
		}
		if err := f.SetAuditOnly(true); err != nil {
			t.Fatal(err)
		}
		fx.expectGPUs(t, "job_1/step_0/user/task_0", 0, 1, 2, 3)
	})
}

func TestPrivilegedAuditAllowed(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		for _, tc := range []struct {
			audit AuditAllowed
			// Per device, for 10 opens.
			wantEvents int
			wantSupp   uint64
			wantKey    bool
		}{
			{audit: AuditAllowedNone},
			{audit: AuditAllowedFirst, wantEvents: 1, wantSupp: 9, wantKey: true},
			// The burst in a window of an hour.
			{audit: AuditAllowedAll, wantEvents: 3, wantSupp: 7, wantKey: true},
		} {
			t.Run(string(tc.audit), func(t *testing.T) {
				f := newFilter(t, fx.options(mode, Options{AuditAllowed: tc.audit, RateWindow: time.Hour, RateBurst: 3}))
				step := fx.cgroup(t, "job_1/step_0")
				if err := f.Set(step, Policy{GPUMinors: []uint32{0, 1}}); err != nil {
					t.Fatal(err)
				}
				r := startReader(f)
				for _, node := range []string{"nvidia0", "nvidia1"} {
					wantOnly(t, "opens of "+node, fx.storm(t, "job_1/step_0/user/task_0", node, 10), unix.ENXIO, 10)
				}
				events := r.drain(t)
				byKey := countByKey(events)
				supp := suppressed(t, f)
				for minor := range uint32(2) {
					key := RateKey{CgroupID: step.ID, Major: 195, Minor: minor, Decision: DecisionAllowed}
					s, ok := supp[key]
					if byKey[key] != tc.wantEvents || s != tc.wantSupp || ok != tc.wantKey {
						t.Errorf("minor %d: %d events, suppressed %d (entry %v); want %d, %d (%v)",
							minor, byKey[key], s, ok, tc.wantEvents, tc.wantSupp, tc.wantKey)
					}
				}
				if len(byKey) > 2 || len(supp) > 2 {
					t.Errorf("events by key %v, suppressed %v: want only allowed opens of minors 0 and 1", byKey, supp)
				}
				for _, e := range events {
					if e.Suppressed != 0 {
						t.Errorf("event %+v carries suppressed %d, want 0 within the first burst", e, e.Suppressed)
					}
				}
				if tc.audit != AuditAllowedFirst {
					return
				}
				// Later opens stay counted, never reported again.
				r = startReader(f)
				fx.storm(t, "job_1/step_0/user/task_0", "nvidia0", 5)
				if events := r.drain(t); len(events) != 0 {
					t.Errorf("first: %d more events after the first, want 0", len(events))
				}
				key := RateKey{CgroupID: step.ID, Major: 195, Minor: 0, Decision: DecisionAllowed}
				if s := suppressed(t, f)[key]; s != 14 {
					t.Errorf("first: suppressed %d after 15 opens, want 14", s)
				}
			})
		}
	})
}

func TestPrivilegedForgetRate(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		f := newFilter(t, fx.options(mode, Options{RateBurst: 2, RateWindow: time.Hour}))
		step1, step2 := fx.cgroup(t, "job_1/step_0"), fx.cgroup(t, "job_2/step_0")
		for _, cg := range []cgroup.Cgroup{step1, step2} {
			if err := f.Set(cg, Policy{}); err != nil {
				t.Fatal(err)
			}
		}
		wantOnly(t, "job 1", fx.storm(t, "job_1/step_0/user/task_0", "nvidia1", 5), unix.EPERM, 5)
		wantOnly(t, "job 1", fx.storm(t, "job_1/step_0/user/task_0", "nvidia2", 5), unix.EPERM, 5)
		wantOnly(t, "job 2", fx.storm(t, "job_2/step_0/user/task_0", "nvidia1", 4), unix.EPERM, 4)
		k11 := RateKey{CgroupID: step1.ID, Major: 195, Minor: 1, Decision: DecisionDenied}
		k12 := RateKey{CgroupID: step1.ID, Major: 195, Minor: 2, Decision: DecisionDenied}
		k21 := RateKey{CgroupID: step2.ID, Major: 195, Minor: 1, Decision: DecisionDenied}
		want := map[RateKey]uint64{k11: 3, k12: 3, k21: 2}
		if got := suppressed(t, f); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("Suppressed() = %v, want %v", got, want)
		}
		if err := f.ForgetRate(step1.ID); err != nil {
			t.Fatal(err)
		}
		if got := suppressed(t, f); fmt.Sprint(got) != fmt.Sprint(map[RateKey]uint64{k21: 2}) {
			t.Fatalf("Suppressed() after ForgetRate(%d) = %v, want only %v", step1.ID, got, k21)
		}
		if err := f.ForgetRate(step1.ID); err != nil {
			t.Errorf("ForgetRate of a cgroup without entries: %v", err)
		}
		// A forgotten key starts again from zero.
		fx.storm(t, "job_1/step_0/user/task_0", "nvidia1", 3)
		if s := suppressed(t, f)[k11]; s != 1 {
			t.Errorf("suppressed %d after ForgetRate and 3 opens, want 1", s)
		}

		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Suppressed(); !errors.Is(err, ErrClosed) {
			t.Errorf("Suppressed after Close: %v, want ErrClosed", err)
		}
		if err := f.ForgetRate(step2.ID); !errors.Is(err, ErrClosed) {
			t.Errorf("ForgetRate after Close: %v, want ErrClosed", err)
		}
		if err := f.SetAuditOnly(true); !errors.Is(err, ErrClosed) {
			t.Errorf("SetAuditOnly after Close: %v, want ErrClosed", err)
		}
	})
}

// TestPrivilegedDrain: events the kernel reported while nobody read are
// all returned by ReadEvent after Drain, then ErrClosed; none is left in
// the ring buffer for a next agent that may never come.
func TestPrivilegedDrain(t *testing.T) {
	forEachMode(t, func(t *testing.T, fx *fixture, mode Mode) {
		f := newFilter(t, fx.options(mode, Options{RateBurst: math.MaxUint32}))
		step := fx.cgroup(t, "job_1/step_0")
		if err := f.Set(step, Policy{}); err != nil {
			t.Fatal(err)
		}
		wantOnly(t, "job 1", fx.storm(t, "job_1/step_0/user/task_0", "nvidia1", 17), unix.EPERM, 17)
		if err := f.Drain(); err != nil {
			t.Fatal(err)
		}
		var got int
		for {
			e, err := f.ReadEvent()
			if errors.Is(err, ErrClosed) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.CgroupID == step.ID && e.Minor == 1 && e.Decision == DecisionDenied {
				got++
			}
		}
		if got != 17 {
			t.Errorf("ReadEvent after Drain returned %d denied opens of nvidia1, want 17", got)
		}
		if n := f.reader.AvailableBytes(); n != 0 {
			t.Errorf("%d bytes left in the ring buffer after Drain", n)
		}
	})
}
