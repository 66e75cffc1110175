/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "client.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Field numbers of agent.proto. */
enum {
	F_REQUEST_VERSION = 1,
	F_REQUEST_JOB_PROLOG = 10,
	F_REQUEST_STEP_START = 11,
	F_REQUEST_JOB_EPILOG = 13,
	F_REQUEST_STEP_CHANNEL = 16, /* 12: StepEnd, 14, 15: VerifyStart, VerifyEnd */
	F_REQUEST_TASK_BIND = 17,

	F_JOB_ID = 1,	 /* JobProlog, StepStart, JobEpilog, StepChannel */
	F_STEP_ID = 2,	 /* StepStart, StepChannel */
	F_UID = 2,	 /* JobProlog */
	F_JOB_GPUS = 3,	 /* JobProlog */
	F_STEP_UID = 3,	 /* StepStart */
	F_STEP_GPUS = 4, /* StepStart */
	F_TASK_PIDS = 5, /* StepStart */
	F_TASK_ID = 3,	 /* TaskBind */
	F_VISIBLE = 4,	 /* TaskBind */

	F_RESP_ERROR = 1,
	F_RESP_GPUS = 2,
	F_RESP_SLURM_LOCAL = 3,
	F_RESP_STEP_CGROUP = 4,
	F_RESP_IMEX_PENDING = 6, /* 5: verify */
	F_RESP_IMEX_CHANNEL = 7,
	F_RESP_TASK_BIND = 17,

	PROTOCOL_VERSION_1 = 1,
};

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_BYTES = 2, WT_SGROUP = 3, WT_EGROUP = 4, WT_FIXED32 = 5 };

/* --- encoding --- */

/*
 * Where put_* write: p with room for cap bytes, or nowhere (p NULL), only
 * counting len, to learn a message's size before its length is written.
 */
struct out {
	uint8_t *p;
	size_t len, cap;
	bool full;
};

static void put_byte(struct out *o, uint8_t c)
{
	if (!o->p)
		o->len++;
	else if (o->len < o->cap)
		o->p[o->len++] = c;
	else
		o->full = true;
}

static void put_varint(struct out *o, uint64_t v)
{
	while (v >= 0x80) {
		put_byte(o, (uint8_t)(v | 0x80));
		v >>= 7;
	}
	put_byte(o, (uint8_t)v);
}

static size_t varint_len(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static void put_tag(struct out *o, int num, int type)
{
	put_varint(o, ((uint64_t)num << 3) | (uint64_t)type);
}

/* proto3 leaves zero scalars out. */
static void put_uint(struct out *o, int num, uint64_t v)
{
	if (!v)
		return;
	put_tag(o, num, WT_VARINT);
	put_varint(o, v);
}

static void put_bytes(struct out *o, int num, const void *p, size_t n)
{
	put_tag(o, num, WT_BYTES);
	put_varint(o, n);
	for (size_t i = 0; i < n; i++)
		put_byte(o, ((const uint8_t *)p)[i]);
}

/* An optional string: present, even empty, unless s is NULL. */
static void put_opt_string(struct out *o, int num, const char *s)
{
	if (s)
		put_bytes(o, num, s, strlen(s));
}

/* One request: the oneof field num and what its message holds. */
struct req {
	int num;
	uint32_t job_id, step_id, uid; /* uid: TaskBind's task_id */
	const char *gpus; /* job_gpus, step_gpus or visible_devices; NULL: unset */
	const uint32_t *pids;
	int npids;
};

/* The inner message of r. */
static void put_msg(struct out *o, const struct req *r)
{
	put_uint(o, F_JOB_ID, r->job_id);
	switch (r->num) {
	case F_REQUEST_JOB_PROLOG:
		put_uint(o, F_UID, r->uid);
		put_opt_string(o, F_JOB_GPUS, r->gpus);
		break;
	case F_REQUEST_STEP_START:
		put_uint(o, F_STEP_ID, r->step_id);
		put_uint(o, F_STEP_UID, r->uid);
		put_opt_string(o, F_STEP_GPUS, r->gpus);
		if (r->npids > 0) {
			size_t n = 0;

			for (int i = 0; i < r->npids; i++)
				n += varint_len(r->pids[i]);
			put_tag(o, F_TASK_PIDS, WT_BYTES); /* packed */
			put_varint(o, n);
			for (int i = 0; i < r->npids; i++)
				put_varint(o, r->pids[i]);
		}
		break;
	case F_REQUEST_STEP_CHANNEL:
		put_uint(o, F_STEP_ID, r->step_id);
		break;
	case F_REQUEST_TASK_BIND:
		put_uint(o, F_STEP_ID, r->step_id);
		put_uint(o, F_TASK_ID, r->uid);
		put_opt_string(o, F_VISIBLE, r->gpus);
		break;
	}
}

/*
 * Writes r framed into buf: the body's length, the version, the inner
 * message. -1 when it does not fit in cap or GF_MAX_FRAME.
 */
static int frame(uint8_t *buf, size_t cap, const struct req *r)
{
	struct out o = { .p = buf, .cap = cap < GF_MAX_FRAME ? cap : GF_MAX_FRAME };
	struct out m = { 0 };
	size_t body;

	put_msg(&m, r); /* counts only */
	body = 2 /* version: tag 0x08, 1 */ + varint_len((uint64_t)r->num << 3) +
	       varint_len(m.len) + m.len;
	if (body > GF_MAX_FRAME)
		return -1;
	put_varint(&o, body);
	put_uint(&o, F_REQUEST_VERSION, PROTOCOL_VERSION_1);
	put_tag(&o, r->num, WT_BYTES);
	put_varint(&o, m.len);
	put_msg(&o, r);
	return o.full ? -1 : (int)o.len;
}

int gf_wire_job_prolog(uint8_t *buf, size_t cap, uint32_t job_id, uint32_t uid,
		       const char *job_gpus)
{
	struct req r = { .num = F_REQUEST_JOB_PROLOG, .job_id = job_id, .uid = uid, .gpus = job_gpus };

	return frame(buf, cap, &r);
}

int gf_wire_job_epilog(uint8_t *buf, size_t cap, uint32_t job_id)
{
	struct req r = { .num = F_REQUEST_JOB_EPILOG, .job_id = job_id };

	return frame(buf, cap, &r);
}

int gf_wire_step_start(uint8_t *buf, size_t cap, uint32_t job_id,
		       uint32_t step_id, uint32_t uid, const char *step_gpus,
		       const uint32_t *pids, int npids)
{
	struct req r = { .num = F_REQUEST_STEP_START, .job_id = job_id, .step_id = step_id,
			 .uid = uid, .gpus = step_gpus, .pids = pids, .npids = npids };

	return frame(buf, cap, &r);
}

int gf_wire_step_channel(uint8_t *buf, size_t cap, uint32_t job_id,
			 uint32_t step_id)
{
	struct req r = { .num = F_REQUEST_STEP_CHANNEL, .job_id = job_id, .step_id = step_id };

	return frame(buf, cap, &r);
}

int gf_wire_task_bind(uint8_t *buf, size_t cap, uint32_t job_id,
		      uint32_t step_id, uint32_t task_id, const char *visible)
{
	struct req r = { .num = F_REQUEST_TASK_BIND, .job_id = job_id, .step_id = step_id,
			 .uid = task_id, .gpus = visible };

	return frame(buf, cap, &r);
}

/* --- decoding --- */

struct in {
	const uint8_t *p, *end;
};

/* As protowire.ConsumeVarint: at most 10 bytes, the 10th at most 1. */
static int get_varint(struct in *in, uint64_t *v)
{
	uint64_t x = 0;

	for (int i = 0; i < 10; i++) {
		uint8_t c;

		if (in->p >= in->end)
			return -1;
		c = *in->p++;
		if (i == 9 && c > 1)
			return -1;
		x |= (uint64_t)(c & 0x7f) << (7 * i);
		if (!(c & 0x80)) {
			*v = x;
			return 0;
		}
	}
	return -1;
}

static int get_tag(struct in *in, uint64_t *num, int *type)
{
	uint64_t t;

	if (get_varint(in, &t))
		return -1;
	*num = t >> 3;
	*type = (int)(t & 7);
	/* As protowire.ConsumeTag: field numbers start at 1. */
	return *num >= 1 && *num <= INT32_MAX ? 0 : -1;
}

static int get_bytes(struct in *in, struct in *v)
{
	uint64_t n;

	if (get_varint(in, &n) || n > (uint64_t)(in->end - in->p))
		return -1;
	v->p = in->p;
	v->end = in->p + n;
	in->p += n;
	return 0;
}

/* Groups deeper than this are refused; the agent never sends any. */
#define MAX_GROUP_DEPTH 64

static int skip_value(struct in *in, uint64_t num, int type, int depth)
{
	struct in v;
	uint64_t x, n2;
	int t2;

	switch (type) {
	case WT_VARINT:
		return get_varint(in, &x);
	case WT_FIXED64:
	case WT_FIXED32: {
		size_t size = type == WT_FIXED64 ? 8 : 4;

		if ((size_t)(in->end - in->p) < size)
			return -1;
		in->p += size;
		return 0;
	}
	case WT_BYTES:
		return get_bytes(in, &v);
	case WT_SGROUP:
		if (depth >= MAX_GROUP_DEPTH)
			return -1;
		for (;;) {
			if (get_tag(in, &n2, &t2))
				return -1;
			if (t2 == WT_EGROUP)
				return n2 == num ? 0 : -1;
			if (skip_value(in, n2, t2, depth + 1))
				return -1;
		}
	default:
		return -1;
	}
}

static int add_gpu(struct gf_response *r, uint64_t g)
{
	if (g > UINT32_MAX)
		return -1;
	if (r->ngpus < GPUFENCE_MAX_GPUS)
		r->gpus[r->ngpus++] = (uint32_t)g;
	if (r->gpus_total < INT32_MAX)
		r->gpus_total++;
	return 0;
}

int gf_wire_parse_response(const uint8_t *b, size_t n, struct gf_response *r)
{
	struct in in = { .p = b, .end = b + n };

	memset(r, 0, sizeof(*r));
	while (in.p < in.end) {
		uint64_t num, v;
		int type;
		struct in s;

		if (get_tag(&in, &num, &type))
			return -1;
		if ((num == F_RESP_ERROR || num == F_RESP_STEP_CGROUP) && type == WT_BYTES) {
			if (get_bytes(&in, &s))
				return -1;
			if (num == F_RESP_ERROR) {
				r->error = (const char *)s.p;
				r->error_len = (size_t)(s.end - s.p);
			} else {
				r->step_cgroup = (const char *)s.p;
				r->step_cgroup_len = (size_t)(s.end - s.p);
			}
		} else if (num == F_RESP_GPUS && type == WT_BYTES) { /* packed */
			if (get_bytes(&in, &s))
				return -1;
			while (s.p < s.end)
				if (get_varint(&s, &v) || add_gpu(r, v))
					return -1;
		} else if (num == F_RESP_GPUS && type == WT_VARINT) { /* unpacked */
			if (get_varint(&in, &v) || add_gpu(r, v))
				return -1;
		} else if ((num == F_RESP_SLURM_LOCAL || num == F_RESP_IMEX_PENDING ||
			    num == F_RESP_TASK_BIND) &&
			   type == WT_VARINT) {
			if (get_varint(&in, &v))
				return -1;
			if (num == F_RESP_SLURM_LOCAL)
				r->slurm_local = v != 0;
			else if (num == F_RESP_IMEX_PENDING)
				r->imex_pending = v != 0;
			else
				r->task_bind = v != 0;
		} else if (num == F_RESP_IMEX_CHANNEL && type == WT_VARINT) {
			if (get_varint(&in, &v) || v > UINT32_MAX)
				return -1;
			r->has_channel = 1;
			r->channel = (uint32_t)v;
		} else if (skip_value(&in, num, type, 0)) {
			return -1;
		}
	}
	return 0;
}

/* --- the exchange --- */

/* Why a call failed, and how: its code decides failure=open and retries. */
struct failure {
	int code;
	bool deadline; /* no answer in time */
	char text[GPUFENCE_ERR_LEN];
};

static int fail(struct failure *f, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(struct failure *f, int code, const char *fmt, ...)
{
	va_list ap;

	f->code = code;
	va_start(ap, fmt);
	vsnprintf(f->text, sizeof(f->text), fmt, ap);
	va_end(ap);
	return code;
}

/* "connect: no such file or directory", as Go's client said it. */
static int sys_fail(struct failure *f, const char *op, int errnum)
{
	char e[128];

	snprintf(e, sizeof(e), "%s", strerror(errnum));
	e[0] = (char)tolower((unsigned char)e[0]);
	f->deadline = errnum == EAGAIN || errnum == EWOULDBLOCK || errnum == ETIMEDOUT;
	return fail(f, GPUFENCE_E_UNREACHABLE, "%s: %s", op, e);
}

static long long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Bounds the next blocking call on fd by what is left until deadline. */
static int set_timeouts(int fd, long long deadline, struct failure *f)
{
	long long left = deadline - now_ms();
	struct timeval tv;

	if (left <= 0) {
		f->deadline = true;
		return fail(f, GPUFENCE_E_UNREACHABLE, "deadline");
	}
	tv.tv_sec = (time_t)(left / 1000);
	tv.tv_usec = (suseconds_t)(left % 1000) * 1000;
	if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) ||
	    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)))
		return sys_fail(f, "setsockopt", errno);
	return GPUFENCE_OK;
}

/*
 * Refuses a socket whose listening process is not root: the agent runs as
 * root, and so does slurmstepd, which calls this. (A caller that is not
 * root, a test, may trust a listener of its own uid.) SO_PEERCRED of a
 * connected unix socket names the process that listened.
 */
static int check_listener(int fd, const char *path, struct failure *f)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len))
		return sys_fail(f, "getsockopt SO_PEERCRED", errno);
	if (cred.uid != 0 && cred.uid != geteuid())
		return fail(f, GPUFENCE_E_REFUSED,
			    "the process listening on %.300s (pid %d) runs as uid %u, not root; gpufence refuses to trust it (is something other than the gpufence agent bound to its socket?)",
			    path, (int)cred.pid, (unsigned)cred.uid);
	return GPUFENCE_OK;
}

/* Reads one frame into *body (malloc'd, the caller frees it). */
static int read_frame(int fd, long long deadline, uint8_t **body, size_t *len,
		      struct failure *f)
{
	uint8_t *buf = NULL;
	size_t got = 0, want = 0, head = 0, cap = 0;
	int rc;

	*body = NULL;
	while (!head || got < want) {
		ssize_t n;

		if (!head && got > 0) {
			struct in in = { .p = buf, .end = buf + got };
			uint64_t size;

			if (get_varint(&in, &size) == 0) {
				if (size > GF_MAX_FRAME) {
					free(buf);
					return fail(f, GPUFENCE_E_UNREACHABLE,
						    "answer over %d bytes", GF_MAX_FRAME);
				}
				head = (size_t)(in.p - buf);
				want = head + (size_t)size;
				continue;
			}
			if (got >= 10) {
				free(buf);
				return fail(f, GPUFENCE_E_UNREACHABLE, "malformed answer");
			}
		}
		if (cap - got < 512) {
			uint8_t *nb;

			cap = cap ? cap * 2 : 1024;
			if (!(nb = realloc(buf, cap))) {
				free(buf);
				return fail(f, GPUFENCE_E_INVALID, "out of memory");
			}
			buf = nb;
		}
		if ((rc = set_timeouts(fd, deadline, f))) {
			free(buf);
			return rc;
		}
		/*
		 * Never past this frame (the agent sends one and hangs up), and
		 * never past the buffer: the header a byte at a time.
		 */
		n = read(fd, buf + got, head ? (want - got < cap - got ? want - got : cap - got) : 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = sys_fail(f, "read", errno);
			free(buf);
			return rc;
		}
		if (n == 0) {
			free(buf);
			return fail(f, GPUFENCE_E_UNREACHABLE,
				    "the agent closed the connection without answering");
		}
		got += (size_t)n;
	}
	memmove(buf, buf + head, want - head);
	*body = buf;
	*len = want - head;
	return GPUFENCE_OK;
}

/* Connects to path and checks the listener; the socket in *fdp. */
static int open_conn(const char *path, long long deadline, int *fdp,
		     struct failure *f)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd, rc;

	*fdp = -1;
	if (strlen(path) >= sizeof(addr.sun_path))
		return fail(f, GPUFENCE_E_INVALID, "socket path %.300s: longer than %zu bytes",
			    path, sizeof(addr.sun_path) - 1);
	memcpy(addr.sun_path, path, strlen(path));
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return sys_fail(f, "socket", errno);
	if ((rc = set_timeouts(fd, deadline, f)))
		goto out;
	/*
	 * A blocking connect on a unix socket waits, bounded by SO_SNDTIMEO,
	 * only while the listener's backlog is full.
	 */
	while ((rc = connect(fd, (struct sockaddr *)&addr, sizeof(addr))) && errno == EINTR)
		;
	if (rc) {
		rc = sys_fail(f, "connect", errno);
		goto out;
	}
	if ((rc = check_listener(fd, path, f)))
		goto out;
	*fdp = fd;
	return GPUFENCE_OK;
out:
	close(fd);
	return rc;
}

/* Sends req on a connected fd, reads and decodes the answer. */
static int exchange(int fd, long long deadline, const uint8_t *req,
		    size_t reqlen, uint8_t **body, struct gf_response *r,
		    struct failure *f)
{
	size_t sent = 0, len = 0;
	int rc;

	while (sent < reqlen) {
		ssize_t n;

		if ((rc = set_timeouts(fd, deadline, f)))
			return rc;
		/* MSG_NOSIGNAL: an agent gone mid-way is no SIGPIPE for slurmstepd. */
		n = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return sys_fail(f, "write", errno);
		sent += (size_t)n;
	}
	if ((rc = read_frame(fd, deadline, body, &len, f)))
		return rc;
	if (gf_wire_parse_response(*body, len, r))
		return fail(f, GPUFENCE_E_UNREACHABLE, "malformed answer");
	if (r->error_len) {
		/* The agent's own words, cut at a character boundary. */
		size_t n = r->error_len < sizeof(f->text) - 1 ? r->error_len : sizeof(f->text) - 1;

		while (n > 0 && n < r->error_len && ((unsigned char)r->error[n] & 0xc0) == 0x80)
			n--;
		f->code = GPUFENCE_E_REFUSED;
		memcpy(f->text, r->error, n);
		f->text[n] = 0;
		return GPUFENCE_E_REFUSED;
	}
	return GPUFENCE_OK;
}

/* One try: connect, check the listener, send, read and decode the answer. */
static int try_once(const char *path, long long deadline, const uint8_t *req,
		    size_t reqlen, uint8_t **body, struct gf_response *r,
		    struct failure *f)
{
	int fd, rc;

	if ((rc = open_conn(path, deadline, &fd, f)))
		return rc;
	rc = exchange(fd, deadline, req, reqlen, body, r, f);
	close(fd);
	return rc;
}

static void sleep_ms(long long ms)
{
	struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };

	while (nanosleep(&t, &t) && errno == EINTR)
		;
}

/* "5s", "300ms": the configured timeout as the Go client wrote it. */
static void duration(int ms, char *buf, size_t len)
{
	if (ms % 1000 == 0)
		snprintf(buf, len, "%ds", ms / 1000);
	else
		snprintf(buf, len, "%dms", ms);
}

/*
 * The node's memory of a hung agent: <socket>.hung, a root-only file in the
 * socket's folder whose mtime says when an exchange last waited its whole
 * timeout for no answer. Every process that talks to the agent (the job
 * prolog, each slurmstepd) reads it, so a job whose prolog found the agent
 * hung does not wait the timeout again in its extern step and its step.
 * It is used only in a folder of ours that no one else may write to (the
 * agent's socket folder is root's, 0755), and only when it is a regular
 * file of ours. A clock that jumps makes it stale (a time ahead by more
 * than GF_HUNG_SKEW_S, or older than GF_HUNG_WINDOW_S): the next exchange
 * then waits its full timeout once, as without it; it never makes a call
 * fail without asking the agent.
 */
#define GF_HUNG_SKEW_S 2

static bool hung_marker(const char *socket, char *path, size_t len)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	char *slash;
	struct stat st;

	if (snprintf(path, len, "%s.hung", socket) >= (int)len ||
	    snprintf(dir, sizeof(dir), "%s", socket) >= (int)sizeof(dir) ||
	    !(slash = strrchr(dir, '/')))
		return false;
	slash[slash == dir] = 0;
	return !lstat(dir, &st) && S_ISDIR(st.st_mode) &&
	       st.st_uid == geteuid() && !(st.st_mode & 022);
}

/*
 * Whether an exchange on this node found the agent hung a moment ago; path
 * is the marker hung_marker names ("" where there is none to trust).
 */
static bool hung_recently(const char *path)
{
	struct timespec now;
	struct stat st;
	long long age;

	if (!path[0] || lstat(path, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
		return false;
	clock_gettime(CLOCK_REALTIME, &now);
	age = (long long)now.tv_sec - (long long)st.st_mtim.tv_sec;
	return age >= -GF_HUNG_SKEW_S && age <= GF_HUNG_WINDOW_S;
}

/* An exchange waited its whole timeout: say so, with now as the time. */
static void mark_hung(const char *path)
{
	struct stat st;
	int fd;

	if (!path[0])
		return;
	fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
	if (fd < 0)
		return;
	if (!fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_uid == geteuid())
		futimens(fd, NULL);
	close(fd);
}

/* The agent answered: later exchanges wait their full timeout again. */
static void clear_hung(const char *path)
{
	if (path[0])
		unlink(path); /* ENOENT, the usual case, is no error */
}

/*
 * Sends the framed request, and when the agent could not be reached or did
 * not answer in time, once more, within 1.5 x timeout in all: after
 * GF_RETRY_PAUSE_MS when it could not be reached (an agent restarting), at
 * once and for GF_PROBE_MS when it did not answer (a hung agent answers no
 * second try; a working one answers in milliseconds). Once an exchange on
 * the node has waited its timeout for nothing, every call for the next
 * GF_HUNG_WINDOW_S makes one try of GF_PROBE_MS only, until the agent
 * answers one. Sending a request twice is safe: the agent treats a
 * repeated request as the same one. On GPUFENCE_OK, *body holds the answer
 * r points into (the caller frees it).
 */
static int call(const char *socket, int timeout_ms, const uint8_t *req, int reqlen,
		uint8_t **body, struct gf_response *r, char *err, size_t errlen)
{
	struct failure f = { 0 };
	long long start = now_ms(), end;
	int rc, probe_ms;
	bool hung, waited = false;
	/* The marker's path, found once per call ("" when not to be trusted). */
	char marker[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];

	*body = NULL;
	memset(r, 0, sizeof(*r)); /* error_len: whether the agent itself refused */
	if (!socket || !socket[0] || timeout_ms <= 0) {
		char d[32];

		duration(timeout_ms > 0 ? timeout_ms : 0, d, sizeof(d));
		snprintf(err, errlen, "invalid argument: socket \"%s\", timeout %s",
			 socket ? socket : "", d);
		return GPUFENCE_E_INVALID;
	}
	if (reqlen < 0) {
		snprintf(err, errlen, "invalid argument: request over %d bytes", GF_MAX_FRAME);
		return GPUFENCE_E_INVALID;
	}
	probe_ms = timeout_ms < GF_PROBE_MS ? timeout_ms : GF_PROBE_MS;
	if (!hung_marker(socket, marker, sizeof(marker)))
		marker[0] = 0;
	hung = hung_recently(marker);
	if (hung) {
		rc = try_once(socket, start + probe_ms, req, (size_t)reqlen, body, r, &f);
	} else {
		end = start + timeout_ms + timeout_ms / 2;
		rc = try_once(socket, start + timeout_ms, req, (size_t)reqlen, body, r, &f);
		if (rc == GPUFENCE_E_UNREACHABLE && f.deadline) {
			waited = true;
			mark_hung(marker);
			free(*body);
			*body = NULL;
			memset(&f, 0, sizeof(f));
			rc = try_once(socket, now_ms() + probe_ms, req, (size_t)reqlen, body, r, &f);
		} else if (rc == GPUFENCE_E_UNREACHABLE && end - now_ms() > GF_RETRY_PAUSE_MS) {
			free(*body);
			*body = NULL;
			sleep_ms(GF_RETRY_PAUSE_MS);
			memset(&f, 0, sizeof(f));
			rc = try_once(socket, end, req, (size_t)reqlen, body, r, &f);
		}
	}
	if (rc == GPUFENCE_OK || (rc == GPUFENCE_E_REFUSED && r->error_len))
		clear_hung(marker);
	if (rc == GPUFENCE_OK)
		return rc;
	free(*body);
	*body = NULL;
	if (rc == GPUFENCE_E_UNREACHABLE && f.deadline) {
		/* The text names the timeout that was waited. */
		char d[32], p[32];

		duration(timeout_ms, d, sizeof(d));
		duration(probe_ms, p, sizeof(p));
		if (hung && !waited)
			snprintf(err, errlen, "no answer within %s; an exchange on this node had none within %s less than %ds ago",
				 p, d, GF_HUNG_WINDOW_S);
		else
			snprintf(err, errlen, "no answer within %s", d);
	} else {
		snprintf(err, errlen, "%s", f.text);
	}
	return rc;
}

int gf_client_job_prolog(const char *socket, int timeout_ms, uint32_t job_id,
			 uint32_t uid, const char *job_gpus, char *err,
			 size_t errlen)
{
	uint8_t *req, *body;
	struct gf_response r;
	int rc;

	if (!(req = malloc(GF_MAX_FRAME))) {
		snprintf(err, errlen, "out of memory");
		return GPUFENCE_E_INVALID;
	}
	rc = call(socket, timeout_ms, req,
		  gf_wire_job_prolog(req, GF_MAX_FRAME, job_id, uid, job_gpus),
		  &body, &r, err, errlen);
	free(req);
	free(body);
	return rc;
}

int gf_client_job_epilog(const char *socket, int timeout_ms, uint32_t job_id,
			 char *err, size_t errlen)
{
	uint8_t req[64], *body;
	struct gf_response r;
	int rc = call(socket, timeout_ms, req,
		      gf_wire_job_epilog(req, sizeof(req), job_id), &body, &r,
		      err, errlen);

	free(body);
	return rc;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

int gf_client_step_start(const char *socket, int timeout_ms, uint32_t job_id,
			 uint32_t step_id, uint32_t uid, const char *step_gpus,
			 const int32_t *pids, int npids,
			 struct gf_step_result *res, char *err, size_t errlen)
{
	uint32_t upids[64];
	uint8_t *req, *body;
	struct gf_response r;
	int rc, n = 0;

	memset(res, 0, sizeof(*res));
	if (npids < 0 || npids > (int)(sizeof(upids) / sizeof(upids[0]))) {
		snprintf(err, errlen, "invalid argument: %d task pids", npids);
		return GPUFENCE_E_INVALID;
	}
	for (int i = 0; i < npids; i++) {
		if (pids[i] <= 0) {
			snprintf(err, errlen, "invalid argument: task pid %d", (int)pids[i]);
			return GPUFENCE_E_INVALID;
		}
		upids[i] = (uint32_t)pids[i];
	}
	if (!(req = malloc(GF_MAX_FRAME))) {
		snprintf(err, errlen, "out of memory");
		return GPUFENCE_E_INVALID;
	}
	rc = call(socket, timeout_ms, req,
		  gf_wire_step_start(req, GF_MAX_FRAME, job_id, step_id, uid,
				     step_gpus, upids, npids),
		  &body, &r, err, errlen);
	free(req);
	if (rc != GPUFENCE_OK)
		return rc;
	if (r.gpus_total > GPUFENCE_MAX_GPUS) {
		snprintf(err, errlen, "invalid argument: agent allowed %d GPUs, room for %d",
			 r.gpus_total, GPUFENCE_MAX_GPUS);
		rc = GPUFENCE_E_INVALID;
	} else if (r.step_cgroup_len >= sizeof(res->step_cgroup)) {
		snprintf(err, errlen, "invalid argument: step cgroup path longer than %zu bytes",
			 sizeof(res->step_cgroup) - 1);
		rc = GPUFENCE_E_INVALID;
	} else if (r.step_cgroup && memchr(r.step_cgroup, 0, r.step_cgroup_len)) {
		snprintf(err, errlen, "invalid argument: step cgroup path with a NUL byte");
		rc = GPUFENCE_E_INVALID;
	} else {
		/* Local numbering is the rank in the allowed list: sorted, unique. */
		qsort(r.gpus, (size_t)r.ngpus, sizeof(r.gpus[0]), cmp_u32);
		for (int i = 0; i < r.ngpus; i++)
			if (!n || res->gpus[n - 1] != r.gpus[i])
				res->gpus[n++] = r.gpus[i];
		res->ngpus = n;
		res->slurm_local_indices = r.slurm_local;
		res->imex_pending = r.imex_pending;
		res->task_bind = r.task_bind;
		if (r.step_cgroup_len)
			memcpy(res->step_cgroup, r.step_cgroup, r.step_cgroup_len);
		res->step_cgroup[r.step_cgroup_len] = 0;
	}
	free(body);
	if (rc != GPUFENCE_OK)
		memset(res, 0, sizeof(*res));
	return rc;
}

int gf_client_step_channel(const char *socket, int timeout_ms, uint32_t job_id,
			   uint32_t step_id, struct gf_step_result *res,
			   char *err, size_t errlen)
{
	uint8_t req[64], *body;
	struct gf_response r;
	int rc = call(socket, timeout_ms, req,
		      gf_wire_step_channel(req, sizeof(req), job_id, step_id),
		      &body, &r, err, errlen);

	res->has_channel = 0;
	res->channel = 0;
	if (rc == GPUFENCE_OK) {
		res->has_channel = r.has_channel;
		res->channel = r.channel;
	}
	free(body);
	return rc;
}

/* The text of a failed call, as call() words it. */
static void describe(const struct failure *f, int timeout_ms, char *err,
		     size_t errlen)
{
	if (f->code == GPUFENCE_E_UNREACHABLE && f->deadline) {
		char d[32];

		duration(timeout_ms, d, sizeof(d));
		snprintf(err, errlen, "no answer within %s", d);
	} else {
		snprintf(err, errlen, "%s", f->text);
	}
}

int gf_client_task_connect(const char *socket, int timeout_ms, int *fd,
			   char *err, size_t errlen)
{
	struct failure f = { 0 };
	long long start = now_ms(), end;
	int rc;

	*fd = -1;
	if (!socket || !socket[0] || timeout_ms <= 0) {
		snprintf(err, errlen, "invalid argument: socket \"%s\", timeout %dms",
			 socket ? socket : "", timeout_ms > 0 ? timeout_ms : 0);
		return GPUFENCE_E_INVALID;
	}
	/* As call(): a second try after a pause, within 1.5 x timeout. */
	end = start + timeout_ms + timeout_ms / 2;
	rc = open_conn(socket, start + timeout_ms, fd, &f);
	if (rc == GPUFENCE_E_UNREACHABLE && end - now_ms() > GF_RETRY_PAUSE_MS) {
		sleep_ms(GF_RETRY_PAUSE_MS);
		memset(&f, 0, sizeof(f));
		rc = open_conn(socket, end, fd, &f);
	}
	if (rc != GPUFENCE_OK)
		describe(&f, timeout_ms, err, errlen);
	return rc;
}

int gf_client_task_bind(int fd, int timeout_ms, uint32_t job_id,
			uint32_t step_id, uint32_t task_id, const char *visible,
			struct gf_task_result *res, char *err, size_t errlen)
{
	uint8_t req[GF_TASK_BIND_FRAME], *body = NULL;
	struct failure f = { 0 };
	struct gf_response r;
	int len, rc, n = 0;

	memset(res, 0, sizeof(*res));
	len = gf_wire_task_bind(req, sizeof(req), job_id, step_id, task_id, visible);
	if (fd < 0 || timeout_ms <= 0 || len < 0) {
		snprintf(err, errlen, "invalid argument: fd %d, timeout %dms, %s", fd,
			 timeout_ms > 0 ? timeout_ms : 0,
			 len < 0 ? "CUDA_VISIBLE_DEVICES too long" : "request");
		if (fd >= 0)
			close(fd);
		return GPUFENCE_E_INVALID;
	}
	/* No second try: the connection was made as root, and cannot be again. */
	rc = exchange(fd, now_ms() + timeout_ms, req, (size_t)len, &body, &r, &f);
	close(fd);
	if (rc == GPUFENCE_OK && r.gpus_total > GPUFENCE_MAX_GPUS) {
		snprintf(err, errlen, "invalid argument: agent allowed %d GPUs, room for %d",
			 r.gpus_total, GPUFENCE_MAX_GPUS);
		rc = GPUFENCE_E_INVALID;
	} else if (rc == GPUFENCE_OK) {
		qsort(r.gpus, (size_t)r.ngpus, sizeof(r.gpus[0]), cmp_u32);
		for (int i = 0; i < r.ngpus; i++)
			if (!n || res->gpus[n - 1] != r.gpus[i])
				res->gpus[n++] = r.gpus[i];
		res->ngpus = n;
	} else {
		describe(&f, timeout_ms, err, errlen);
	}
	free(body);
	return rc;
}

void gf_describe_failure(const char *socket, int code, const char *reason,
			 char *msg, size_t msglen)
{
	switch (code) {
	case GPUFENCE_E_REFUSED:
		snprintf(msg, msglen, "the gpufence agent refused: %s", reason);
		break;
	case GPUFENCE_E_UNREACHABLE:
		snprintf(msg, msglen, "cannot reach the gpufence agent at %s (%s)",
			 socket, reason);
		break;
	default:
		snprintf(msg, msglen, "internal error talking to the gpufence agent at %s (code %d: %s)",
			 socket, code, reason);
	}
}
