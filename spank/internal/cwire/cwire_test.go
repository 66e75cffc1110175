// SPDX-License-Identifier: Apache-2.0

package cwire

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
	"github.com/gpufence/gpufence/spank/internal/fakeagent"
)

func ptr(s string) *string { return &s }

func ok(resp *pb.Response) fakeagent.Answer {
	return func(*pb.Request) *pb.Response { return resp }
}

// The C encoding against the generated types: what C writes, the
// generated decoder reads as the request meant, to the last byte.
func TestFramesMatchGenerated(t *testing.T) {
	s, empty := "0,2", ""
	long := strings.Repeat("1,", 3000) + "1"
	tests := []struct {
		name  string
		frame func() ([]byte, bool)
		want  *pb.Request
	}{
		{"prolog with GPUs", func() ([]byte, bool) { return JobPrologFrame(MaxFrame, 7, 2001, &s) },
			&pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 7, Uid: 2001, JobGpus: &s}}}},
		{"prolog with an empty list keeps it", func() ([]byte, bool) { return JobPrologFrame(MaxFrame, 8, 0, &empty) },
			&pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 8, JobGpus: &empty}}}},
		{"prolog of a CPU-only job sends no list", func() ([]byte, bool) { return JobPrologFrame(MaxFrame, 9, 1, nil) },
			&pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 9, Uid: 1}}}},
		{"prolog with a list over 128 bytes (two-byte lengths)", func() ([]byte, bool) { return JobPrologFrame(MaxFrame, 10, 1, &long) },
			&pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 10, Uid: 1, JobGpus: &long}}}},
		{"step start from init", func() ([]byte, bool) { return StepStartFrame(MaxFrame, 7, 0xfffffffb, 2001, nil, nil) },
			&pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 7, StepId: 0xfffffffb, Uid: 2001}}}},
		{"step start with task pids", func() ([]byte, bool) { return StepStartFrame(MaxFrame, 7, 3, 2001, &s, []uint32{4242, 1}) },
			&pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 7, StepId: 3, Uid: 2001, StepGpus: &s, TaskPids: []uint32{4242, 1}}}}},
		{"step channel", func() ([]byte, bool) { return StepChannelFrame(MaxFrame, 7, 3) },
			&pb.Request{Msg: &pb.Request_StepChannel{StepChannel: &pb.StepChannel{JobId: 7, StepId: 3}}}},
		{"epilog of the highest job id", func() ([]byte, bool) { return JobEpilogFrame(64, 4294967295) },
			&pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 4294967295}}}},
		{"task bind", func() ([]byte, bool) { return TaskBindFrame(MaxFrame, 7, 3, 1, ptr("1")) },
			&pb.Request{Msg: &pb.Request_TaskBind{TaskBind: &pb.TaskBind{JobId: 7, StepId: 3, TaskId: 1, VisibleDevices: ptr("1")}}}},
		{"task bind, task 0 and an empty list", func() ([]byte, bool) { return TaskBindFrame(MaxFrame, 7, 3, 0, &empty) },
			&pb.Request{Msg: &pb.Request_TaskBind{TaskBind: &pb.TaskBind{JobId: 7, StepId: 3, VisibleDevices: &empty}}}},
		{"task bind without CUDA_VISIBLE_DEVICES", func() ([]byte, bool) { return TaskBindFrame(MaxFrame, 7, 0, 4294967295, nil) },
			&pb.Request{Msg: &pb.Request_TaskBind{TaskBind: &pb.TaskBind{JobId: 7, TaskId: 4294967295}}}},
		{"step 0 leaves the zero out", func() ([]byte, bool) { return StepChannelFrame(64, 7, 0) },
			&pb.Request{Msg: &pb.Request_StepChannel{StepChannel: &pb.StepChannel{JobId: 7}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, ok := tt.frame()
			if !ok {
				t.Fatal("encoder said it does not fit")
			}
			var got pb.Request
			r := bytes.NewReader(b)
			if err := protodelim.UnmarshalFrom(r, &got); err != nil || r.Len() != 0 {
				t.Fatalf("%x: %v (%d bytes left)", b, err, r.Len())
			}
			tt.want.Version = pb.ProtocolVersion_PROTOCOL_VERSION_1
			if !proto.Equal(&got, tt.want) {
				t.Errorf("decoded %v, want %v", &got, tt.want)
			}
			// And byte for byte what the generated encoder writes.
			msg, err := proto.MarshalOptions{Deterministic: true}.Marshal(tt.want)
			if err != nil {
				t.Fatal(err)
			}
			if want := protowire.AppendBytes(nil, msg); !bytes.Equal(b, want) {
				t.Errorf("C wrote %d bytes %.64x…, generated %d bytes %.64x…", len(b), b, len(want), want)
			}
		})
	}
}

// An encoder never writes past its buffer: one byte short is refused.
func TestFramesDoNotOverflow(t *testing.T) {
	s := "0,1,2,3"
	full, ok := StepStartFrame(MaxFrame, 7, 3, 2001, &s, []uint32{4242})
	if !ok {
		t.Fatal("step start frame did not fit in a whole frame")
	}
	if _, ok := StepStartFrame(len(full)-1, 7, 3, 2001, &s, []uint32{4242}); ok {
		t.Errorf("a %d-byte frame fit in %d bytes", len(full), len(full)-1)
	}
	if got, ok := StepStartFrame(len(full), 7, 3, 2001, &s, []uint32{4242}); !ok || !bytes.Equal(got, full) {
		t.Errorf("exact room: %x %v, want %x", got, ok, full)
	}
	huge := strings.Repeat("1", MaxFrame)
	if _, ok := JobPrologFrame(2*MaxFrame, 7, 1, &huge); ok {
		t.Error("a list of 64 KiB: frame over the agent's limit accepted")
	}
}

func TestParseMatchesGenerated(t *testing.T) {
	zero, high := uint32(0), uint32(2047)
	for _, want := range []*pb.Response{
		{}, {Error: "no"}, {Gpus: []uint32{3, 1, 4294967295}, SlurmLocalIndices: true, StepCgroup: "/system.slice/x_slurmstepd.scope/job_7/step_0"},
		{ImexPending: true}, {ImexChannel: &zero}, {ImexChannel: &high}, {TaskBind: true, Gpus: []uint32{0, 1}},
		// gpufence verify's answer: a field the plugin never asks for, skipped.
		{Gpus: []uint32{2}, Verify: &pb.VerifyInfo{Mode: "scope", CgroupId: 9, Gpus: []*pb.VerifyGPU{{Index: 0, Files: []string{"/dev/nvidia0"}}}}},
	} {
		b, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := ParseResponse(b)
		if !ok || !same(got, want) {
			t.Errorf("ParseResponse(%v) = %+v, %v", want, got, ok)
		}
	}
	// Unpacked GPUs, and unknown fields of every wire type (a group too).
	b := []byte{0x10, 0x05, 0x10, 0x07, // gpus 5, 7 unpacked
		0x48, 0x01, // field 9 varint
		0x51, 1, 2, 3, 4, 5, 6, 7, 8, // field 10 fixed64
		0x5d, 1, 2, 3, 4, // field 11 fixed32
		0x63, 0x08, 0x01, 0x64, // field 12 group holding a varint
	}
	if got, ok := ParseResponse(b); !ok || !slices.Equal(got.GPUs, []uint32{5, 7}) {
		t.Errorf("unpacked and unknown fields: %+v, %v", got, ok)
	}
	for _, bad := range [][]byte{
		{0x0a, 0x05, 'a'},                    // string longer than the message
		{0x10},                               // varint cut short
		{0x10, 0x80, 0x80, 0x80, 0x80, 0x10}, // GPU index over 32 bits
		{0x00, 0x01},                         // field number 0
		{0x63, 0x08, 0x01},                   // group never ended
		{0x64},                               // end of a group never started
		{0x38, 0x80, 0x80, 0x80, 0x80, 0x10}, // IMEX channel over 32 bits
		{0x0f},                               // wire type 7
	} {
		if got, ok := ParseResponse(bad); ok {
			t.Errorf("ParseResponse(%x) accepted: %+v", bad, got)
		}
	}
}

func same(got Response, want *pb.Response) bool {
	return got.Error == want.Error && slices.Equal(got.GPUs, want.Gpus) && got.SlurmLocal == want.SlurmLocalIndices &&
		got.StepCgroup == want.StepCgroup && got.IMEXPending == want.ImexPending && got.TaskBind == want.TaskBind &&
		(got.Channel == nil) == (want.ImexChannel == nil) && (got.Channel == nil || *got.Channel == *want.ImexChannel)
}

// The requests as the agent's own decoder reads them off a real socket.
func TestRequests(t *testing.T) {
	a := fakeagent.Start(t, ok(&pb.Response{}))
	const timeout = 5 * time.Second
	tests := []struct {
		name string
		call func() (int, string)
		want *pb.Request
	}{{
		name: "prolog with GPUs",
		call: func() (int, string) { return JobProlog(a.Socket, timeout, 7, 2001, ptr("0,2")) },
		want: &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 7, Uid: 2001, JobGpus: ptr("0,2")}}},
	}, {
		name: "prolog of a CPU-only job sends no list",
		call: func() (int, string) { return JobProlog(a.Socket, timeout, 8, 2001, nil) },
		want: &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 8, Uid: 2001}}},
	}, {
		name: "step start from init",
		call: func() (int, string) {
			_, c, e := StepStart(a.Socket, timeout, 7, 0xfffffffb, 2001, nil, nil)
			return c, e
		},
		want: &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 7, StepId: 0xfffffffb, Uid: 2001}}},
	}, {
		name: "step start from post_fork",
		call: func() (int, string) {
			_, c, e := StepStart(a.Socket, timeout, 7, 3, 2001, ptr("1"), []int32{4242})
			return c, e
		},
		want: &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 7, StepId: 3, Uid: 2001,
			StepGpus: ptr("1"), TaskPids: []uint32{4242}}}},
	}, {
		name: "step channel",
		call: func() (int, string) {
			_, c, e := StepChannel(a.Socket, timeout, 7, 3)
			return c, e
		},
		want: &pb.Request{Msg: &pb.Request_StepChannel{StepChannel: &pb.StepChannel{JobId: 7, StepId: 3}}},
	}, {
		name: "epilog",
		call: func() (int, string) { return JobEpilog(a.Socket, timeout, 7) },
		want: &pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 7}}},
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code, text := tt.call(); code != CodeOK || text != "" {
				t.Fatalf("call: %d %q", code, text)
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
	cg := "/system.slice/n1_slurmstepd.scope/job_1/step_0"
	a := fakeagent.Start(t, ok(&pb.Response{Gpus: []uint32{3, 1, 3}, SlurmLocalIndices: true, StepCgroup: cg, ImexPending: true}))
	res, code, text := StepStart(a.Socket, 5*time.Second, 1, 0, 2001, ptr("1,3"), []int32{10})
	if code != CodeOK || text != "" {
		t.Fatalf("outcome = %d %q, want OK", code, text)
	}
	if want := []uint32{1, 3}; !slices.Equal(res.GPUs, want) || !res.SlurmLocalIndices || res.StepCgroup != cg || !res.IMEXPending {
		t.Errorf("result = %+v, want GPUs %v (sorted, unique), SlurmLocalIndices, IMEXPending and cgroup %s", res, want, cg)
	}
}

// What does not fit the plugin's arrays is an error, never cut short: a
// shortened cgroup path would let a task outside the step pass the check.
func TestStepStartRefusesWhatDoesNotFit(t *testing.T) {
	gpus := make([]uint32, MaxGPUs+1)
	for i := range gpus {
		gpus[i] = uint32(i)
	}
	for _, tt := range []struct {
		name string
		resp *pb.Response
		want string
	}{
		{"too many GPUs", &pb.Response{Gpus: gpus}, "agent allowed 257 GPUs, room for 256"},
		{"cgroup path too long", &pb.Response{StepCgroup: "/" + strings.Repeat("a", CgroupLen)}, "step cgroup path longer than 4095 bytes"},
		{"cgroup path with a NUL", &pb.Response{StepCgroup: "/job_1\x00/step_0"}, "step cgroup path with a NUL byte"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := fakeagent.Start(t, ok(tt.resp))
			res, code, text := StepStart(a.Socket, 5*time.Second, 1, 0, 2001, nil, nil)
			if code != CodeInvalid || !strings.Contains(text, tt.want) {
				t.Errorf("outcome = %d %q, want %d %q", code, text, CodeInvalid, tt.want)
			}
			if len(res.GPUs) != 0 || res.StepCgroup != "" {
				t.Errorf("result kept after the failure: %+v", res)
			}
		})
	}
}

func TestStepStartRejectsBadPID(t *testing.T) {
	a := fakeagent.Start(t, ok(&pb.Response{}))
	if _, code, text := StepStart(a.Socket, time.Second, 1, 0, 2001, nil, []int32{-1}); code != CodeInvalid || text != "invalid argument: task pid -1" {
		t.Errorf("pid -1: %d %q, want invalid", code, text)
	}
	if n := len(a.Requests()); n != 0 {
		t.Errorf("agent got %d requests for an invalid call", n)
	}
}

func TestFailures(t *testing.T) {
	refusing := fakeagent.Start(t, ok(&pb.Response{Error: "job 7 has no prolog record on this node"}))
	silent := fakeagent.Start(t, func(*pb.Request) *pb.Response { return nil })
	long := fakeagent.Start(t, ok(&pb.Response{Error: strings.Repeat("é", 400)}))
	tests := []struct {
		name     string
		socket   string
		timeout  time.Duration
		wantCode int
		wantText string
	}{
		{"refusal", refusing.Socket, 5 * time.Second, CodeRefused, "job 7 has no prolog record on this node"},
		// 511 bytes of room: 255 two-byte characters, never half of one.
		{"long refusal cut at a character", long.Socket, 5 * time.Second, CodeRefused, strings.Repeat("é", 255)},
		{"never answers", silent.Socket, 300 * time.Millisecond, CodeUnreachable, "no answer within 300ms"},
		{"absent", fakeagent.AbsentSocket(t), 5 * time.Second, CodeUnreachable, "connect: no such file or directory"},
		{"no socket configured", "", time.Second, CodeInvalid, `invalid argument: socket "", timeout 1s`},
		{"socket path too long", "/" + strings.Repeat("s", 120), time.Second, CodeInvalid, "longer than 107 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, code, text := StepStart(tt.socket, tt.timeout, 7, 0, 2001, nil, []int32{99})
			elapsed := time.Since(start)
			if code != tt.wantCode || !strings.HasSuffix(text, tt.wantText) && text != tt.wantText {
				t.Errorf("outcome = %d %q, want %d %q", code, text, tt.wantCode, tt.wantText)
			}
			if elapsed > tt.timeout*3/2+time.Second {
				t.Errorf("took %v, limit %v", elapsed, tt.timeout*3/2)
			}
			// The prolog and the other calls share the same conversion
			// (with the agent not yet known hung).
			os.Remove(tt.socket + ".hung")
			if code2, text2 := JobProlog(tt.socket, tt.timeout, 7, 2001, nil); code2 != code || text2 != text {
				t.Errorf("JobProlog outcome = %d %q, StepStart gave %d %q", code2, text2, code, text)
			}
		})
	}
}

func TestStepChannelResult(t *testing.T) {
	ch := uint32(5)
	a := fakeagent.Start(t, ok(&pb.Response{ImexChannel: &ch}))
	if got, code, text := StepChannel(a.Socket, 5*time.Second, 1, 0); code != CodeOK || got == nil || *got != 5 {
		t.Fatalf("StepChannel = %v, %d %q; want channel 5", got, code, text)
	}
	b := fakeagent.Start(t, ok(&pb.Response{}))
	if got, code, text := StepChannel(b.Socket, 5*time.Second, 1, 0); code != CodeOK || got != nil {
		t.Fatalf("StepChannel without a channel = %v, %d %q; want none", got, code, text)
	}
}

func TestRetryAfterHangUp(t *testing.T) {
	var n atomic.Int32
	a := fakeagent.Start(t, func(*pb.Request) *pb.Response {
		if n.Add(1) == 1 {
			return fakeagent.HangUp
		}
		return &pb.Response{Gpus: []uint32{2}}
	})
	res, code, text := StepStart(a.Socket, 5*time.Second, 7, 0, 2001, nil, []int32{99})
	if code != CodeOK || !slices.Equal(res.GPUs, []uint32{2}) {
		t.Fatalf("StepStart = %+v, %d %q; want GPU 2 from the second try", res, code, text)
	}
	if got := len(a.Requests()); got != 2 {
		t.Errorf("agent saw %d requests, want 2 (hang-up, then the retry)", got)
	}
}

// An agent that is restarting: nothing listens at the first try.
func TestRetryReachesAgentThatAppears(t *testing.T) {
	sock := fakeagent.AbsentSocket(t)
	type result struct {
		code int
		text string
	}
	done := make(chan result, 1)
	go func() {
		c, e := JobEpilog(sock, 5*time.Second, 7)
		done <- result{c, e}
	}()
	time.Sleep(RetryPause / 4)
	a := fakeagent.StartAt(t, sock, ok(&pb.Response{}))
	if r := <-done; r.code != CodeOK {
		t.Fatalf("JobEpilog: %d %q", r.code, r.text)
	}
	if got := len(a.Requests()); got != 1 {
		t.Errorf("agent saw %d requests, want 1", got)
	}
}

func TestRefusalIsNotRetried(t *testing.T) {
	a := fakeagent.Start(t, ok(&pb.Response{Error: "no"}))
	if code, text := JobEpilog(a.Socket, 5*time.Second, 7); code != CodeRefused || text != "no" {
		t.Fatalf("%d %q, want refused, no", code, text)
	}
	if got := len(a.Requests()); got != 1 {
		t.Errorf("agent saw %d requests for one refusal, want 1", got)
	}
}

// One call waits at most 1.5×timeout in all, with two tries: an agent that
// accepts and never answers (stopped, wedged) costs the step its timeout and
// one short second try (a hung agent answers none; a working one answers
// in milliseconds).
func TestRetryBudget(t *testing.T) {
	const timeout = time.Second
	silent := fakeagent.Start(t, func(*pb.Request) *pb.Response { return nil })
	start := time.Now()
	code, text := JobEpilog(silent.Socket, timeout, 7)
	elapsed := time.Since(start)
	if code != CodeUnreachable || text != "no answer within 1s" {
		t.Errorf("outcome = %d %q, want unreachable, no answer within 1s", code, text)
	}
	if got := len(silent.Requests()); got != 2 {
		t.Errorf("agent saw %d requests, want 2", got)
	}
	if want := timeout + Probe; elapsed < want-50*time.Millisecond || elapsed > want+250*time.Millisecond {
		t.Errorf("silent agent: took %v, want about %v (timeout, then a %v try)", elapsed, want, Probe)
	}

	// Nothing listening fails at once twice: one pause, far below the budget.
	start = time.Now()
	code, _ = JobEpilog(fakeagent.AbsentSocket(t), timeout, 7)
	elapsed = time.Since(start)
	if code != CodeUnreachable {
		t.Errorf("absent agent: code %d, want unreachable", code)
	}
	if elapsed < RetryPause || elapsed > timeout {
		t.Errorf("absent agent: took %v, want a %v pause between two tries and under %v", elapsed, RetryPause, timeout)
	}
}

// An answer over the agent's frame limit, or one whose length never ends,
// is no answer: unreachable (failure=open may apply), read no further.
func TestOversizedAndMalformedAnswers(t *testing.T) {
	for _, tt := range []struct {
		name  string
		bytes []byte
		want  string
	}{
		{"over 64 KiB", []byte{0x81, 0x80, 0x04}, "answer over 65536 bytes"},
		{"length never ends", bytes.Repeat([]byte{0x80}, 12), "malformed answer"},
		{"not a message", []byte{0x02, 0x0a, 0x05}, "malformed answer"},
		{"cut short", []byte{0x05, 0x0a}, "the agent closed the connection without answering"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sock := rawAgent(t, tt.bytes)
			code, text := JobEpilog(sock, time.Second, 7)
			if code != CodeUnreachable || text != tt.want {
				t.Errorf("%d %q, want unreachable, %q", code, text, tt.want)
			}
		})
	}
}

// rawAgent answers every connection with b after reading its request, then
// hangs up.
func rawAgent(t *testing.T, b []byte) string {
	sock := fakeagent.AbsentSocket(t)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Read(make([]byte, 256))
				c.Write(b)
			}()
		}
	}()
	return sock
}

const impostorEnv = "GPUFENCE_TEST_IMPOSTOR_SOCKET"

// impostor, in a child running as nobody, listens on the socket and
// accepts forever: what a process squatting on the agent's path would do.
func impostor(path string) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Stdout.WriteString("ready\n")
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(0)
		}
		go func() { c.Write([]byte{0}); time.Sleep(time.Minute) }()
	}
}

// The plugin trusts only a root listener: a socket bound by another user
// is refused with a message naming gpufence, as a refusal (never a reason
// for failure=open to let the step run).
func TestPrivilegedNonRootListenerRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs the listener as another user")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	for d := filepath.Dir(dir); d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			os.Chmod(d, fi.Mode().Perm()|0o001)
		}
	}
	sock := filepath.Join(dir, "agent.sock")
	bin := filepath.Join(dir, "cwire.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), impostorEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("impostor: %q", line)
	}
	_, code, text := StepStart(sock, 2*time.Second, 7, 0, 2001, ptr("0"), nil)
	if code != CodeRefused || !strings.Contains(text, "not root") || !strings.Contains(text, "gpufence") || !strings.Contains(text, "uid 65534") {
		t.Errorf("step start against a nobody listener: code %d, %q; want a refusal naming gpufence and the uid", code, text)
	}
}

func TestMain(m *testing.M) {
	if p := os.Getenv(impostorEnv); p != "" {
		impostor(p)
	}
	os.Exit(m.Run())
}

// FuzzParseResponse: on any bytes the C decoder never crashes or reads out
// of bounds (make fuzz runs it under -asan), and where both decoders
// accept, they agree on every field the plugin uses.
func FuzzParseResponse(f *testing.F) {
	for _, r := range []*pb.Response{{Error: "x"}, {Gpus: []uint32{0, 3}, SlurmLocalIndices: true, StepCgroup: "/a/b"}, {TaskBind: true}} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte{0x10, 0x05, 0x10, 0x07})       // unpacked gpus
	f.Add([]byte{0x63, 0x08, 0x01, 0x64, 0x18}) // a group, then a field cut short
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := ParseResponse(b)
		var want pb.Response
		werr := proto.Unmarshal(b, &want)
		// C is stricter (a GPU index over 32 bits is an error, not
		// truncated; groups nest 64 deep at most) and passes string bytes
		// through where the generated decoder checks UTF-8; what both
		// accept, they must read alike.
		if !ok || werr != nil || len(want.Gpus) > MaxGPUs {
			return
		}
		if !same(got, &want) {
			t.Fatalf("C %+v, generated %v", got, &want)
		}
	})
}

// TaskBind in its two halves over a real socket: connected first (as the
// task child does in task_init_privileged), sent later on that connection,
// read by the agent's decoder; the answer's GPUs come back sorted, unique.
func TestTaskBind(t *testing.T) {
	a := fakeagent.Start(t, ok(&pb.Response{Gpus: []uint32{3, 1, 3}}))
	fd, code, text := TaskConnect(a.Socket, 5*time.Second)
	if code != CodeOK || fd < 0 {
		t.Fatalf("TaskConnect = %d, %d %q", fd, code, text)
	}
	if n := len(a.Requests()); n != 0 {
		t.Fatalf("agent got %d requests before TaskBind was sent", n)
	}
	gpus, code, text := TaskBind(fd, 5*time.Second, 7, 3, 1, ptr("1,3"))
	if code != CodeOK || text != "" || !slices.Equal(gpus, []uint32{1, 3}) {
		t.Fatalf("TaskBind = %v, %d %q; want [1 3]", gpus, code, text)
	}
	want := &pb.Request{Version: pb.ProtocolVersion_PROTOCOL_VERSION_1,
		Msg: &pb.Request_TaskBind{TaskBind: &pb.TaskBind{JobId: 7, StepId: 3, TaskId: 1, VisibleDevices: ptr("1,3")}}}
	if reqs := a.Requests(); len(reqs) != 1 || !proto.Equal(reqs[0], want) {
		t.Errorf("agent got %v, want %v", reqs, want)
	}
	// TaskBind closed the socket: the descriptor is free again.
	if err := syscall.Close(fd); err == nil {
		t.Errorf("fd %d still open after TaskBind", fd)
	}
}

func TestTaskBindFailures(t *testing.T) {
	if fd, code, text := TaskConnect(fakeagent.AbsentSocket(t), time.Second); code != CodeUnreachable || fd != -1 || !strings.Contains(text, "connect") {
		t.Errorf("TaskConnect to nothing = %d, %d %q; want unreachable, fd -1", fd, code, text)
	}
	refuse := fakeagent.Start(t, ok(&pb.Response{Error: "step 7.3 task 1: not a task"}))
	fd, code, _ := TaskConnect(refuse.Socket, time.Second)
	if code != CodeOK {
		t.Fatal(code)
	}
	if gpus, code, text := TaskBind(fd, time.Second, 7, 3, 1, ptr("0")); code != CodeRefused || text != "step 7.3 task 1: not a task" || gpus != nil {
		t.Errorf("refused TaskBind = %v, %d %q", gpus, code, text)
	}
	hang := fakeagent.Start(t, func(*pb.Request) *pb.Response { return fakeagent.HangUp })
	fd, code, _ = TaskConnect(hang.Socket, time.Second)
	if code != CodeOK {
		t.Fatal(code)
	}
	if _, code, text := TaskBind(fd, time.Second, 7, 3, 1, nil); code != CodeUnreachable || !strings.Contains(text, "without answering") {
		t.Errorf("TaskBind to an agent that hangs up = %d %q", code, text)
	}
	silent := fakeagent.Start(t, func(*pb.Request) *pb.Response { return nil })
	fd, code, _ = TaskConnect(silent.Socket, time.Second)
	if code != CodeOK {
		t.Fatal(code)
	}
	start := time.Now()
	if _, code, text := TaskBind(fd, 300*time.Millisecond, 7, 3, 1, nil); code != CodeUnreachable || text != "no answer within 300ms" {
		t.Errorf("TaskBind to a silent agent = %d %q", code, text)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("TaskBind waited %v for a 300ms timeout (no second try: it cannot connect again)", d)
	}
	if _, code, _ := TaskBind(-1, time.Second, 7, 3, 1, nil); code != CodeInvalid {
		t.Errorf("TaskBind on fd -1 = %d, want invalid", code)
	}
	// A value over the frame is refused unsent, and the socket closed.
	many := strings.Repeat("1,", GFTaskBindFrame)
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(pair[1])
	if _, code, text := TaskBind(pair[0], time.Second, 7, 3, 1, &many); code != CodeInvalid || !strings.Contains(text, "too long") {
		t.Errorf("TaskBind with a value over the frame = %d %q", code, text)
	}
	if n, err := syscall.Read(pair[1], make([]byte, 1)); n != 0 || err != nil {
		t.Errorf("peer read %d bytes, %v; want EOF (nothing sent, socket closed)", n, err)
	}
}

// TestFailFastAfterTimeout: once a call waited its timeout for no answer,
// the calls after it (the job's extern step, its step: other processes)
// make one short try only, until the agent answers one; then the full
// timeout applies again. The marker is trusted only as a regular file of
// ours in a folder no one else may write to, with a time not ahead of the
// clock and within the window.
func TestFailFastAfterTimeout(t *testing.T) {
	const timeout = time.Second
	var answering atomic.Bool
	a := fakeagent.Start(t, func(*pb.Request) *pb.Response {
		if answering.Load() {
			return &pb.Response{}
		}
		return nil
	})
	marker := a.Socket + ".hung"
	timed := func(f func() (int, string)) (int, string, time.Duration) {
		start := time.Now()
		c, e := f()
		return c, e, time.Since(start)
	}
	epilog := func() (int, string) { return JobEpilog(a.Socket, timeout, 7) }
	prolog := func() (int, string) { return JobProlog(a.Socket, timeout, 7, 2001, nil) }

	code, _, took := timed(epilog)
	if code != CodeUnreachable || took < timeout {
		t.Fatalf("first call: %d after %v, want unreachable after the %v timeout", code, took, timeout)
	}
	fi, err := os.Lstat(marker)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("marker after a timeout: %v %v, want a 0600 file", fi, err)
	}
	code, text, took := timed(prolog)
	if code != CodeUnreachable || took > Probe+100*time.Millisecond ||
		text != "no answer within 250ms; an exchange on this node had none within 1s less than 30s ago" {
		t.Errorf("call after a timeout: %d %q after %v, want unreachable within %v", code, text, took, Probe)
	}
	t.Logf("hung agent: first call %v, the next %v", timeout+Probe, took.Round(time.Millisecond))

	// The agent answers again: used at once, and the marker goes.
	answering.Store(true)
	if code, text, took := timed(epilog); code != CodeOK || took > Probe {
		t.Errorf("agent back: %d %q after %v", code, text, took)
	}
	if _, err := os.Lstat(marker); !os.IsNotExist(err) {
		t.Errorf("marker left after an answer: %v", err)
	}
	answering.Store(false)
	if code, _, took := timed(epilog); code != CodeUnreachable || took < timeout {
		t.Errorf("after the marker went: %d after %v, want the full %v again", code, took, timeout)
	}

	// A marker not to trust makes no call fail fast: each waits in full.
	now := time.Now()
	for _, tt := range []struct {
		name  string
		plant func(t *testing.T) string // returns the socket
	}{
		{"time ahead of the clock (clock set back)", func(t *testing.T) string {
			os.Chtimes(marker, now.Add(time.Hour), now.Add(time.Hour))
			return a.Socket
		}},
		{"older than the window", func(t *testing.T) string {
			os.Chtimes(marker, now.Add(-HungWindow-5*time.Second), now.Add(-HungWindow-5*time.Second))
			return a.Socket
		}},
		{"a symlink", func(t *testing.T) string {
			os.Remove(marker)
			target := filepath.Join(t.TempDir(), "x")
			os.WriteFile(target, nil, 0o600)
			if err := os.Symlink(target, marker); err != nil {
				t.Fatal(err)
			}
			return a.Socket
		}},
		{"in a folder others may write to", func(t *testing.T) string {
			dir := t.TempDir()
			os.Chmod(dir, 0o777)
			sock := filepath.Join(dir, "agent.sock")
			fakeagent.StartAt(t, sock, func(*pb.Request) *pb.Response { return nil })
			if err := os.WriteFile(sock+".hung", nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return sock
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			os.Remove(marker)
			os.WriteFile(marker, nil, 0o600)
			sock := tt.plant(t)
			start := time.Now()
			code, text := JobEpilog(sock, 300*time.Millisecond, 7)
			if took := time.Since(start); code != CodeUnreachable || took < 300*time.Millisecond || text != "no answer within 300ms" {
				t.Errorf("%d %q after %v, want the full 300ms", code, text, took)
			}
		})
	}
}
