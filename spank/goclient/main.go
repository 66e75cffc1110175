// SPDX-License-Identifier: Apache-2.0

// Command goclient is built with -buildmode=c-shared into spank_gpufence_go.so,
// the part of the gpufence SPANK plugin that speaks to the node agent. The C
// entry (spank/plugin) dlopen()s it only inside slurmstepd and the
// prolog/epilog process, so srun, sbatch and salloc never start a Go runtime,
// and never calls it from a forked task child.
//
// The exported functions take plain C values; their types are declared in
// goclient.h, which both sides compile against (the header lives here so
// that Go's build cache sees it change).
package main

/*
#include <stdint.h>
#include "goclient.h"
*/
import "C"

import (
	"strconv"
	"time"
	"unsafe"
)

// Return codes, from the shared header.
const (
	codeOK          = C.GPUFENCE_OK
	codeRefused     = C.GPUFENCE_E_REFUSED
	codeUnreachable = C.GPUFENCE_E_UNREACHABLE
	codeInvalid     = C.GPUFENCE_E_INVALID
	abiVersion      = C.GPUFENCE_GO_ABI
)

func main() {}

//export gpufence_abi_version
func gpufence_abi_version() C.int { return abiVersion }

//export gpufence_job_prolog
func gpufence_job_prolog(socket *C.char, timeoutMS C.int, jobID, uid C.uint32_t,
	jobGPUs *C.char, errBuf *C.char, errLen C.int) C.int {
	err := jobProlog(C.GoString(socket), millis(timeoutMS), uint32(jobID), uint32(uid), optString(jobGPUs))
	return finish(err, errBuf, errLen)
}

//export gpufence_job_epilog
func gpufence_job_epilog(socket *C.char, timeoutMS C.int, jobID C.uint32_t,
	errBuf *C.char, errLen C.int) C.int {
	err := jobEpilog(C.GoString(socket), millis(timeoutMS), uint32(jobID))
	return finish(err, errBuf, errLen)
}

//export gpufence_step_start
func gpufence_step_start(socket *C.char, timeoutMS C.int, jobID, stepID, uid C.uint32_t,
	stepGPUs *C.char, pids *C.int32_t, npids C.int,
	gpus *C.uint32_t, gpusCap C.int, ngpus *C.int, slurmLocal *C.int, imexPending *C.int,
	stepCgroup *C.char, stepCgroupLen C.int,
	errBuf *C.char, errLen C.int) C.int {
	var taskPIDs []int32
	if pids != nil && npids > 0 {
		taskPIDs = unsafe.Slice((*int32)(unsafe.Pointer(pids)), int(npids))
	}
	var out []uint32
	if gpus != nil && gpusCap > 0 {
		out = unsafe.Slice((*uint32)(unsafe.Pointer(gpus)), int(gpusCap))
	}
	res, err := stepStart(C.GoString(socket), millis(timeoutMS), uint32(jobID), uint32(stepID),
		uint32(uid), optString(stepGPUs), taskPIDs)
	var n int
	if err == nil {
		n, err = putGPUs(out, res.GPUs)
	}
	if err == nil {
		if ngpus != nil {
			*ngpus = C.int(n)
		}
		if slurmLocal != nil {
			*slurmLocal = 0
			if res.SlurmLocalIndices {
				*slurmLocal = 1
			}
		}
		if imexPending != nil {
			*imexPending = 0
			if res.IMEXPending {
				*imexPending = 1
			}
		}
		if stepCgroup != nil && stepCgroupLen > 0 {
			dst := unsafe.Slice((*byte)(unsafe.Pointer(stepCgroup)), int(stepCgroupLen))
			if len(res.StepCgroup) >= len(dst) {
				err = invalid("step cgroup path longer than " + strconv.Itoa(len(dst)-1) + " bytes")
			} else {
				putText(dst, res.StepCgroup)
			}
		}
	}
	return finish(err, errBuf, errLen)
}

//export gpufence_step_channel
func gpufence_step_channel(socket *C.char, timeoutMS C.int, jobID, stepID C.uint32_t,
	hasChannel *C.int, channel *C.uint32_t, errBuf *C.char, errLen C.int) C.int {
	c, err := stepChannel(C.GoString(socket), millis(timeoutMS), uint32(jobID), uint32(stepID))
	if err == nil && hasChannel != nil && channel != nil {
		*hasChannel, *channel = 0, 0
		if c != nil {
			*hasChannel, *channel = 1, C.uint32_t(*c)
		}
	}
	return finish(err, errBuf, errLen)
}

//export gpufence_step_end
func gpufence_step_end(socket *C.char, timeoutMS C.int, jobID, stepID C.uint32_t,
	errBuf *C.char, errLen C.int) C.int {
	err := stepEnd(C.GoString(socket), millis(timeoutMS), uint32(jobID), uint32(stepID))
	return finish(err, errBuf, errLen)
}

//export gpufence_spool_failopen
func gpufence_spool_failopen(spool *C.char, jobID C.uint32_t, stepID *C.char, uid C.uint32_t,
	reason *C.char, errBuf *C.char, errLen C.int) C.int {
	rec := newFailOpen(uint32(jobID), C.GoString(stepID), uint32(uid), C.GoString(reason))
	return finish(appendFailOpen(C.GoString(spool), rec), errBuf, errLen)
}

// finish writes err's text into the caller's buffer and returns its code.
func finish(err error, errBuf *C.char, errLen C.int) C.int {
	code, text := outcome(err)
	if errBuf != nil && errLen > 0 {
		putText(unsafe.Slice((*byte)(unsafe.Pointer(errBuf)), int(errLen)), text)
	}
	return C.int(code)
}

func optString(s *C.char) *string {
	if s == nil {
		return nil
	}
	v := C.GoString(s)
	return &v
}

func millis(ms C.int) time.Duration { return time.Duration(ms) * time.Millisecond }
