// SPDX-License-Identifier: Apache-2.0

// Package cparse runs the C SPANK plugin's parsers in a Go test: the GPU
// index list and renumbering (spank/plugin/renumber.c) and the plugstack
// arguments (spank/plugin/args.c), compiled here from the plugin's own files
// (symbolic links, so that Go's build cache sees every change to them) with
// the plugin's warnings. It exists for the tests and fuzz targets that hold
// the C parsers to the Go ones; nothing else imports it.
//
// Every buffer handed to C is allocated to its exact size with malloc, so a
// run under `go test -asan` (make fuzz does that) catches an overrun at once.
// C strings end at the first NUL, so C sees a Go string only up to there.
package cparse

/*
#cgo CFLAGS: -std=gnu11 -O1 -g -Wall -Wextra -Werror -Wno-unused-parameter
#include <stdlib.h>
#include "args.h"
#include "renumber.h"
*/
import "C"

import (
	"errors"
	"strings"
	"unsafe"
)

// Constants of renumber.h.
const (
	MaxGPUIndex = C.GF_MAX_GPU_INDEX
	SlurmLocal  = C.GF_RENUMBER_SLURM_LOCAL
	ListFromEnv = C.GF_RENUMBER_LIST_FROM_ENV
)

// ParseGPUList runs gf_parse_gpu_list with room for capacity entries. ok is
// false when C refused s.
func ParseGPUList(s string, capacity int) (gpus []uint32, ok bool) {
	cs := C.CString(s)
	defer C.free(unsafe.Pointer(cs))
	out := (*C.uint32_t)(C.malloc(C.size_t(max(capacity, 1)) * 4))
	defer C.free(unsafe.Pointer(out))
	n := int(C.gf_parse_gpu_list(cs, out, C.int(capacity)))
	if n < 0 {
		return nil, false
	}
	gpus = make([]uint32, n)
	copy(gpus, unsafe.Slice((*uint32)(unsafe.Pointer(out)), n))
	return gpus, true
}

// Result is gf_renumber's answer.
type Result int

// gf_renumber's results.
const (
	Error Result = C.GF_RENUMBER_ERROR
	Keep  Result = C.GF_RENUMBER_KEEP
	Set   Result = C.GF_RENUMBER_SET
)

func (r Result) String() string {
	switch r {
	case Error:
		return "ERROR"
	case Keep:
		return "KEEP"
	case Set:
		return "SET"
	}
	return "result(?)"
}

// Renumber runs gf_renumber on value (nil: the variable is unset) with an
// output buffer of outlen bytes. out is the buffer's string when Set.
func Renumber(value *string, gpus []uint32, flags int, outlen int) (r Result, out string) {
	var cv *C.char
	if value != nil {
		cv = C.CString(*value)
		defer C.free(unsafe.Pointer(cv))
	}
	var cg *C.uint32_t
	if len(gpus) > 0 {
		cg = (*C.uint32_t)(C.malloc(C.size_t(len(gpus)) * 4))
		defer C.free(unsafe.Pointer(cg))
		copy(unsafe.Slice((*uint32)(unsafe.Pointer(cg)), len(gpus)), gpus)
	}
	buf := (*C.char)(C.malloc(C.size_t(max(outlen, 1))))
	defer C.free(unsafe.Pointer(buf))
	r = Result(C.gf_renumber(cv, cg, C.int(len(gpus)), C.int(flags), buf, C.size_t(outlen)))
	if r == Set {
		out = C.GoStringN(buf, C.int(cStrlen(buf, outlen)))
	}
	return r, out
}

// cStrlen is strlen bounded by the buffer, so that a missing NUL is seen
// as a full buffer rather than read past.
func cStrlen(p *C.char, n int) int {
	b := unsafe.Slice((*byte)(unsafe.Pointer(p)), n)
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return i
	}
	return n
}

// Config is struct gf_config.
type Config struct {
	Socket   string
	TimeoutS int
	FailOpen bool
	Spool    string
}

// Lengths of struct gf_config's buffers, NUL included.
const (
	SocketSize = len(C.struct_gf_config{}.socket)
	PathSize   = len(C.struct_gf_config{}.spool)
)

// ConfigParse runs gf_config_parse on the plugstack arguments args with an
// error buffer of errlen bytes. The error is the administrator's message.
func ConfigParse(args []string, errlen int) (Config, error) {
	av := (**C.char)(C.malloc(C.size_t(max(len(args), 1)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(unsafe.Pointer(av))
	avs := unsafe.Slice(av, max(len(args), 1))
	for i, a := range args {
		avs[i] = C.CString(a)
		defer C.free(unsafe.Pointer(avs[i]))
	}
	cfg := (*C.struct_gf_config)(C.malloc(C.size_t(unsafe.Sizeof(C.struct_gf_config{}))))
	defer C.free(unsafe.Pointer(cfg))
	errbuf := (*C.char)(C.malloc(C.size_t(max(errlen, 1))))
	defer C.free(unsafe.Pointer(errbuf))
	*errbuf = 0
	if C.gf_config_parse(C.int(len(args)), av, cfg, errbuf, C.size_t(errlen)) != 0 {
		return Config{}, errors.New(C.GoStringN(errbuf, C.int(cStrlen(errbuf, errlen))))
	}
	return Config{
		Socket:   cField(cfg.socket[:]),
		TimeoutS: int(cfg.timeout_s),
		FailOpen: cfg.fail_open != 0,
		Spool:    cField(cfg.spool[:]),
	}, nil
}

// cField reads a NUL-terminated char array of struct gf_config.
func cField(a []C.char) string {
	return C.GoStringN(&a[0], C.int(cStrlen(&a[0], len(a))))
}

// ShownArg is GF_ARG_SHOWN: how much of an argument a message quotes.
const ShownArg = C.GF_ARG_SHOWN
