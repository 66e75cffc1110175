/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "golib.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/*
 * Every call into the Go client runs in a child process forked for it: the
 * Go runtime is loaded and started there and exits with it, never in the
 * caller. A Go runtime living in slurmstepd would cost every step more
 * than the exchange itself: its start, a slower fork of each task, and
 * each of Slurm's uid switches signalling its threads (docs/architecture.md,
 * "Step launch cost"). The child writes its answer into a pipe.
 */

/* What the child sends back. */
struct answer {
	int rc;
	struct gf_step_result res;
	char err[GPUFENCE_ERR_LEN];
};

static struct {
	gpufence_job_prolog_fn job_prolog;
	gpufence_job_epilog_fn job_epilog;
	gpufence_step_start_fn step_start;
	gpufence_step_end_fn step_end;
	gpufence_step_channel_fn step_channel;
	gpufence_spool_failopen_fn spool_failopen;
} go;

/* In the child: load and check the library. */
static int load(const char *path, char *err, size_t errlen)
{
	void *h;
	gpufence_abi_version_fn abi;
	const char *e;

	dlerror();
	if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
		e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return GF_E_LOAD;
	}
	abi = (gpufence_abi_version_fn)dlsym(h, "gpufence_abi_version");
	go.job_prolog = (gpufence_job_prolog_fn)dlsym(h, "gpufence_job_prolog");
	go.job_epilog = (gpufence_job_epilog_fn)dlsym(h, "gpufence_job_epilog");
	go.step_start = (gpufence_step_start_fn)dlsym(h, "gpufence_step_start");
	go.step_end = (gpufence_step_end_fn)dlsym(h, "gpufence_step_end");
	go.step_channel = (gpufence_step_channel_fn)dlsym(h, "gpufence_step_channel");
	go.spool_failopen = (gpufence_spool_failopen_fn)dlsym(
		h, "gpufence_spool_failopen");
	if (!abi || !go.job_prolog || !go.job_epilog || !go.step_start ||
	    !go.step_end || !go.step_channel || !go.spool_failopen) {
		snprintf(err, errlen, "%.400s: not a gpufence client library", path);
		return GF_E_LOAD;
	}
	if (abi() != GPUFENCE_GO_ABI) {
		snprintf(err, errlen,
			 "%.400s: client library ABI %d, this plugin needs %d (install matching versions)",
			 path, abi(), GPUFENCE_GO_ABI);
		return GF_E_LOAD;
	}
	return GPUFENCE_OK;
}

/* The Go side takes char *; it never writes through these. */
#define MUT(s) ((char *)(s))

enum call_kind { CALL_PROLOG, CALL_EPILOG, CALL_STEP_START, CALL_STEP_END, CALL_STEP_CHANNEL, CALL_SPOOL };

struct call {
	enum call_kind kind;
	const struct gf_config *cfg;
	uint32_t job_id, step_id, uid;
	const char *str;  /* job_gpus, step_gpus, or the step name (spool) */
	const char *str2; /* reason (spool) */
	const int32_t *pids;
	int npids;
};

static int timeout_ms(const struct gf_config *cfg)
{
	return cfg->timeout_s * 1000;
}

/* In the child: the call itself. */
static void run(const struct call *c, struct answer *a)
{
	const struct gf_config *cfg = c->cfg;
	char *err = a->err;
	int errlen = (int)sizeof(a->err);

	a->rc = load(cfg->golib, a->err, sizeof(a->err));
	if (a->rc)
		return;
	switch (c->kind) {
	case CALL_PROLOG:
		a->rc = go.job_prolog(MUT(cfg->socket), timeout_ms(cfg), c->job_id,
				      c->uid, MUT(c->str), err, errlen);
		break;
	case CALL_EPILOG:
		a->rc = go.job_epilog(MUT(cfg->socket), timeout_ms(cfg), c->job_id,
				      err, errlen);
		break;
	case CALL_STEP_START:
		a->rc = go.step_start(MUT(cfg->socket), timeout_ms(cfg), c->job_id,
				      c->step_id, c->uid, MUT(c->str),
				      (int32_t *)c->pids, c->npids, a->res.gpus,
				      GPUFENCE_MAX_GPUS, &a->res.ngpus,
				      &a->res.slurm_local_indices,
				      &a->res.imex_pending,
				      a->res.step_cgroup,
				      (int)sizeof(a->res.step_cgroup), err, errlen);
		break;
	case CALL_STEP_END:
		a->rc = go.step_end(MUT(cfg->socket), timeout_ms(cfg), c->job_id,
				    c->step_id, err, errlen);
		break;
	case CALL_STEP_CHANNEL:
		a->rc = go.step_channel(MUT(cfg->socket), timeout_ms(cfg), c->job_id,
					c->step_id, &a->res.has_channel,
					&a->res.channel, err, errlen);
		break;
	case CALL_SPOOL:
		a->rc = go.spool_failopen(MUT(cfg->spool), c->job_id, MUT(c->str),
					  c->uid, MUT(c->str2), err, errlen);
		break;
	}
}

static long long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void reap(pid_t pid)
{
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	/* ECHILD: a reaper of the caller's (SIGCHLD ignored) was first. */
}

/*
 * Runs the call in a child and returns its code, with err filled on
 * failure. The child takes at most 1.5 × timeout (the Go side's budget);
 * the parent waits that and a second for the child's start, then kills it.
 */
static int isolated(const struct call *c, struct answer *a, char *err,
		    size_t errlen)
{
	int fds[2];
	pid_t pid;
	size_t got = 0;
	long long deadline;
	int rc;

	memset(a, 0, sizeof(*a));
	if (pipe2(fds, O_CLOEXEC)) {
		snprintf(err, errlen, "cannot start the gpufence client: pipe: %s", strerror(errno));
		return GPUFENCE_E_INVALID;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "cannot start the gpufence client: fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return GPUFENCE_E_INVALID;
	}
	if (pid == 0) {
		const char *p = (const char *)a;
		size_t n = 0;

		close(fds[0]);
		signal(SIGPIPE, SIG_IGN);
		run(c, a);
		while (n < sizeof(*a)) {
			ssize_t w = write(fds[1], p + n, sizeof(*a) - n);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				_exit(1);
			n += (size_t)w;
		}
		_exit(0);
	}
	close(fds[1]);
	deadline = now_ms() + c->cfg->timeout_s * 1500LL + 1000;
	while (got < sizeof(*a)) {
		struct pollfd pfd = { .fd = fds[0], .events = POLLIN };
		long long left = deadline - now_ms();
		ssize_t r;

		if (left <= 0) {
			kill(pid, SIGKILL);
			break;
		}
		rc = poll(&pfd, 1, (int)left);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc <= 0) {
			if (rc == 0)
				kill(pid, SIGKILL);
			break;
		}
		r = read(fds[0], (char *)a + got, sizeof(*a) - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fds[0]);
	reap(pid);
	if (got < sizeof(*a)) {
		snprintf(err, errlen, "the gpufence client process (pid %d) ended without an answer", (int)pid);
		return GPUFENCE_E_UNREACHABLE;
	}
	a->err[sizeof(a->err) - 1] = 0;
	a->res.step_cgroup[sizeof(a->res.step_cgroup) - 1] = 0;
	if (a->rc != GPUFENCE_OK)
		snprintf(err, errlen, "%s", a->err);
	return a->rc;
}

int gf_go_job_prolog(const struct gf_config *cfg, uint32_t job_id, uint32_t uid,
		     const char *job_gpus, char *err, size_t errlen)
{
	struct call c = { .kind = CALL_PROLOG, .cfg = cfg, .job_id = job_id, .uid = uid, .str = job_gpus };
	struct answer a;

	return isolated(&c, &a, err, errlen);
}

int gf_go_job_epilog(const struct gf_config *cfg, uint32_t job_id, char *err,
		     size_t errlen)
{
	struct call c = { .kind = CALL_EPILOG, .cfg = cfg, .job_id = job_id };
	struct answer a;

	return isolated(&c, &a, err, errlen);
}

int gf_go_step_start(const struct gf_config *cfg, uint32_t job_id,
		     uint32_t step_id, uint32_t uid, const char *step_gpus,
		     const int32_t *pids, int npids, struct gf_step_result *res,
		     char *err, size_t errlen)
{
	struct call c = { .kind = CALL_STEP_START, .cfg = cfg, .job_id = job_id, .step_id = step_id,
			  .uid = uid, .str = step_gpus, .pids = pids, .npids = npids };
	struct answer a;
	int rc = isolated(&c, &a, err, errlen);

	memset(res, 0, sizeof(*res));
	if (rc == GPUFENCE_OK)
		*res = a.res;
	return rc;
}

int gf_go_step_end(const struct gf_config *cfg, uint32_t job_id,
		   uint32_t step_id, char *err, size_t errlen)
{
	struct call c = { .kind = CALL_STEP_END, .cfg = cfg, .job_id = job_id, .step_id = step_id };
	struct answer a;

	return isolated(&c, &a, err, errlen);
}

int gf_go_step_channel(const struct gf_config *cfg, uint32_t job_id,
		       uint32_t step_id, struct gf_step_result *res, char *err,
		       size_t errlen)
{
	struct call c = { .kind = CALL_STEP_CHANNEL, .cfg = cfg, .job_id = job_id, .step_id = step_id };
	struct answer a;
	int rc = isolated(&c, &a, err, errlen);

	res->has_channel = 0;
	res->channel = 0;
	if (rc == GPUFENCE_OK) {
		res->has_channel = a.res.has_channel;
		res->channel = a.res.channel;
	}
	return rc;
}

int gf_go_spool_failopen(const struct gf_config *cfg, uint32_t job_id,
			 const char *step, uint32_t uid, const char *reason,
			 char *err, size_t errlen)
{
	struct call c = { .kind = CALL_SPOOL, .cfg = cfg, .job_id = job_id, .uid = uid, .str = step, .str2 = reason };
	struct answer a;

	return isolated(&c, &a, err, errlen);
}

void gf_describe_failure(const struct gf_config *cfg, int code,
			 const char *reason, char *msg, size_t msglen)
{
	switch (code) {
	case GF_E_LOAD:
		snprintf(msg, msglen, "cannot load the gpufence client library %s (%s)",
			 cfg->golib, reason);
		break;
	case GPUFENCE_E_REFUSED:
		snprintf(msg, msglen, "the gpufence agent refused: %s", reason);
		break;
	case GPUFENCE_E_UNREACHABLE:
		snprintf(msg, msglen, "cannot reach the gpufence agent at %s (%s)",
			 cfg->socket, reason);
		break;
	default:
		snprintf(msg, msglen, "internal error talking to the gpufence agent at %s (code %d: %s)",
			 cfg->socket, code, reason);
	}
}
