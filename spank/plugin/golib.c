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
 * The call into the Go library runs in a child process forked for it: the
 * Go runtime is loaded and started there and exits with it, never in the
 * caller. A Go runtime living in slurmstepd would cost every step more
 * than the spool line itself: its start, a slower fork of each task, and
 * each of Slurm's uid switches signalling its threads (docs/architecture.md,
 * "Step launch cost"). The child writes its answer into a pipe.
 */

/* What the child sends back. */
struct answer {
	int rc;
	char err[GPUFENCE_ERR_LEN];
};

static gpufence_spool_failopen_fn spool_failopen;

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
	spool_failopen = (gpufence_spool_failopen_fn)dlsym(
		h, "gpufence_spool_failopen");
	if (!abi || !spool_failopen) {
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

/* The call: the spool line of a step failure=open let run. */
struct call {
	const struct gf_config *cfg;
	uint32_t job_id, uid;
	const char *step;
	const char *reason;
};

/* In the child: the call itself. */
static void run(const struct call *c, struct answer *a)
{
	a->rc = load(c->cfg->golib, a->err, sizeof(a->err));
	if (a->rc)
		return;
	a->rc = spool_failopen(MUT(c->cfg->spool), c->job_id, MUT(c->step),
				  c->uid, MUT(c->reason), a->err,
				  (int)sizeof(a->err));
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
	/* A spool line takes no agent; the budget of one call bounds it. */
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
	if (a->rc != GPUFENCE_OK)
		snprintf(err, errlen, "%s", a->err);
	return a->rc;
}

int gf_go_spool_failopen(const struct gf_config *cfg, uint32_t job_id,
			 const char *step, uint32_t uid, const char *reason,
			 char *err, size_t errlen)
{
	struct call c = { .cfg = cfg, .job_id = job_id, .uid = uid, .step = step, .reason = reason };
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
