// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// errInvalid marks arguments the plugin should never have passed.
var errInvalid = errors.New("invalid argument")

type invalidArg struct{ what string }

func (e *invalidArg) Error() string { return errInvalid.Error() + ": " + e.what }
func (e *invalidArg) Unwrap() error { return errInvalid }

func invalid(what string) error { return &invalidArg{what} }

// refusal is the agent's own error text, shown to the user as it is (or a
// listener that is not the agent: never trusted, never a reason for
// failure=open).
type refusal struct{ text string }

func (r *refusal) Error() string { return r.text }

// stepResult is what the C side keeps from a StepStart answer.
type stepResult struct {
	GPUs              []uint32 // ascending, no duplicates
	SlurmLocalIndices bool
	// StepCgroup is the step's cgroup as /proc/<pid>/cgroup names it; the
	// plugin checks each task is inside it before the task may exec.
	StepCgroup string
	// IMEXPending: the plugin must ask for the step's IMEX channel
	// (stepChannel) before any task may exec.
	IMEXPending bool
}

func jobProlog(socket string, timeout time.Duration, jobID, uid uint32, jobGPUs *string) error {
	_, err := call(socket, timeout, jobPrologMsg(jobID, uid, jobGPUs))
	return err
}

func jobEpilog(socket string, timeout time.Duration, jobID uint32) error {
	_, err := call(socket, timeout, jobEpilogMsg(jobID))
	return err
}

func stepStart(socket string, timeout time.Duration, jobID, stepID, uid uint32, stepGPUs *string, pids []int32) (stepResult, error) {
	taskPIDs := make([]uint32, 0, len(pids))
	for _, p := range pids {
		if p <= 0 {
			return stepResult{}, invalid("task pid " + strconv.Itoa(int(p)))
		}
		taskPIDs = append(taskPIDs, uint32(p))
	}
	resp, err := call(socket, timeout, stepStartMsg(jobID, stepID, uid, stepGPUs, taskPIDs))
	if err != nil {
		return stepResult{}, err
	}
	// Local numbering is the rank in the allowed list, so it must be sorted
	// whatever the agent sent.
	gpus := slices.Clone(resp.gpus)
	slices.Sort(gpus)
	return stepResult{GPUs: slices.Compact(gpus), SlurmLocalIndices: resp.slurmLocal, StepCgroup: resp.stepCgroup, IMEXPending: resp.imexPending}, nil
}

// stepChannel asks the agent to learn the step's IMEX channel from the
// caller's own mount namespace; nil: the step has none.
func stepChannel(socket string, timeout time.Duration, jobID, stepID uint32) (*uint32, error) {
	resp, err := call(socket, timeout, stepChannelMsg(jobID, stepID))
	if err != nil {
		return nil, err
	}
	return resp.imexChannel, nil
}

func stepEnd(socket string, timeout time.Duration, jobID, stepID uint32) error {
	_, err := call(socket, timeout, stepEndMsg(jobID, stepID))
	return err
}

// retryPause separates the two tries of one exchange: long enough for an
// agent that is restarting to be listening again, short against timeout.
const retryPause = 200 * time.Millisecond

// budget is what one call may take in all: one try of timeout, and a second
// with what is left. An agent that hangs (stopped, wedged, crash-looping
// behind systemd's socket) costs a step at most this, not a timeout per
// callback and try.
func budget(timeout time.Duration) time.Duration { return timeout + timeout/2 }

// call sends the framed request and, when the agent could not be reached
// or did not answer in time, sends it once more after retryPause, within
// budget(timeout) in all; a refusal is the agent's decision and is not
// asked twice. Sending a request twice is safe: the agent treats a
// repeated request as the same one.
func call(socket string, timeout time.Duration, frame []byte) (response, error) {
	if socket == "" || timeout <= 0 {
		return response{}, invalid("socket " + strconv.Quote(socket) + ", timeout " + timeout.String())
	}
	start := time.Now()
	end := start.Add(budget(timeout))
	resp, err := try(socket, start.Add(timeout), timeout, frame)
	var u *unreachable
	if !errors.As(err, &u) {
		return resp, err
	}
	if time.Until(end) <= retryPause {
		return response{}, err
	}
	time.Sleep(retryPause)
	resp, err2 := try(socket, end, timeout, frame)
	if errors.As(err2, &u) {
		// The text names the configured timeout the first try waited.
		u.timeout = timeout
	}
	return resp, err2
}

// try is one exchange with the agent.
func try(socket string, deadline time.Time, timeout time.Duration, frame []byte) (response, error) {
	resp, err := exchange(socket, deadline, frame)
	var r *refusal
	switch {
	case errors.As(err, &r):
		return response{}, err
	case err != nil:
		return response{}, &unreachable{timeout: timeout, err: err}
	case resp.err != "":
		return response{}, &refusal{text: resp.err}
	}
	return resp, nil
}

// unreachable is any failure to get an answer from the agent.
type unreachable struct {
	timeout time.Duration
	err     error
}

func (u *unreachable) Error() string { return u.err.Error() }
func (u *unreachable) Unwrap() error { return u.err }

// reason says in a few words why the agent gave no answer; the C side puts
// it after the socket path.
func (u *unreachable) reason() string {
	var se *sysErr
	switch {
	case errors.Is(u.err, errDeadline), errors.As(u.err, &se) && se.timeout():
		return "no answer within " + u.timeout.String()
	case errors.Is(u.err, errHungUp):
		return errHungUp.Error()
	}
	return u.err.Error()
}

// outcome is the one place where a Go error becomes a C return code and the
// text that goes with it.
func outcome(err error) (int, string) {
	var r *refusal
	var u *unreachable
	switch {
	case err == nil:
		return codeOK, ""
	case errors.As(err, &r):
		return codeRefused, r.text
	case errors.As(err, &u):
		return codeUnreachable, u.reason()
	}
	return codeInvalid, err.Error()
}

// putGPUs copies gpus into dst and returns how many it wrote.
func putGPUs(dst, gpus []uint32) (int, error) {
	if len(gpus) > len(dst) {
		return 0, invalid("agent allowed " + strconv.Itoa(len(gpus)) + " GPUs, room for " + strconv.Itoa(len(dst)))
	}
	return copy(dst, gpus), nil
}

// putText copies s into the C buffer dst as a NUL-terminated string, cut at
// a rune boundary when it does not fit.
func putText(dst []byte, s string) {
	if len(dst) == 0 {
		return
	}
	n := min(len(s), len(dst)-1)
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	copy(dst, s[:n])
	dst[n] = 0
}
