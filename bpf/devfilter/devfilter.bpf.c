//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// gpufence device filter: a BPF_PROG_TYPE_CGROUP_DEVICE program that narrows
// access to GPU-class devices (char devices of the NVIDIA major, minors 0..253,
// access to GPU-class devices (char devices of the NVIDIA major, minors 0..253,
// of the nvidia-caps major, whose minors grant MIG instances, and of the IMEX
// channel major, one channel per policy) by the Slurm job a task runs in, and
// denies the NVSwitch and NVLink management nodes (the nvidia-nvswitch and
// nvidia-nvlink majors, every minor: only the fabric manager uses them) to
// everything but allow-all entries. Every other device is allowed, always, so
// the filter never fights systemd, Slurm or a container runtime.
//
// Two programs share one decision function; the loader loads only one:
//
// devfilter_scope (needs bpf_get_current_ancestor_cgroup_id for this program
// type, which Linux 6.1 offers): attached once, with BPF_F_ALLOW_MULTI, on the
// slurmstepd scope cgroup, and beside it on slurmd's own cgroup when that
// is outside the scope (systemd's slurmd.service). The policy of a task is
// looked up in the `policies` hash by the id of its ancestor at scope level
// + 4 (Slurm's task cgroup: an entry there only with task_binding: slurm),
// then at scope level + 2 (the step), then at scope level + 1 (the job, or
// `system`/`slurmd`), then by its own cgroup's id (slurmd.service). No
// entry: no GPU.
//
// devfilter_cgroup (fallback, Linux >= 5.12: ring buffer, and atomic
// fetch-and-add for the rate limit, built with -mcpu=v3): attached with
// BPF_F_ALLOW_MULTI to each cgroup that gets a policy, the policy kept in the
// attachment's cgroup storage. Nothing sits on the scope in this mode, so a
// job cgroup that was never registered is NOT narrowed by the kernel; the
// SPANK plugin refuses to start steps it could not register instead.
// Storage is zeroed between attach and the first write: no GPU in between.
//
// Audit: every denied access (or, in audit-only mode, every access that
// would have been denied, which is then allowed) is reported through the
// `events` ring buffer, and allowed accesses as `audit_allowed` says. Reports
// are rate-limited per cgroup + device + decision in `rate`; every access
// that is not reported is counted there or, when `rate` is full, by decision
// in `rate_full`, so events + suppressed + rate_full + lost add up exactly to
// the accesses, and a flood over more keys than `rate` holds sends nothing
// more to the agent. When the ring buffer is full, `lost` counts the event
// and the decision stands: enforcement never depends on the audit path.
//
// Both programs read the task (bpf_get_current_task, bpf_probe_read_kernel:
// offered to every program type for a CAP_PERFMON loader) for the process
// and the program it runs at the access: pid, comm, the executable's inode
// and device, and the process's start time, which the agent checks against
// /proc/<pid> when it reads the event later.

#include "uapi.h"
#include "bpf_helpers.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define POLICY_ALLOW_ALL (1U << 0)
// A cgroup whose job the agent adopted without slurmctld confirming its GPUs
// (adopt_unconfirmed: audit-only): what it may not open is reported as
// would-deny and allowed, for that cgroup alone.
#define POLICY_AUDIT_ONLY (1U << 1)
// With POLICY_ALLOW_ALL: the entry allows everything only to a task whose
// real and effective uids are both 0; any other task of the cgroup gets
// what the bitmaps grant (an exempt entry's are empty: nothing). Slurm's
// own cgroups (system, slurmd) keep every device for root (slurmd's NVML,
// slurmstepd's --gpu-freq), not for a child slurmd made the user's, such
// as the one that opens an sbcast destination with setresuid(uid, uid, -1).
// A program of an older layout ignores the bit: the entry is allow-all to
// every task there, as it was.
#define POLICY_ROOT_ONLY (1U << 2)

// Minors 254 (nvidia-modeset) and 255 (nvidiactl) are needed by every CUDA
// process and are never narrowed.
#define GPU_MINOR_MAX 253

// nvidia-caps minors (the driver's table, /proc/driver/nvidia-caps/mig-minors):
// 0 nvlink fabric-mgmt, 1 mig config (create/destroy instances), 2 mig
// monitor (see every instance), then per GPU 0..31 15 GPU instances, each an
// access minor and 8 compute instance minors: up to 3 + 32 * 135 - 1 = 4322.
// The bitmap holds 0..CAPS_MINOR_MAX; a policy never grants the first three
// (only allow-all entries open them), nor anything above the bitmap.
#define CAPS_WORDS 68
#define CAPS_MINOR_MAX (CAPS_WORDS * 64 - 1)
#define CAPS_MINOR_FIRST_ACCESS 3

enum device_class {
	CLASS_OTHER = 0,
	CLASS_GPU = 1,
	CLASS_CAPS = 2,
	// NVSwitch and NVLink management nodes: no policy grants them.
	CLASS_FABRIC = 3,
	// IMEX channels: a policy grants at most one.
	CLASS_IMEX = 4,
};

enum decision {
	DECISION_DENIED = 1,
	DECISION_ALLOWED = 2,
	// Audit-only mode: allowed, but the policy would have denied it.
	DECISION_WOULD_DENY = 3,
};

enum audit_allowed {
	AUDIT_ALLOWED_NONE = 0,
	// Only the first allowed access per cgroup + device is reported; the
	// others are counted as suppressed.
	AUDIT_ALLOWED_FIRST = 1,
	AUDIT_ALLOWED_ALL = 2,
};

struct filter_config {
	// Level of the scope cgroup below the cgroup2 root (root is 0).
	__u32 scope_level;
	__u32 nvidia_major;
	// Non-zero: allow everything, report would-be denials.
	__u32 audit_only;
	__u32 audit_allowed;
	__u64 rate_window_ns;
	// Events per rate key and window; the rest are counted as suppressed.
	__u32 rate_burst;
	// Char major of /dev/nvidia-caps/nvidia-cap*; 0: unknown, not narrowed.
	// (It took the place of padding, so the map kept its size then.)
	__u32 caps_major;
	// Char majors of /dev/nvidia-nvswitchctl and /dev/nvidia-nvswitchN
	// (nvidia-nvswitch) and of /dev/nvidia-nvlink (nvidia-nvlink); 0: not
	// narrowed (the driver has none, or the agent allows them). Added at
	// the end: the config map of an older program is replaced, not adopted.
	__u32 nvswitch_major;
	__u32 nvlink_major;
	// Char major of /dev/nvidia-caps-imex-channels/channel*
	// ("nvidia-caps-imex-channels" in /proc/devices, or Slurm's
	// imex_dev_major); 0: not narrowed. Added after the management majors
	// (the 40-byte layout), so that a config map of each older layout is a
	// prefix of this one; it too is replaced on upgrade, not adopted.
	__u32 imex_major;
	__u32 _pad;
};

struct policy {
	// The cgroup this policy belongs to; in the fallback program the only
	// way to know it, since it cannot ask the kernel.
	__u64 cgroup_id;
	__u32 flags;
	// The one IMEX channel the cgroup may open, plus one (0: none). It took
	// the place of padding: an older entry reads as no channel.
	__u32 imex_channel;
	// Allowed minors of the NVIDIA major, bit n of minors[n/64].
	__u64 minors[4];
	// Allowed minors of the nvidia-caps major, bit n of caps[n/64]. Added
	// after minors so that an entry of the older layout, zero-extended, is
	// the same policy.
	__u64 caps[CAPS_WORDS];
};

struct event {
	__u64 cgroup_id;
	__u64 ktime_ns;
	__u32 pid;
	__u32 tgid;
	__u32 uid;
	__u32 gid;
	__u32 major;
	__u32 minor;
	__u16 access;
	__u8 decision;
	__u8 _pad1;
	char comm[16];
	__u32 _pad2;
	// suppressed_total of the event's rate key when it was emitted.
	__u64 suppressed;
	// Added after the first layout (72 bytes), whose records decode with
	// these zero. The program the task ran at the access: inode number of
	// mm->exe_file and the kernel dev_t of its superblock (major << 20 |
	// minor); 0 when unknown (no mm, a read failed).
	__u64 exe_ino;
	__u32 exe_dev;
	__u32 _pad3;
	// Start of the thread group leader, ns of CLOCK_BOOTTIME (what
	// /proc/<pid>/stat shows in clock ticks): tells a reused pid apart.
	__u64 start_boottime;
};

struct rate_key {
	__u64 cgroup_id;
	__u32 major;
	__u32 minor;
	__u32 decision;
	__u32 _pad;
};

struct rate_value {
	__u64 window_start_ns;
	// Accesses of the key since window_start_ns, reported or not.
	__u64 in_window;
	// Accesses of the key never reported, since the entry was created.
	__u64 suppressed_total;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct filter_config);
} config SEC(".maps");

// Not preallocated: a value is ~600 bytes, and a node holds tens of entries,
// not 16384.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, struct policy);
} policies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_STORAGE);
	__type(key, struct bpf_cgroup_storage_key);
	__type(value, struct policy);
} storage SEC(".maps");

// Not LRU: an evicted entry would take its suppressed count with it. The
// agent deletes the entries of cgroups that are gone.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct rate_key);
	__type(value, struct rate_value);
} rate SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

// Events the ring buffer had no room for, per CPU.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

// Accesses neither reported nor counted under a key because `rate` was
// full, per CPU, by decision (the index). Its first layout (one entry)
// counted events reported without rate limit: the size differs, so an
// upgrade starts this count afresh.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} rate_full SEC(".maps");

// Only the fields the programs read; CO-RE relocates them against the
// running kernel's BTF.
struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct mm_struct {
	struct file *exe_file;
} __attribute__((preserve_access_index));

// kuid_t: CO-RE matches the member by name and kind (a struct of one
// __u32), not by the typedef's name.
struct cred {
	struct {
		__u32 val;
	} euid;
} __attribute__((preserve_access_index));

struct task_struct {
	const struct cred *cred;
	int pid;
	int tgid;
	char comm[16];
	struct mm_struct *mm;
	struct task_struct *group_leader;
	__u64 start_boottime;
} __attribute__((preserve_access_index));

// Force the types the Go side needs into BTF for bpf2go -type.
const struct event *unused_event __attribute__((unused));
const enum decision *unused_decision __attribute__((unused));
const enum audit_allowed *unused_audit_allowed __attribute__((unused));
const struct rate_key *unused_rate_key __attribute__((unused));
const struct rate_value *unused_rate_value __attribute__((unused));

// classify returns the class of a device as gpufence narrows it.
static __always_inline int classify(const struct bpf_cgroup_dev_ctx *ctx,
				    const struct filter_config *cfg)
{
	if ((ctx->access_type & 0xffff) != BPF_DEVCG_DEV_CHAR)
		return CLASS_OTHER;
	if (ctx->major == cfg->nvidia_major && ctx->minor <= GPU_MINOR_MAX)
		return CLASS_GPU;
	if (cfg->caps_major && ctx->major == cfg->caps_major)
		return CLASS_CAPS;
	if (cfg->nvswitch_major && ctx->major == cfg->nvswitch_major)
		return CLASS_FABRIC;
	if (cfg->nvlink_major && ctx->major == cfg->nvlink_major)
		return CLASS_FABRIC;
	if (cfg->imex_major && ctx->major == cfg->imex_major)
		return CLASS_IMEX;
	return CLASS_OTHER;
}

// imex_allowed decides an access of an IMEX channel (minor = channel id):
// only the policy's own channel opens. Creating a node (mknod alone) is
// allowed: slurmstepd makes the job's channel node in the step's cgroup
// before the agent has learned which channel it is, and only root (real
// CAP_MKNOD) can make device nodes at all; a node grants nothing until it
// is opened, which this decides.
static __always_inline int imex_allowed(const struct policy *p, __u32 minor,
					__u32 access_type)
{
	if ((access_type >> 16) == BPF_DEVCG_ACC_MKNOD)
		return 1;
	return p->imex_channel && p->imex_channel - 1 == minor;
}

// task_is_root says whether the current task's real and effective uids
// are both 0 (in the initial user namespace, as the helper reports them).
// The real uid comes from the helper; the effective one from the task's
// credentials, since a root process that switched only its euid (seteuid)
// acts for that user. A failed read counts as not root.
static __always_inline int task_is_root(void)
{
	struct task_struct *task;
	const struct cred *cred = 0;
	__u32 euid = 1;

	if ((__u32)bpf_get_current_uid_gid() != 0)
		return 0;
	task = (struct task_struct *)bpf_get_current_task();
	if (bpf_probe_read_kernel(&cred, sizeof(cred), &task->cred) || !cred)
		return 0;
	if (bpf_probe_read_kernel(&euid, sizeof(euid), &cred->euid))
		return 0;
	return euid == 0;
}

static __always_inline int allowed(const struct policy *p, int class,
				   __u32 minor, __u32 access_type)
{
	if (!p)
		return 0;
	if ((p->flags & POLICY_ALLOW_ALL) &&
	    (!(p->flags & POLICY_ROOT_ONLY) || task_is_root()))
		return 1;
	if (class == CLASS_IMEX)
		return imex_allowed(p, minor, access_type);
	if (class == CLASS_GPU) {
		if (minor > GPU_MINOR_MAX)
			return 0;
		return (p->minors[minor >> 6] >> (minor & 63)) & 1;
	}
	if (class == CLASS_FABRIC)
		return 0;
	if (minor < CAPS_MINOR_FIRST_ACCESS || minor > CAPS_MINOR_MAX)
		return 0;
	return (p->caps[minor >> 6] >> (minor & 63)) & 1;
}

// count_per_cpu adds one to entry key of a per-CPU counter. Atomically: a
// cgroup program runs with migration, not preemption, disabled, so two runs
// can interleave on one CPU.
static __always_inline void count_per_cpu(void *map, __u32 key)
{
	__u64 *n = bpf_map_lookup_elem(map, &key);

	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline const struct filter_config *get_config(void)
{
	__u32 key = 0;

	return bpf_map_lookup_elem(&config, &key);
}

// rate_limit decides whether to report an access of key: 1, with *suppressed
// set to the key's suppressed total, or 0 after counting it as suppressed
// (under its key, or in rate_full when the map has no room for the key).
// Each access lands in exactly one of "reported" and "suppressed"; races
// between CPUs can only move a window boundary or let a window report a few
// more than the burst, never lose a count.
static __always_inline int rate_limit(const struct filter_config *cfg,
				      struct rate_key *key, int first_only,
				      __u64 *suppressed)
{
	struct rate_value *v, nv;
	__u64 now = bpf_ktime_get_ns();

	*suppressed = 0;
	v = bpf_map_lookup_elem(&rate, key);
	if (!v) {
		nv.window_start_ns = now;
		nv.in_window = 1;
		nv.suppressed_total = 0;
		if (bpf_map_update_elem(&rate, key, &nv, BPF_NOEXIST) == 0)
			return 1;
		// Another CPU created it meanwhile, or the map is full. Full: the
		// access is counted, never reported unthrottled, so that a flood
		// over more keys than the map holds costs the agent nothing.
		v = bpf_map_lookup_elem(&rate, key);
		if (!v) {
			count_per_cpu(&rate_full, key->decision);
			return 0;
		}
	}
	if (first_only) {
		__sync_fetch_and_add(&v->suppressed_total, 1);
		return 0;
	}
	if (now - v->window_start_ns >= cfg->rate_window_ns) {
		v->window_start_ns = now;
		v->in_window = 0;
	}
	if (__sync_fetch_and_add(&v->in_window, 1) >= cfg->rate_burst) {
		__sync_fetch_and_add(&v->suppressed_total, 1);
		return 0;
	}
	*suppressed = *(volatile __u64 *)&v->suppressed_total;
	return 1;
}

// read_task fills the process fields of e from the current task. Each read
// that fails leaves its field zero: the agent then says what it could not
// verify.
static __always_inline void read_task(struct event *e)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct task_struct *leader = 0;
	struct mm_struct *mm = 0;
	struct file *exe = 0;
	struct inode *inode = 0;
	struct super_block *sb = 0;
	unsigned long ino = 0;

	__builtin_memset(e->comm, 0, sizeof(e->comm));
	e->pid = 0;
	e->tgid = 0;
	e->exe_ino = 0;
	e->exe_dev = 0;
	e->_pad3 = 0;
	e->start_boottime = 0;
	bpf_probe_read_kernel(&e->pid, sizeof(e->pid), &task->pid);
	bpf_probe_read_kernel(&e->tgid, sizeof(e->tgid), &task->tgid);
	if (bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), task->comm) < 0)
		e->comm[0] = 0;
	if (!bpf_probe_read_kernel(&leader, sizeof(leader), &task->group_leader) && leader)
		bpf_probe_read_kernel(&e->start_boottime, sizeof(e->start_boottime), &leader->start_boottime);
	// The executable: what the task runs now, at the access; the agent's
	// /proc/<pid>/exe comes later, maybe after an exec.
	if (bpf_probe_read_kernel(&mm, sizeof(mm), &task->mm) || !mm)
		return;
	if (bpf_probe_read_kernel(&exe, sizeof(exe), &mm->exe_file) || !exe)
		return;
	if (bpf_probe_read_kernel(&inode, sizeof(inode), &exe->f_inode) || !inode)
		return;
	if (bpf_probe_read_kernel(&sb, sizeof(sb), &inode->i_sb) || !sb)
		return;
	if (bpf_probe_read_kernel(&e->exe_dev, sizeof(e->exe_dev), &sb->s_dev))
		return;
	if (bpf_probe_read_kernel(&ino, sizeof(ino), &inode->i_ino))
		e->exe_dev = 0;
	else
		e->exe_ino = ino;
}

// audit reports an access unless rate-limited. Both programs read the task
// the same way: bpf_get_current_pid_tgid and bpf_get_current_comm come with
// the helper set that has bpf_get_current_ancestor_cgroup_id, but the task
// reads are needed anyway for the executable, and one path keeps Probe's
// list for the scope program to the helper that defines it.
static __always_inline void audit(const struct bpf_cgroup_dev_ctx *ctx,
				  const struct filter_config *cfg,
				  __u64 cgroup_id, __u8 decision, int first_only)
{
	struct rate_key key = {};
	__u64 suppressed, uid_gid;
	struct event *e;

	key.cgroup_id = cgroup_id;
	key.major = ctx->major;
	key.minor = ctx->minor;
	key.decision = decision;
	if (!rate_limit(cfg, &key, first_only, &suppressed))
		return;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_per_cpu(&lost, 0);
		return;
	}
	e->cgroup_id = cgroup_id;
	e->ktime_ns = bpf_ktime_get_ns();
	uid_gid = bpf_get_current_uid_gid();
	e->uid = (__u32)uid_gid;
	e->gid = (__u32)(uid_gid >> 32);
	e->major = ctx->major;
	e->minor = ctx->minor;
	e->access = (__u16)(ctx->access_type >> 16);
	e->decision = decision;
	e->_pad1 = 0;
	e->_pad2 = 0;
	e->suppressed = suppressed;
	read_task(e);
	bpf_ringbuf_submit(e, 0);
}

// decide returns the verdict for an access of a narrowed device under policy
// p (NULL: none) of cgroup_id, and reports it as configured. One call site
// of audit keeps the program small: it is inlined.
static __always_inline int decide(const struct bpf_cgroup_dev_ctx *ctx,
				  const struct filter_config *cfg,
				  const struct policy *p, __u64 cgroup_id,
				  int class)
{
	int first_only = 0;
	__u8 decision;

	if (allowed(p, class, ctx->minor, ctx->access_type)) {
		if (cfg->audit_allowed == AUDIT_ALLOWED_FIRST)
			first_only = 1;
		else if (cfg->audit_allowed != AUDIT_ALLOWED_ALL)
			return 1;
		decision = DECISION_ALLOWED;
	} else if (cfg->audit_only || (p && (p->flags & POLICY_AUDIT_ONLY))) {
		decision = DECISION_WOULD_DENY;
	} else {
		decision = DECISION_DENIED;
	}
	audit(ctx, cfg, cgroup_id, decision, first_only);
	return decision != DECISION_DENIED;
}

// verdict bounds a program's return value where the compiler cannot see
// it. clang may return a copy of cfg->audit_allowed on the path where it
// compared equal to 1; Linux 6.1's verifier does not carry that comparison
// over to a 32-bit copy and refuses the program ("R0 has value (0x0;
// 0xffffffff) should have been in (0x0; 0x1)").
static __always_inline int verdict(int v)
{
	asm volatile("%[v] &= 1" : [v] "+r"(v));
	return v;
}

SEC("cgroup/dev")
int devfilter_scope(struct bpf_cgroup_dev_ctx *ctx)
{
	const struct filter_config *cfg = get_config();
	const struct policy *p = 0;
	__u64 id, id1, id2, id4, own;
	int class;

	// Unreachable (an array lookup of key 0 never fails); never narrow
	// what cannot be classified.
	if (!cfg)
		return 1;
	class = classify(ctx, cfg);
	if (class == CLASS_OTHER)
		return 1;

	// A task's own entry first (task_binding: slurm): Slurm's task
	// cgroup, <job>/<step>/user/task_N at scope level + 4, holds one only
	// when the agent narrowed the task within its step. A task above that
	// level has no id4 (the helper returns 0).
	id4 = bpf_get_current_ancestor_cgroup_id(cfg->scope_level + 4);
	id = id4;
	if (id4)
		p = bpf_map_lookup_elem(&policies, &id4);
	// A task above step level has no id2 (the helper returns 0).
	id2 = bpf_get_current_ancestor_cgroup_id(cfg->scope_level + 2);
	if (!p) {
		id = id2;
		if (id2)
			p = bpf_map_lookup_elem(&policies, &id2);
	}
	if (!p) {
		id1 = bpf_get_current_ancestor_cgroup_id(cfg->scope_level + 1);
		p = bpf_map_lookup_elem(&policies, &id1);
		if (p || !id2)
			id = id1;
	}
	// Neither ancestor has an entry: the task's own cgroup decides. This
	// is what the agent writes for slurmd's cgroup outside the scope
	// (systemd's slurmd.service), where it attaches this program too and
	// where the ancestors at scope level + 1 and + 2 are 0 (the task is not
	// that deep) or cgroups that are not Slurm's. Within the scope it finds
	// nothing the lookups above missed: entries are keyed by job, step and
	// task cgroups, which those lookups already tried.
	if (!p) {
		own = bpf_get_current_cgroup_id();
		p = bpf_map_lookup_elem(&policies, &own);
		if (p)
			id = own;
	}
	return verdict(decide(ctx, cfg, p, id, class));
}

SEC("cgroup/dev")
int devfilter_cgroup(struct bpf_cgroup_dev_ctx *ctx)
{
	const struct filter_config *cfg = get_config();
	const struct policy *p;
	int class;

	// Unreachable (an array lookup of key 0 never fails); never narrow
	// what cannot be classified.
	if (!cfg)
		return 1;
	class = classify(ctx, cfg);
	if (class == CLASS_OTHER)
		return 1;

	// Never NULL for a program attached with cgroup storage.
	p = bpf_get_local_storage(&storage, 0);
	return verdict(decide(ctx, cfg, p, p->cgroup_id, class));
}
