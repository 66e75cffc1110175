/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * The few types and constants of the kernel's UAPI (include/uapi/linux/bpf.h,
 * Linux 6.1, identical since 4.19 for everything below) that gpufence's BPF
 * programs use. Kept here so that generating the programs does not depend on
 * the host's kernel headers. See LICENSE.GPL-2.0-WITH-Linux-syscall-note.
 */
#ifndef __GPUFENCE_UAPI_H__
#define __GPUFENCE_UAPI_H__

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_CGROUP_STORAGE = 19,
	BPF_MAP_TYPE_RINGBUF = 27,
};

/* BPF_MAP_UPDATE_ELEM flags. */
#define BPF_ANY 0
#define BPF_NOEXIST 1
#define BPF_EXIST 2

/* BPF_MAP_CREATE flags. */
#define BPF_F_NO_PREALLOC (1U << 0)

enum {
	BPF_DEVCG_ACC_MKNOD = (1ULL << 0),
	BPF_DEVCG_ACC_READ = (1ULL << 1),
	BPF_DEVCG_ACC_WRITE = (1ULL << 2),
};

enum {
	BPF_DEVCG_DEV_BLOCK = (1ULL << 0),
	BPF_DEVCG_DEV_CHAR = (1ULL << 1),
};

struct bpf_cgroup_dev_ctx {
	/* access_type encoded as (BPF_DEVCG_ACC_* << 16) | BPF_DEVCG_DEV_* */
	__u32 access_type;
	__u32 major;
	__u32 minor;
};

struct bpf_cgroup_storage_key {
	__u64 cgroup_inode_id; /* cgroup inode id */
	__u32 attach_type;     /* program attach type (enum bpf_attach_type) */
};

#endif /* __GPUFENCE_UAPI_H__ */
