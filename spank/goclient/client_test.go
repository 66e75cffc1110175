// SPDX-License-Identifier: Apache-2.0

package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/spank/internal/fakeagent"
)

func ptr(s string) *string { return &s }

func ok(resp *pb.Response) fakeagent.Answer {
	return func(*pb.Request) *pb.Response { return resp }
}

func TestRequests(t *testing.T) {
	a := fakeagent.Start(t, ok(&pb.Response{}))
	const timeout = 5 * time.Second
	tests := []struct {
		name string
		call func() error
		want *pb.Request
	}{{
		name: "prolog with GPUs",
		call: func() error { return jobProlog(a.Socket, timeout, 7, 2001, ptr("0,2")) },
		want: &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 7, Uid: 2001, JobGpus: ptr("0,2")}}},
	}, {
		name: "prolog of a CPU-only job sends no list",
		call: func() error { return jobProlog(a.Socket, timeout, 8, 2001, nil) },
		want: &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 8, Uid: 2001}}},
	}, {
		name: "prolog with an empty list keeps it",
		call: func() error { return jobProlog(a.Socket, timeout, 9, 0, ptr("")) },
		want: &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 9, JobGpus: ptr("")}}},
	}, {
		name: "step start from init",
		call: func() error {
			_, err := stepStart(a.Socket, timeout, 7, 0xfffffffb, 2001, nil, nil)
			return err
		},
		want: &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 7, StepId: 0xfffffffb, Uid: 2001}}},
	}, {
		name: "step start from post_fork",
		call: func() error {
			_, err := stepStart(a.Socket, timeout, 7, 3, 2001, ptr("1"), []int32{4242})
			return err
		},
		want: &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 7, StepId: 3, Uid: 2001,
			StepGpus: ptr("1"), TaskPids: []uint32{4242}}}},
	}, {
		name: "step channel from post_fork",
		call: func() error {
			_, err := stepChannel(a.Socket, timeout, 7, 3)
			return err
		},
		want: &pb.Request{Msg: &pb.Request_StepChannel{StepChannel: &pb.StepChannel{JobId: 7, StepId: 3}}},
	}, {
		name: "step end",
		call: func() error { return stepEnd(a.Socket, timeout, 7, 3) },
		want: &pb.Request{Msg: &pb.Request_StepEnd{StepEnd: &pb.StepEnd{JobId: 7, StepId: 3}}},
	}, {
		name: "epilog",
		call: func() error { return jobEpilog(a.Socket, timeout, 7) },
		want: &pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 7}}},
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); err != nil {
				t.Fatalf("call: %v", err)
			}
			reqs := a.Requests()
			if len(reqs) != i+1 {
				t.Fatalf("agent got %d requests, want %d", len(reqs), i+1)
			}
			tt.want.Version = pb.ProtocolVersion_PROTOCOL_VERSION_1
			if got := reqs[i]; !proto.Equal(got, tt.want) {
				t.Errorf("agent got\n%v\nwant\n%v", got, tt.want)
			}
		})
	}
}

func TestStepStartResult(t *testing.T) {
	a := fakeagent.Start(t, ok(&pb.Response{Gpus: []uint32{3, 1, 3}, SlurmLocalIndices: true}))
	res, err := stepStart(a.Socket, 5*time.Second, 1, 0, 2001, ptr("1,3"), []int32{10})
	if code, text := outcome(err); code != codeOK || text != "" {
		t.Fatalf("outcome = %d %q, want OK", code, text)
	}
	if want := []uint32{1, 3}; !slices.Equal(res.GPUs, want) || !res.SlurmLocalIndices {
		t.Errorf("result = %+v, want GPUs %v (sorted, unique) and SlurmLocalIndices", res, want)
	}
	out := make([]uint32, 4)
	if n, err := putGPUs(out, res.GPUs); n != 2 || err != nil || !slices.Equal(out[:n], []uint32{1, 3}) {
		t.Errorf("putGPUs = %d %v %v", n, err, out)
	}
	if _, err := putGPUs(make([]uint32, 1), res.GPUs); err == nil {
		t.Error("putGPUs into a too small array: no error")
	} else if code, _ := outcome(err); code != codeInvalid {
		t.Errorf("putGPUs overflow: code %d, want %d", code, codeInvalid)
	}
}

func TestStepStartRejectsBadPID(t *testing.T) {
	a := fakeagent.Start(t, ok(&pb.Response{}))
	_, err := stepStart(a.Socket, time.Second, 1, 0, 2001, nil, []int32{-1})
	if code, _ := outcome(err); code != codeInvalid {
		t.Errorf("pid -1: code %d, want %d (err %v)", code, codeInvalid, err)
	}
	if n := len(a.Requests()); n != 0 {
		t.Errorf("agent got %d requests for an invalid call", n)
	}
}

func TestFailures(t *testing.T) {
	refusing := fakeagent.Start(t, ok(&pb.Response{Error: "job 7 has no prolog record on this node"}))
	silent := fakeagent.Start(t, func(*pb.Request) *pb.Response { return nil })
	tests := []struct {
		name     string
		socket   string
		timeout  time.Duration
		wantCode int
		wantText string
	}{
		{"refusal", refusing.Socket, 5 * time.Second, codeRefused, "job 7 has no prolog record on this node"},
		{"never answers", silent.Socket, 300 * time.Millisecond, codeUnreachable, "no answer within 300ms"},
		{"absent", fakeagent.AbsentSocket(t), 5 * time.Second, codeUnreachable, "connect: no such file or directory"},
		{"no socket configured", "", time.Second, codeInvalid, "invalid argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, err := stepStart(tt.socket, tt.timeout, 7, 0, 2001, nil, []int32{99})
			elapsed := time.Since(start)
			code, text := outcome(err)
			if code != tt.wantCode || !strings.HasPrefix(text, tt.wantText) {
				t.Errorf("outcome = %d %q, want %d %q (err %v)", code, text, tt.wantCode, tt.wantText, err)
			}
			if elapsed > tt.timeout+time.Second {
				t.Errorf("took %v, limit %v", elapsed, tt.timeout)
			}
			// The prolog and the other calls share the same conversion.
			if code2, text2 := outcome(jobProlog(tt.socket, tt.timeout, 7, 2001, nil)); code2 != code || text2 != text {
				t.Errorf("jobProlog outcome = %d %q, stepStart gave %d %q", code2, text2, code, text)
			}
		})
	}
}

func TestPutText(t *testing.T) {
	tests := []struct {
		in   string
		size int
		want string
	}{
		{"hello", 16, "hello"},
		{"hello", 4, "hel"},
		{"héllo", 3, "h"}, // never half a rune
		{"x", 1, ""},
	}
	for _, tt := range tests {
		buf := make([]byte, tt.size)
		for i := range buf {
			buf[i] = 'Z'
		}
		putText(buf, tt.in)
		n := strings.IndexByte(string(buf), 0)
		if n < 0 || string(buf[:n]) != tt.want {
			t.Errorf("putText(%q) into %d bytes = %q, want %q NUL-terminated", tt.in, tt.size, buf, tt.want)
		}
	}
	putText(nil, "nothing") // no room, no write, no panic
}

func TestStepChannelResult(t *testing.T) {
	ch := uint32(5)
	a := fakeagent.Start(t, ok(&pb.Response{ImexChannel: &ch}))
	got, err := stepChannel(a.Socket, 5*time.Second, 1, 0)
	if err != nil || got == nil || *got != 5 {
		t.Fatalf("stepChannel = %v, %v; want channel 5", got, err)
	}
	b := fakeagent.Start(t, ok(&pb.Response{}))
	if got, err := stepChannel(b.Socket, 5*time.Second, 1, 0); err != nil || got != nil {
		t.Fatalf("stepChannel without a channel = %v, %v; want none", got, err)
	}
	c := fakeagent.Start(t, ok(&pb.Response{ImexPending: true}))
	if res, err := stepStart(c.Socket, 5*time.Second, 1, 0, 2001, nil, nil); err != nil || !res.IMEXPending {
		t.Fatalf("stepStart = %+v, %v; want IMEXPending", res, err)
	}
}
