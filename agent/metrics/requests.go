// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"context"
	"time"

	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/server"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

const (
	resultOK      = "ok"
	resultRefused = "refused"
	// typeUnknown is a request with no message the agent knows.
	typeUnknown = "unknown"
)

// requestTypes are the message names of Request's oneof (job_prolog,
// step_start, …), read from the protocol itself so a new message gets its
// series without a change here; the label's values stay bounded by it.
func requestTypes() []string {
	od := (&pb.Request{}).ProtoReflect().Descriptor().Oneofs().ByName("msg")
	out := []string{typeUnknown}
	for i := 0; i < od.Fields().Len(); i++ {
		out = append(out, string(od.Fields().Get(i).Name()))
	}
	return out
}

func requestType(req *pb.Request) string {
	m := req.ProtoReflect()
	od := m.Descriptor().Oneofs().ByName("msg")
	if od == nil {
		return typeUnknown
	}
	if f := m.WhichOneof(od); f != nil {
		return string(f.Name())
	}
	return typeUnknown
}

// Instrument times h's answers by request type and counts them by result.
func (e *Exporter) Instrument(h server.Handler) server.Handler {
	return instrumented{next: h, e: e}
}

type instrumented struct {
	next server.Handler
	e    *Exporter
}

func (i instrumented) Handle(ctx context.Context, p peer.Peer, req *pb.Request) *pb.Response {
	start := time.Now()
	resp := i.next.Handle(ctx, p, req)
	t := requestType(req)
	i.e.reqDur.WithLabelValues(t).Observe(time.Since(start).Seconds())
	result := resultOK
	if resp.GetError() != "" {
		result = resultRefused
	}
	i.e.reqs.WithLabelValues(t, result).Inc()
	return resp
}

// Shed counts a connection the server closed unanswered (server.Limit).
func (e *Exporter) Shed() { e.shed.Inc() }
