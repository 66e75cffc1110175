// SPDX-License-Identifier: Apache-2.0

package main

import (
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/spank/internal/fakeagent"
)

func TestRetryAfterHangUp(t *testing.T) {
	var n atomic.Int32
	a := fakeagent.Start(t, func(*pb.Request) *pb.Response {
		if n.Add(1) == 1 {
			return fakeagent.HangUp
		}
		return &pb.Response{Gpus: []uint32{2}}
	})
	res, err := stepStart(a.Socket, 5*time.Second, 7, 0, 2001, nil, []int32{99})
	if err != nil || len(res.GPUs) != 1 || res.GPUs[0] != 2 {
		t.Fatalf("stepStart = %+v, %v; want GPU 2 from the second try", res, err)
	}
	if got := len(a.Requests()); got != 2 {
		t.Errorf("agent saw %d requests, want 2 (hang-up, then the retry)", got)
	}
}

// An agent that is restarting: nothing listens at the first try.
func TestRetryReachesAgentThatAppears(t *testing.T) {
	sock := fakeagent.AbsentSocket(t)
	errc := make(chan error, 1)
	go func() { errc <- jobEpilog(sock, 5*time.Second, 7) }()
	time.Sleep(retryPause / 4)
	a := fakeagent.StartAt(t, sock, ok(&pb.Response{}))
	if err := <-errc; err != nil {
		t.Fatalf("jobEpilog: %v", err)
	}
	if got := len(a.Requests()); got != 1 {
		t.Errorf("agent saw %d requests, want 1", got)
	}
}

func TestRefusalIsNotRetried(t *testing.T) {
	a := fakeagent.Start(t, ok(&pb.Response{Error: "no"}))
	if code, _ := outcome(jobEpilog(a.Socket, 5*time.Second, 7)); code != codeRefused {
		t.Fatalf("code %d, want refused", code)
	}
	if got := len(a.Requests()); got != 1 {
		t.Errorf("agent saw %d requests for one refusal, want 1", got)
	}
}

// One call waits at most 1.5×timeout in all, with two tries: an agent that
// accepts and never answers (stopped, wedged) costs the step no more.
func TestRetryBudget(t *testing.T) {
	const timeout = time.Second
	silent := fakeagent.Start(t, func(*pb.Request) *pb.Response { return nil })
	start := time.Now()
	err := jobEpilog(silent.Socket, timeout, 7)
	elapsed := time.Since(start)
	if code, text := outcome(err); code != codeUnreachable || text != "no answer within 1s" {
		t.Errorf("outcome = %d %q, want unreachable, no answer within 1s", code, text)
	}
	if got := len(silent.Requests()); got != 2 {
		t.Errorf("agent saw %d requests, want 2", got)
	}
	if want := budget(timeout); elapsed < want-50*time.Millisecond || elapsed > want+150*time.Millisecond {
		t.Errorf("silent agent: took %v, want about %v", elapsed, want)
	}

	// Nothing listening fails at once twice: one pause, far below the budget.
	start = time.Now()
	err = jobEpilog(fakeagent.AbsentSocket(t), timeout, 7)
	elapsed = time.Since(start)
	if code, _ := outcome(err); code != codeUnreachable {
		t.Errorf("absent agent: code %d, want unreachable", code)
	}
	if elapsed < retryPause || elapsed > timeout {
		t.Errorf("absent agent: took %v, want a %v pause between two tries and under %v", elapsed, retryPause, timeout)
	}
}
