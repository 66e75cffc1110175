// SPDX-License-Identifier: Apache-2.0

// Package cspool runs the C SPANK plugin's fail-open spool writer
// (spank/plugin/spool.c: the JSON line and its append) in Go tests,
// compiled here from the plugin's own files (symbolic links, so that Go's
// build cache sees every change to them) with the plugin's warnings. It
// exists for the tests and fuzz target that hold the C line to
// encoding/json and to the agent's reader (agent/failopen); nothing else
// imports it.
//
// Every buffer handed to C is allocated to its exact size with malloc, so a
// run under `go test -asan` catches an overrun at once. C strings end at the
// first NUL, so C sees a Go string only up to there.
package cspool

/*
#cgo CFLAGS: -std=gnu11 -O1 -g -Wall -Wextra -Werror -Wno-unused-parameter -DGF_SPOOL_TEST_STALL
#include <stdlib.h>
#include <time.h>
#include "spool.h"

// The writer's stall points: when stall_us is set, a pseudo-random pause
// of up to that many microseconds, as a preempted slurmstepd would take.
static volatile int stall_us;
static __thread unsigned stall_seed = 1;

void gf_spool_test_stall(void)
{
	struct timespec t;

	if (stall_us <= 0)
		return;
	stall_seed = stall_seed * 1103515245u + 12345u;
	t.tv_sec = 0;
	t.tv_nsec = (long)((stall_seed >> 8) % (unsigned)stall_us) * 1000;
	nanosleep(&t, NULL);
}

static void set_stall(int us) { stall_us = us; }
*/
import "C"

import (
	"errors"
	"unsafe"
)

// LineMax is GF_SPOOL_LINE_MAX: the longest line, its newline included.
const LineMax = C.GF_SPOOL_LINE_MAX

// Rec is struct gf_spool_rec.
type Rec struct {
	Time   string
	JobID  uint32
	Step   string
	UID    uint32
	Node   string
	Reason string
}

// Line runs gf_spool_line on rec with a buffer of exactly LineMax bytes.
func Line(rec Rec) string {
	strs := []*C.char{C.CString(rec.Time), C.CString(rec.Step), C.CString(rec.Node), C.CString(rec.Reason)}
	for _, p := range strs {
		defer C.free(unsafe.Pointer(p))
	}
	r := (*C.struct_gf_spool_rec)(C.malloc(C.size_t(unsafe.Sizeof(C.struct_gf_spool_rec{}))))
	defer C.free(unsafe.Pointer(r))
	*r = C.struct_gf_spool_rec{time: strs[0], job_id: C.uint32_t(rec.JobID), step: strs[1], uid: C.uint32_t(rec.UID), node: strs[2], reason: strs[3]}
	buf := (*C.char)(C.malloc(LineMax))
	defer C.free(unsafe.Pointer(buf))
	n := C.gf_spool_line(buf, LineMax, r)
	if n < 0 {
		return ""
	}
	return C.GoStringN(buf, n)
}

// SetStall makes each writer pause for up to us microseconds after its open
// and after its lock (0: no pause), so a test sees what a writer preempted
// there does while the agent ingests.
func SetStall(us int) { C.set_stall(C.int(us)) }

const errLen = 512

// Append runs gf_spool_append; the error is the plugin's message.
func Append(path string, jobID uint32, step string, uid uint32, reason string) error {
	cp, cs, cr := C.CString(path), C.CString(step), C.CString(reason)
	defer C.free(unsafe.Pointer(cp))
	defer C.free(unsafe.Pointer(cs))
	defer C.free(unsafe.Pointer(cr))
	e := (*C.char)(C.calloc(errLen, 1))
	defer C.free(unsafe.Pointer(e))
	if C.gf_spool_append(cp, C.uint32_t(jobID), cs, C.uint32_t(uid), cr, e, errLen) != 0 {
		return errors.New(C.GoString(e))
	}
	return nil
}
