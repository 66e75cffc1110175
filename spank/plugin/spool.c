/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "spool.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The room each string takes in a line, its quotes included. */
#define TIME_ROOM 64
#define STEP_ROOM 64
#define NODE_ROOM 512

struct out {
	char *p;
	size_t len, cap;
};

static void put(struct out *o, const char *s, size_t n)
{
	if (o->len + n <= o->cap) {
		memcpy(o->p + o->len, s, n);
		o->len += n;
	}
}

static void put_str(struct out *o, const char *s)
{
	put(o, s, strlen(s));
}

static void put_uint(struct out *o, uint32_t v)
{
	char b[16];

	put(o, b, (size_t)snprintf(b, sizeof(b), "%u", v));
}

/*
 * The length of the valid UTF-8 sequence at s (the Unicode standard's
 * table: no overlong form, no surrogate, nothing past U+10FFFF), or 0.
 */
static size_t utf8_len(const unsigned char *s)
{
	unsigned char c = s[0];
	unsigned char lo = 0x80, hi = 0xbf;
	size_t n, i;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4;
	else
		return 0;
	if (c == 0xe0)
		lo = 0xa0;
	else if (c == 0xed)
		hi = 0x9f;
	else if (c == 0xf0)
		lo = 0x90;
	else if (c == 0xf4)
		hi = 0x8f;
	if (s[1] < lo || s[1] > hi)
		return 0;
	for (i = 2; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	return n;
}

/*
 * s as a JSON string in at most room bytes, quotes included: cut before the
 * first character that would not fit, never inside one or its escape.
 */
static void put_json(struct out *o, const char *str, size_t room)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *s = (const unsigned char *)str;
	size_t end = o->len + room - 1; /* where the closing quote goes */

	put(o, "\"", 1);
	while (*s) {
		char e[8];
		const char *unit = e;
		size_t n, take = utf8_len(s);

		if (*s == '"' || *s == '\\') {
			e[0] = '\\';
			e[1] = (char)*s;
			n = 2;
		} else if (*s < 0x20 || *s == 0x7f) {
			n = (size_t)snprintf(e, sizeof(e), "\\u00%c%c", hex[*s >> 4], hex[*s & 15]);
		} else if (take == 3 && s[0] == 0xe2 && s[1] == 0x80 && (s[2] == 0xa8 || s[2] == 0xa9)) {
			/* U+2028, U+2029: line breaks to JavaScript. */
			n = (size_t)snprintf(e, sizeof(e), "\\u202%c", s[2] == 0xa8 ? '8' : '9');
		} else if (take == 0) {
			unit = "\xef\xbf\xbd"; /* U+FFFD for this byte */
			n = 3;
			take = 1;
		} else {
			unit = (const char *)s;
			n = take;
		}
		if (o->len + n > end)
			break;
		put(o, unit, n);
		s += take;
	}
	put(o, "\"", 1);
}

int gf_spool_line(char *buf, size_t cap, const struct gf_spool_rec *r)
{
	struct out o = { .p = buf, .cap = GF_SPOOL_LINE_MAX };
	size_t reason_room;

	if (cap < GF_SPOOL_LINE_MAX)
		return -1;
	put_str(&o, "{\"time\":");
	put_json(&o, r->time ? r->time : "", TIME_ROOM);
	put_str(&o, ",\"job_id\":");
	put_uint(&o, r->job_id);
	put_str(&o, ",\"step_id\":");
	put_json(&o, r->step ? r->step : "", STEP_ROOM);
	put_str(&o, ",\"uid\":");
	put_uint(&o, r->uid);
	put_str(&o, ",\"node\":");
	put_json(&o, r->node ? r->node : "", NODE_ROOM);
	put_str(&o, ",\"reason\":");
	/* The rest, less the closing brace and newline. */
	reason_room = GF_SPOOL_LINE_MAX - o.len - 2;
	put_json(&o, r->reason ? r->reason : "", reason_room);
	put_str(&o, "}\n");
	return (int)o.len;
}

/* --- appending --- */

/* "open spool /x: no such file or directory", as the client words it. */
static int fail(char *err, size_t errlen, const char *what, const char *path,
		int errnum)
{
	char e[128];

	snprintf(e, sizeof(e), "%s", strerror(errnum));
	e[0] = (char)tolower((unsigned char)e[0]);
	snprintf(err, errlen, "%s %.400s: %s", what, path, e);
	return -1;
}

/* What slurmstepd writes as root must be ours and writable by no one else. */
static int check_owner(const struct stat *st, const char *what,
		       const char *path, char *err, size_t errlen)
{
	if (st->st_uid != geteuid()) {
		snprintf(err, errlen, "%s %.400s: owned by uid %u, not %u", what,
			 path, (unsigned)st->st_uid, (unsigned)geteuid());
		return -1;
	}
	if (st->st_mode & 022) {
		snprintf(err, errlen, "%s %.400s: writable by others (mode 0%o)",
			 what, path, (unsigned)(st->st_mode & 07777));
		return -1;
	}
	return 0;
}

/* Makes dir and its missing parents (0700), then checks dir. */
static int spool_dir(const char *path, char *err, size_t errlen)
{
	char dir[PATH_MAX];
	char *slash;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash == dir)
		slash[1] = 0; /* the root folder */
	else
		*slash = 0;
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(dir, 0700) && errno != EEXIST)
			return fail(err, errlen, "spool folder", dir, errno);
		*p = '/';
	}
	if (mkdir(dir, 0700) && errno != EEXIST)
		return fail(err, errlen, "spool folder", dir, errno);
	if (lstat(dir, &st))
		return fail(err, errlen, "spool folder", dir, errno);
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "spool folder %.400s: not a folder", dir);
		return -1;
	}
	return check_owner(&st, "spool folder", dir, err, errlen);
}

static void pause_ms(long ms)
{
	struct timespec t = { .tv_sec = 0, .tv_nsec = ms * 1000000 };

	while (nanosleep(&t, &t) && errno == EINTR)
		;
}

/*
 * Tests (spank/internal/cspool) build with GF_SPOOL_TEST_STALL to stall a
 * writer where the scheduler may: after its open, and after its lock.
 */
#ifdef GF_SPOOL_TEST_STALL
void gf_spool_test_stall(void);
#define STALL() gf_spool_test_stall()
#else
#define STALL() ((void)0)
#endif

/* How often a writer opens the file again when the agent took it away. */
#define TRIES 500

int gf_spool_append(const char *path, uint32_t job_id, const char *step,
		    uint32_t uid, const char *reason, char *err, size_t errlen)
{
	char line[GF_SPOOL_LINE_MAX], when[32], node[256];
	struct gf_spool_rec rec = { .time = when, .job_id = job_id,
				    .step = step, .uid = uid, .node = node,
				    .reason = reason };
	struct timespec now;
	struct tm tm;
	int len;

	if (!path || path[0] != '/') {
		snprintf(err, errlen, "spool \"%.400s\": not an absolute path", path ? path : "");
		return -1;
	}
	if (spool_dir(path, err, errlen))
		return -1;
	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	if (gethostname(node, sizeof(node)))
		snprintf(node, sizeof(node), "unknown");
	node[sizeof(node) - 1] = 0;
	len = gf_spool_line(line, sizeof(line), &rec);

	for (int i = 0; i < TRIES; i++) {
		struct stat st, named;
		ssize_t n;
		int fd;

		/* O_NONBLOCK: nothing planted there (a FIFO) holds us. */
		fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
		if (fd < 0)
			return fail(err, errlen, "open spool", path, errno);
		if (fstat(fd, &st)) {
			fail(err, errlen, "spool", path, errno);
			close(fd);
			return -1;
		}
		if (!S_ISREG(st.st_mode)) {
			snprintf(err, errlen, "spool %.400s: not a regular file", path);
			close(fd);
			return -1;
		}
		if (check_owner(&st, "spool", path, err, errlen)) {
			close(fd);
			return -1;
		}
		STALL();
		/*
		 * The agent holds an exclusive lock only on a file it renamed
		 * away: open the name again. Holding ours, the file is ours
		 * to append to only while the name still leads to it (the
		 * agent renames before it locks, and reads after).
		 */
		if (flock(fd, LOCK_SH | LOCK_NB)) {
			int e = errno;

			close(fd);
			if (e != EWOULDBLOCK && e != EINTR)
				return fail(err, errlen, "lock spool", path, e);
			pause_ms(1);
			continue;
		}
		if (lstat(path, &named) || named.st_dev != st.st_dev || named.st_ino != st.st_ino) {
			close(fd);
			continue;
		}
		STALL();
		/* One write: lines of concurrent writers never interleave. */
		while ((n = write(fd, line, (size_t)len)) < 0 && errno == EINTR)
			;
		if (n < 0) {
			fail(err, errlen, "write spool", path, errno);
			close(fd);
			return -1;
		}
		if (close(fd))
			return fail(err, errlen, "write spool", path, errno);
		if (n != len) {
			snprintf(err, errlen, "write spool %.400s: wrote %zd of %d bytes", path, n, len);
			return -1;
		}
		return 0;
	}
	snprintf(err, errlen, "spool %.400s: taken away by the agent %d times in a row", path, TRIES);
	return -1;
}
