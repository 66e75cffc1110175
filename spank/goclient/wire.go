// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
)

// The client encodes and decodes proto/gpufence/v1/agent.proto with
// protowire alone: the generated types would bring the protobuf runtime's
// reflection registry into every slurmstepd and prolog process, whose init
// costs more than the exchange itself. client_test.go holds this encoding
// to the generated types both ways, so the two cannot drift.

// Field numbers of agent.proto.
const (
	fRequestVersion   = 1
	fRequestJobProlog = 10
	fRequestStepStart = 11
	fRequestStepEnd   = 12
	fRequestJobEpilog = 13
	fRequestStepChan  = 16 // 14, 15: VerifyStart, VerifyEnd

	fJobID    = 1 // JobProlog, StepStart, StepEnd, JobEpilog
	fStepID   = 2 // StepStart, StepEnd
	fUID      = 2 // JobProlog
	fJobGPUs  = 3 // JobProlog
	fStepUID  = 3 // StepStart
	fStepGPUs = 4 // StepStart
	fTaskPIDs = 5 // StepStart

	fRespError      = 1
	fRespGPUs       = 2
	fRespSlurmLocal = 3
	fRespStepCgroup = 4
	fRespIMEXPend   = 6 // 5: verify
	fRespIMEXChan   = 7

	protocolVersion1 = 1
	// maxFrame is proto/wire's MaxFrameSize.
	maxFrame = 64 << 10
)

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b // proto3 leaves zero scalars out
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// appendOptString writes an optional string field: present, even empty,
// unless s is nil.
func appendOptString(b []byte, num protowire.Number, s *string) []byte {
	if s == nil {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, *s)
}

// request frames one Request: a varint length, then the message with the
// version and the one message of the oneof.
func request(num protowire.Number, msg []byte) []byte {
	var body []byte
	body = appendVarintField(body, fRequestVersion, protocolVersion1)
	body = protowire.AppendTag(body, num, protowire.BytesType)
	body = protowire.AppendBytes(body, msg)
	return protowire.AppendBytes(nil, body)
}

func jobPrologMsg(jobID, uid uint32, jobGPUs *string) []byte {
	var m []byte
	m = appendVarintField(m, fJobID, uint64(jobID))
	m = appendVarintField(m, fUID, uint64(uid))
	m = appendOptString(m, fJobGPUs, jobGPUs)
	return request(fRequestJobProlog, m)
}

func jobEpilogMsg(jobID uint32) []byte {
	return request(fRequestJobEpilog, appendVarintField(nil, fJobID, uint64(jobID)))
}

func stepStartMsg(jobID, stepID, uid uint32, stepGPUs *string, pids []uint32) []byte {
	var m []byte
	m = appendVarintField(m, fJobID, uint64(jobID))
	m = appendVarintField(m, fStepID, uint64(stepID))
	m = appendVarintField(m, fStepUID, uint64(uid))
	m = appendOptString(m, fStepGPUs, stepGPUs)
	if len(pids) > 0 {
		var packed []byte
		for _, p := range pids {
			packed = protowire.AppendVarint(packed, uint64(p))
		}
		m = protowire.AppendTag(m, fTaskPIDs, protowire.BytesType)
		m = protowire.AppendBytes(m, packed)
	}
	return request(fRequestStepStart, m)
}

func stepEndMsg(jobID, stepID uint32) []byte {
	var m []byte
	m = appendVarintField(m, fJobID, uint64(jobID))
	m = appendVarintField(m, fStepID, uint64(stepID))
	return request(fRequestStepEnd, m)
}

func stepChannelMsg(jobID, stepID uint32) []byte {
	var m []byte
	m = appendVarintField(m, fJobID, uint64(jobID))
	m = appendVarintField(m, fStepID, uint64(stepID))
	return request(fRequestStepChan, m)
}

// response is the part of a Response the plugin uses.
type response struct {
	err         string
	gpus        []uint32
	slurmLocal  bool
	stepCgroup  string
	imexPending bool
	imexChannel *uint32
}

var errMalformed = errors.New("malformed answer")

// parseResponse decodes a Response message (without its length prefix).
// Unknown fields are skipped, as protobuf does: a newer agent may add some.
func parseResponse(b []byte) (response, error) {
	var r response
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return r, errMalformed
		}
		b = b[n:]
		switch {
		case num == fRespError && typ == protowire.BytesType:
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return r, errMalformed
			}
			r.err, b = v, b[n:]
		case num == fRespStepCgroup && typ == protowire.BytesType:
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return r, errMalformed
			}
			r.stepCgroup, b = v, b[n:]
		case num == fRespGPUs && typ == protowire.BytesType: // packed
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return r, errMalformed
			}
			b = b[n:]
			for len(v) > 0 {
				g, m := protowire.ConsumeVarint(v)
				if m < 0 || g > 1<<32-1 {
					return r, errMalformed
				}
				r.gpus, v = append(r.gpus, uint32(g)), v[m:]
			}
		case num == fRespGPUs && typ == protowire.VarintType: // unpacked
			g, n := protowire.ConsumeVarint(b)
			if n < 0 || g > 1<<32-1 {
				return r, errMalformed
			}
			r.gpus, b = append(r.gpus, uint32(g)), b[n:]
		case num == fRespSlurmLocal && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return r, errMalformed
			}
			r.slurmLocal, b = v != 0, b[n:]
		case num == fRespIMEXPend && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return r, errMalformed
			}
			r.imexPending, b = v != 0, b[n:]
		case num == fRespIMEXChan && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 || v > 1<<32-1 {
				return r, errMalformed
			}
			c := uint32(v)
			r.imexChannel, b = &c, b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return r, errMalformed
			}
			b = b[n:]
		}
	}
	return r, nil
}
