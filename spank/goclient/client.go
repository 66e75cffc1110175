package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/gpufence/gpufence/proto/agentclient"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// errInvalid marks arguments the plugin should never have passed.
var errInvalid = errors.New("invalid argument")

// refusal is the agent's own error text, shown to the user as it is.
type refusal struct{ text string }

func (r *refusal) Error() string { return r.text }

// stepResult is what the C side keeps from a StepStart answer.
type stepResult struct {
	GPUs              []uint32 // ascending, no duplicates
	SlurmLocalIndices bool
}

func jobProlog(socket string, timeout time.Duration, jobID, uid uint32, jobGPUs *string) error {
	_, err := call(socket, timeout, &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{
		JobId: jobID, Uid: uid, JobGpus: jobGPUs,
	}}})
	return err
}

func jobEpilog(socket string, timeout time.Duration, jobID uint32) error {
	_, err := call(socket, timeout, &pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{
		JobId: jobID,
	}}})
	return err
}

func stepStart(socket string, timeout time.Duration, jobID, stepID, uid uint32, stepGPUs *string, pids []int32) (stepResult, error) {
	taskPIDs := make([]uint32, 0, len(pids))
	for _, p := range pids {
		if p <= 0 {
			return stepResult{}, fmt.Errorf("%w: task pid %d", errInvalid, p)
		}
		taskPIDs = append(taskPIDs, uint32(p))
	}
	resp, err := call(socket, timeout, &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{
		JobId: jobID, StepId: stepID, Uid: uid, StepGpus: stepGPUs, TaskPids: taskPIDs,
	}}})
	if err != nil {
		return stepResult{}, err
	}
	// Local numbering is the rank in the allowed list, so it must be sorted
	// whatever the agent sent.
	gpus := slices.Clone(resp.GetGpus())
	slices.Sort(gpus)
	return stepResult{GPUs: slices.Compact(gpus), SlurmLocalIndices: resp.GetSlurmLocalIndices()}, nil
}

func stepEnd(socket string, timeout time.Duration, jobID, stepID uint32) error {
	_, err := call(socket, timeout, &pb.Request{Msg: &pb.Request_StepEnd{StepEnd: &pb.StepEnd{
		JobId: jobID, StepId: stepID,
	}}})
	return err
}

// retryPause separates the two tries of one exchange: long enough for an
// agent that is restarting to be listening again, short against timeout.
const retryPause = 200 * time.Millisecond

// call sends req, and when the agent could not be reached or did not answer
// in time sends it once more after retryPause; a refusal is the agent's
// decision and is not asked twice. One call waits at most 2×timeout in all:
// the second try gets what is left of that. Sending a request twice is safe
// because the agent treats a repeated request as the same one (init and
// task_post_fork already both send StepStart).
func call(socket string, timeout time.Duration, req *pb.Request) (*pb.Response, error) {
	if socket == "" || timeout <= 0 {
		return nil, fmt.Errorf("%w: socket %q, timeout %v", errInvalid, socket, timeout)
	}
	req.Version = pb.ProtocolVersion_PROTOCOL_VERSION_1
	deadline := time.Now().Add(2 * timeout)
	resp, err := try(socket, timeout, req)
	var u *unreachable
	if !errors.As(err, &u) {
		return resp, err
	}
	time.Sleep(retryPause)
	left := min(timeout, time.Until(deadline))
	if left <= 0 {
		return nil, err
	}
	resp, err2 := try(socket, left, req)
	if errors.As(err2, &u) {
		// Keep the configured timeout in the text: the first try waited
		// all of it.
		u.timeout = timeout
	}
	return resp, err2
}

// try is one exchange with the agent.
func try(socket string, timeout time.Duration, req *pb.Request) (*pb.Response, error) {
	resp, err := agentclient.Call(socket, req, timeout)
	if errors.Is(err, agentclient.ErrAgent) && resp != nil {
		return nil, &refusal{text: resp.GetError()}
	}
	if errors.Is(err, agentclient.ErrNotAgent) {
		// An impostor on the socket is not an outage: the step is refused,
		// whatever failure= says.
		return nil, &refusal{text: err.Error()}
	}
	if err != nil {
		return nil, &unreachable{timeout: timeout, err: err}
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
	var sysErr *os.SyscallError
	var netErr net.Error
	switch {
	case errors.Is(u.err, os.ErrDeadlineExceeded), errors.Is(u.err, context.DeadlineExceeded),
		errors.As(u.err, &netErr) && netErr.Timeout():
		return fmt.Sprintf("no answer within %v", u.timeout)
	case errors.Is(u.err, io.EOF), errors.Is(u.err, io.ErrUnexpectedEOF):
		return "the agent closed the connection without answering"
	case errors.As(u.err, &sysErr):
		return fmt.Sprintf("%s: %v", sysErr.Syscall, sysErr.Err)
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
		return 0, fmt.Errorf("%w: agent allowed %d GPUs, room for %d", errInvalid, len(gpus), len(dst))
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
