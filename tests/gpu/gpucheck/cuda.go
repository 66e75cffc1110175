// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

// The CUDA driver API, declared by hand so no CUDA headers are needed:
// libcuda.so.1 ships with the NVIDIA driver, the toolkit need not be there.
typedef int (*cu_init_t)(unsigned int);
typedef int (*cu_count_t)(int *);
typedef int (*cu_get_t)(int *, int);
typedef int (*cu_uuid_t)(unsigned char *, int);
typedef int (*cu_ctx_create_t)(void **, unsigned int, int);
typedef int (*cu_ctx_destroy_t)(void *);
typedef int (*cu_alloc_t)(unsigned long long *, size_t);
typedef int (*cu_free_t)(unsigned long long);

#define GPUCHECK_MAX_DEV 16

struct cuda_result {
	int loaded;     // libcuda.so.1 and its symbols found
	int init;       // cuInit's CUresult
	int count;      // cuDeviceGetCount
	int count_rc;
	unsigned char uuid[GPUCHECK_MAX_DEV][16];
	int nuuid;
	int ctx;        // cuCtxCreate on device 0; -1 when not tried
	int alloc;      // cuMemAlloc of 1 MiB there; -1 when not tried
};

static struct cuda_result cuda_probe(void) {
	struct cuda_result r;
	memset(&r, 0, sizeof r);
	r.ctx = r.alloc = -1;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return r;
	cu_init_t init = (cu_init_t)dlsym(h, "cuInit");
	cu_count_t count = (cu_count_t)dlsym(h, "cuDeviceGetCount");
	cu_get_t get = (cu_get_t)dlsym(h, "cuDeviceGet");
	cu_uuid_t uuid = (cu_uuid_t)dlsym(h, "cuDeviceGetUuid");
	cu_ctx_create_t ctx_create = (cu_ctx_create_t)dlsym(h, "cuCtxCreate_v2");
	cu_ctx_destroy_t ctx_destroy = (cu_ctx_destroy_t)dlsym(h, "cuCtxDestroy_v2");
	cu_alloc_t alloc = (cu_alloc_t)dlsym(h, "cuMemAlloc_v2");
	cu_free_t mfree = (cu_free_t)dlsym(h, "cuMemFree_v2");
	if (!init || !count || !get || !uuid || !ctx_create || !ctx_destroy || !alloc || !mfree)
		return r;
	r.loaded = 1;
	r.init = init(0);
	if (r.init != 0)
		return r;
	r.count_rc = count(&r.count);
	if (r.count_rc != 0)
		return r;
	for (int i = 0; i < r.count && i < GPUCHECK_MAX_DEV; i++) {
		int dev;
		if (get(&dev, i) == 0 && uuid(r.uuid[r.nuuid], dev) == 0)
			r.nuuid++;
	}
	if (r.count > 0) {
		int dev;
		void *ctx = NULL;
		if (get(&dev, 0) == 0) {
			r.ctx = ctx_create(&ctx, 0, dev);
			if (r.ctx == 0) {
				unsigned long long p = 0;
				r.alloc = alloc(&p, 1 << 20);
				if (r.alloc == 0)
					mfree(p);
				ctx_destroy(ctx);
			}
		}
	}
	return r;
}
*/
import "C"

import "fmt"

// cudaResult is what CUDA could do in the probing process.
type cudaResult struct {
	Loaded bool     `json:"loaded"`
	Init   int      `json:"init"`
	Count  int      `json:"count"`
	UUIDs  []string `json:"uuids"`
	Ctx    int      `json:"ctx"`
	Alloc  int      `json:"alloc"`
}

// probeCUDA initializes CUDA, lists the devices it can open and allocates
// 1 MiB on the first: using a GPU, not only finding it.
func probeCUDA() cudaResult {
	r := C.cuda_probe()
	out := cudaResult{Loaded: r.loaded != 0, Init: int(r.init), Count: int(r.count), Ctx: int(r.ctx), Alloc: int(r.alloc), UUIDs: []string{}}
	for i := 0; i < int(r.nuuid); i++ {
		var b [16]byte
		for j := range b {
			b[j] = byte(r.uuid[i][j])
		}
		out.UUIDs = append(out.UUIDs, fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]))
	}
	return out
}
