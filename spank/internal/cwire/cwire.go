// SPDX-License-Identifier: Apache-2.0

// Package cwire runs the C SPANK plugin's client (spank/plugin/client.c: the
// protocol encoding, the answer's decoding and the exchange over the agent's
// socket) in Go tests, compiled here from the plugin's own files (symbolic
// links, so that Go's build cache sees every change to them) with the
// plugin's warnings. It exists for the tests and fuzz targets that hold the
// C encoding to the generated protobuf types and the C client to a real
// socket; nothing else imports it.
//
// Every buffer handed to C is allocated to its exact size with malloc, so a
// run under `go test -asan` (make fuzz does that) catches an overrun at once.
package cwire

/*
#cgo CFLAGS: -std=gnu11 -O1 -g -Wall -Wextra -Werror -Wno-unused-parameter -I${SRCDIR}/../../plugin
#include <stdlib.h>
#include <string.h>
#include "client.h"
*/
import "C"

import (
	"time"
	"unsafe"
)

// Codes and limits of client.h.
const (
	CodeOK          = C.GPUFENCE_OK
	CodeRefused     = C.GPUFENCE_E_REFUSED
	CodeUnreachable = C.GPUFENCE_E_UNREACHABLE
	CodeInvalid     = C.GPUFENCE_E_INVALID
	MaxGPUs         = C.GPUFENCE_MAX_GPUS
	MaxFrame        = C.GF_MAX_FRAME
	CgroupLen       = C.GPUFENCE_CGROUP_LEN
	RetryPause      = C.GF_RETRY_PAUSE_MS * time.Millisecond
	Probe           = C.GF_PROBE_MS * time.Millisecond
	HungWindow      = C.GF_HUNG_WINDOW_S * time.Second
	GFTaskBindFrame = C.GF_TASK_BIND_FRAME
)

// cstr is s in malloc'd memory of its exact size; nil for nil.
func cstr(s *string) *C.char {
	if s == nil {
		return nil
	}
	return C.CString(*s)
}

func free(p *C.char) {
	if p != nil {
		C.free(unsafe.Pointer(p))
	}
}

const errLen = C.GPUFENCE_ERR_LEN

// call runs fn with a malloc'd error buffer and returns its text.
func call(fn func(err *C.char, errlen C.size_t) C.int) (int, string) {
	err := (*C.char)(C.calloc(errLen, 1))
	defer C.free(unsafe.Pointer(err))
	code := fn(err, errLen)
	return int(code), C.GoString(err)
}

func ms(d time.Duration) C.int { return C.int(d / time.Millisecond) }

// JobProlog runs gf_client_job_prolog; jobGPUs nil: unset.
func JobProlog(socket string, timeout time.Duration, jobID, uid uint32, jobGPUs *string) (int, string) {
	cs, cg := C.CString(socket), cstr(jobGPUs)
	defer free(cs)
	defer free(cg)
	return call(func(err *C.char, n C.size_t) C.int {
		return C.gf_client_job_prolog(cs, ms(timeout), C.uint32_t(jobID), C.uint32_t(uid), cg, err, n)
	})
}

// JobEpilog runs gf_client_job_epilog.
func JobEpilog(socket string, timeout time.Duration, jobID uint32) (int, string) {
	cs := C.CString(socket)
	defer free(cs)
	return call(func(err *C.char, n C.size_t) C.int {
		return C.gf_client_job_epilog(cs, ms(timeout), C.uint32_t(jobID), err, n)
	})
}

// StepResult is struct gf_step_result.
type StepResult struct {
	GPUs              []uint32
	SlurmLocalIndices bool
	IMEXPending       bool
	TaskBind          bool
	HasChannel        bool
	Channel           uint32
	StepCgroup        string
}

func stepResult(r *C.struct_gf_step_result) StepResult {
	out := StepResult{
		SlurmLocalIndices: r.slurm_local_indices != 0,
		IMEXPending:       r.imex_pending != 0,
		TaskBind:          r.task_bind != 0,
		HasChannel:        r.has_channel != 0,
		Channel:           uint32(r.channel),
		StepCgroup:        C.GoString(&r.step_cgroup[0]),
	}
	for i := 0; i < int(r.ngpus); i++ {
		out.GPUs = append(out.GPUs, uint32(r.gpus[i]))
	}
	return out
}

// StepStart runs gf_client_step_start.
func StepStart(socket string, timeout time.Duration, jobID, stepID, uid uint32, stepGPUs *string, pids []int32) (StepResult, int, string) {
	cs, cg := C.CString(socket), cstr(stepGPUs)
	defer free(cs)
	defer free(cg)
	var cp *C.int32_t
	if len(pids) > 0 {
		cp = (*C.int32_t)(C.malloc(C.size_t(4 * len(pids))))
		defer C.free(unsafe.Pointer(cp))
		copy(unsafe.Slice((*int32)(unsafe.Pointer(cp)), len(pids)), pids)
	}
	res := (*C.struct_gf_step_result)(C.calloc(1, C.sizeof_struct_gf_step_result))
	defer C.free(unsafe.Pointer(res))
	code, text := call(func(err *C.char, n C.size_t) C.int {
		return C.gf_client_step_start(cs, ms(timeout), C.uint32_t(jobID), C.uint32_t(stepID), C.uint32_t(uid),
			cg, cp, C.int(len(pids)), res, err, n)
	})
	return stepResult(res), code, text
}

// StepChannel runs gf_client_step_channel; channel nil: the step has none.
func StepChannel(socket string, timeout time.Duration, jobID, stepID uint32) (channel *uint32, code int, text string) {
	cs := C.CString(socket)
	defer free(cs)
	res := (*C.struct_gf_step_result)(C.calloc(1, C.sizeof_struct_gf_step_result))
	defer C.free(unsafe.Pointer(res))
	code, text = call(func(err *C.char, n C.size_t) C.int {
		return C.gf_client_step_channel(cs, ms(timeout), C.uint32_t(jobID), C.uint32_t(stepID), res, err, n)
	})
	if res.has_channel != 0 {
		c := uint32(res.channel)
		channel = &c
	}
	return channel, code, text
}

// TaskConnect runs gf_client_task_connect; fd is the connected socket
// (-1 on failure), for TaskBind.
func TaskConnect(socket string, timeout time.Duration) (fd int, code int, text string) {
	cs := C.CString(socket)
	defer free(cs)
	cfd := (*C.int)(C.malloc(C.sizeof_int))
	defer C.free(unsafe.Pointer(cfd))
	code, text = call(func(err *C.char, n C.size_t) C.int {
		return C.gf_client_task_connect(cs, ms(timeout), cfd, err, n)
	})
	return int(*cfd), code, text
}

// TaskBind runs gf_client_task_bind on fd (which it closes); visible nil:
// CUDA_VISIBLE_DEVICES unset.
func TaskBind(fd int, timeout time.Duration, jobID, stepID, taskID uint32, visible *string) (gpus []uint32, code int, text string) {
	cv := cstr(visible)
	defer free(cv)
	res := (*C.struct_gf_task_result)(C.calloc(1, C.sizeof_struct_gf_task_result))
	defer C.free(unsafe.Pointer(res))
	code, text = call(func(err *C.char, n C.size_t) C.int {
		return C.gf_client_task_bind(C.int(fd), ms(timeout), C.uint32_t(jobID), C.uint32_t(stepID), C.uint32_t(taskID), cv, res, err, n)
	})
	for i := 0; i < int(res.ngpus); i++ {
		gpus = append(gpus, uint32(res.gpus[i]))
	}
	return gpus, code, text
}

// frame runs an encoder into a malloc'd buffer of capacity bytes; ok is
// false when the encoder said it does not fit.
func frame(capacity int, enc func(buf *C.uint8_t, n C.size_t) C.int) (b []byte, ok bool) {
	buf := (*C.uint8_t)(C.malloc(C.size_t(max(capacity, 1))))
	defer C.free(unsafe.Pointer(buf))
	n := enc(buf, C.size_t(capacity))
	if n < 0 {
		return nil, false
	}
	return C.GoBytes(unsafe.Pointer(buf), n), true
}

// JobPrologFrame runs gf_wire_job_prolog with room for capacity bytes.
func JobPrologFrame(capacity int, jobID, uid uint32, jobGPUs *string) ([]byte, bool) {
	cg := cstr(jobGPUs)
	defer free(cg)
	return frame(capacity, func(buf *C.uint8_t, n C.size_t) C.int {
		return C.gf_wire_job_prolog(buf, n, C.uint32_t(jobID), C.uint32_t(uid), cg)
	})
}

// JobEpilogFrame runs gf_wire_job_epilog.
func JobEpilogFrame(capacity int, jobID uint32) ([]byte, bool) {
	return frame(capacity, func(buf *C.uint8_t, n C.size_t) C.int {
		return C.gf_wire_job_epilog(buf, n, C.uint32_t(jobID))
	})
}

// StepStartFrame runs gf_wire_step_start.
func StepStartFrame(capacity int, jobID, stepID, uid uint32, stepGPUs *string, pids []uint32) ([]byte, bool) {
	cg := cstr(stepGPUs)
	defer free(cg)
	var cp *C.uint32_t
	if len(pids) > 0 {
		cp = (*C.uint32_t)(C.malloc(C.size_t(4 * len(pids))))
		defer C.free(unsafe.Pointer(cp))
		copy(unsafe.Slice((*uint32)(unsafe.Pointer(cp)), len(pids)), pids)
	}
	return frame(capacity, func(buf *C.uint8_t, n C.size_t) C.int {
		return C.gf_wire_step_start(buf, n, C.uint32_t(jobID), C.uint32_t(stepID), C.uint32_t(uid), cg, cp, C.int(len(pids)))
	})
}

// StepChannelFrame runs gf_wire_step_channel.
func StepChannelFrame(capacity int, jobID, stepID uint32) ([]byte, bool) {
	return frame(capacity, func(buf *C.uint8_t, n C.size_t) C.int {
		return C.gf_wire_step_channel(buf, n, C.uint32_t(jobID), C.uint32_t(stepID))
	})
}

// TaskBindFrame runs gf_wire_task_bind.
func TaskBindFrame(capacity int, jobID, stepID, taskID uint32, visible *string) ([]byte, bool) {
	cv := cstr(visible)
	defer free(cv)
	return frame(capacity, func(buf *C.uint8_t, n C.size_t) C.int {
		return C.gf_wire_task_bind(buf, n, C.uint32_t(jobID), C.uint32_t(stepID), C.uint32_t(taskID), cv)
	})
}

// Response is struct gf_response.
type Response struct {
	Error       string
	GPUs        []uint32
	GPUsTotal   int
	SlurmLocal  bool
	StepCgroup  string
	IMEXPending bool
	Channel     *uint32
	TaskBind    bool
}

// ParseResponse runs gf_wire_parse_response on a malloc'd copy of b; ok is
// false when C refused it.
func ParseResponse(b []byte) (r Response, ok bool) {
	buf := C.malloc(C.size_t(max(len(b), 1)))
	defer C.free(buf)
	if len(b) > 0 {
		C.memcpy(buf, unsafe.Pointer(&b[0]), C.size_t(len(b)))
	}
	cr := (*C.struct_gf_response)(C.calloc(1, C.sizeof_struct_gf_response))
	defer C.free(unsafe.Pointer(cr))
	if C.gf_wire_parse_response((*C.uint8_t)(buf), C.size_t(len(b)), cr) != 0 {
		return r, false
	}
	r.Error = C.GoStringN(cr.error, C.int(cr.error_len))
	for i := 0; i < int(cr.ngpus); i++ {
		r.GPUs = append(r.GPUs, uint32(cr.gpus[i]))
	}
	r.GPUsTotal = int(cr.gpus_total)
	r.SlurmLocal = cr.slurm_local != 0
	r.StepCgroup = C.GoStringN(cr.step_cgroup, C.int(cr.step_cgroup_len))
	r.IMEXPending = cr.imex_pending != 0
	r.TaskBind = cr.task_bind != 0
	if cr.has_channel != 0 {
		c := uint32(cr.channel)
		r.Channel = &c
	}
	return r, true
}
