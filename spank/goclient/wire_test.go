// SPDX-License-Identifier: Apache-2.0

package main

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// The hand encoding against the generated types, both ways.
func TestWireMatchesGenerated(t *testing.T) {
	s := "0,2"
	empty := ""
	reqs := []struct {
		frame []byte
		want  *pb.Request
	}{
		{jobPrologMsg(7, 2001, &s), &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 7, Uid: 2001, JobGpus: &s}}}},
		{jobPrologMsg(8, 0, &empty), &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 8, JobGpus: &empty}}}},
		{jobPrologMsg(9, 1, nil), &pb.Request{Msg: &pb.Request_JobProlog{JobProlog: &pb.JobProlog{JobId: 9, Uid: 1}}}},
		{stepStartMsg(7, 0xfffffffb, 2001, nil, nil), &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 7, StepId: 0xfffffffb, Uid: 2001}}}},
		{stepStartMsg(7, 3, 2001, &s, []uint32{4242, 1}), &pb.Request{Msg: &pb.Request_StepStart{StepStart: &pb.StepStart{JobId: 7, StepId: 3, Uid: 2001, StepGpus: &s, TaskPids: []uint32{4242, 1}}}}},
		{stepChannelMsg(7, 3), &pb.Request{Msg: &pb.Request_StepChannel{StepChannel: &pb.StepChannel{JobId: 7, StepId: 3}}}},
		{stepEndMsg(7, 0), &pb.Request{Msg: &pb.Request_StepEnd{StepEnd: &pb.StepEnd{JobId: 7}}}},
		{jobEpilogMsg(4294967295), &pb.Request{Msg: &pb.Request_JobEpilog{JobEpilog: &pb.JobEpilog{JobId: 4294967295}}}},
	}
	for _, tt := range reqs {
		var got pb.Request
		r := &byteReader{b: tt.frame}
		if err := protodelim.UnmarshalFrom(r, &got); err != nil || len(r.b) != 0 {
			t.Fatalf("%x: %v (%d bytes left)", tt.frame, err, len(r.b))
		}
		tt.want.Version = pb.ProtocolVersion_PROTOCOL_VERSION_1
		if !proto.Equal(&got, tt.want) {
			t.Errorf("decoded %v, want %v", &got, tt.want)
		}
	}
	zero, high := uint32(0), uint32(2047)
	for _, want := range []*pb.Response{
		{}, {Error: "no"}, {Gpus: []uint32{3, 1, 4294967295}, SlurmLocalIndices: true, StepCgroup: "/system.slice/x_slurmstepd.scope/job_7/step_0"},
		{ImexPending: true}, {ImexChannel: &zero}, {ImexChannel: &high},
		// gpufence verify's answer: a field the plugin never asks for, skipped.
		{Gpus: []uint32{2}, Verify: &pb.VerifyInfo{Mode: "scope", CgroupId: 9, Gpus: []*pb.VerifyGPU{{Index: 0, Files: []string{"/dev/nvidia0"}}}}},
	} {
		b, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseResponse(b)
		if err != nil || got.err != want.Error || !slices.Equal(got.gpus, want.Gpus) || got.slurmLocal != want.SlurmLocalIndices || got.stepCgroup != want.StepCgroup ||
			got.imexPending != want.ImexPending || (got.imexChannel == nil) != (want.ImexChannel == nil) || (got.imexChannel != nil && *got.imexChannel != *want.ImexChannel) {
			t.Errorf("parseResponse(%v) = %+v, %v", want, got, err)
		}
	}
}

type byteReader struct{ b []byte }

func (r *byteReader) ReadByte() (byte, error) {
	if len(r.b) == 0 {
		return 0, errMalformed
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c, nil
}

func (r *byteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, errMalformed
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// FuzzParseResponse: on any bytes the hand decoder never crashes, and where
// both decoders accept, they agree on every field the plugin uses.
func FuzzParseResponse(f *testing.F) {
	for _, r := range []*pb.Response{{Error: "x"}, {Gpus: []uint32{0, 3}, SlurmLocalIndices: true, StepCgroup: "/a/b"}} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte{0x10, 0x05, 0x10, 0x07}) // unpacked gpus
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseResponse(b)
		var want pb.Response
		werr := proto.Unmarshal(b, &want)
		// The hand decoder is stricter (a GPU index over 32 bits is an
		// error, not truncated) and passes string bytes through where the
		// generated one checks UTF-8; what it accepts, it must read alike.
		if err != nil || werr != nil {
			return
		}
		if got.err != want.Error || !slices.Equal(got.gpus, want.Gpus) || got.slurmLocal != want.SlurmLocalIndices || got.stepCgroup != want.StepCgroup {
			t.Fatalf("hand %+v, generated %v", got, &want)
		}
	})
}
