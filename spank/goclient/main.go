// SPDX-License-Identifier: Apache-2.0

// Command goclient is built with -buildmode=c-shared into spank_gpufence_go.so,
// the part of the gpufence SPANK plugin that writes the fail-open spool. The
// C entry (spank/plugin) speaks to the agent itself and dlopen()s this
// library, in a child process forked for the call, only for a step that
// failure=open lets run without the agent: no Go runtime starts in srun,
// sbatch, salloc, slurmd or slurmstepd for any other step.
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
	"unicode/utf8"
	"unsafe"
)

// Return codes, from the shared header.
const (
	codeOK      = C.GPUFENCE_OK
	codeInvalid = C.GPUFENCE_E_INVALID
	abiVersion  = C.GPUFENCE_GO_ABI
)

func main() {}

//export gpufence_abi_version
func gpufence_abi_version() C.int { return abiVersion }

//export gpufence_spool_failopen
func gpufence_spool_failopen(spool *C.char, jobID C.uint32_t, stepID *C.char, uid C.uint32_t,
	reason *C.char, errBuf *C.char, errLen C.int) C.int {
	rec := newFailOpen(uint32(jobID), C.GoString(stepID), uint32(uid), C.GoString(reason))
	err := appendFailOpen(C.GoString(spool), rec)
	if err == nil {
		return codeOK
	}
	if errBuf != nil && errLen > 0 {
		putText(unsafe.Slice((*byte)(unsafe.Pointer(errBuf)), int(errLen)), err.Error())
	}
	return codeInvalid
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
