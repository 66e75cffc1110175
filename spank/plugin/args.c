/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "args.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define KNOWN "(known: socket, timeout, failure, spool)"

/*
 * "%.*s%s" arguments quoting at most GF_ARG_SHOWN bytes of an argument, so
 * that what is wrong with a long one still fits the message.
 */
#define SHOWN(a)                                                        \
	(int)(strlen(a) > GF_ARG_SHOWN ? GF_ARG_SHOWN : strlen(a)), (a), \
		(strlen(a) > GF_ARG_SHOWN ? "..." : "")

static int set_path(char *dst, size_t size, const char *arg, const char *val,
		    char *err, size_t errlen)
{
	if (val[0] != '/') {
		snprintf(err, errlen,
			 "option \"%.*s%s\" in plugstack.conf: not an absolute path",
			 SHOWN(arg));
		return -1;
	}
	if (strlen(val) >= size) {
		snprintf(err, errlen,
			 "option \"%.*s%s\" in plugstack.conf: longer than %zu bytes",
			 SHOWN(arg), size - 1);
		return -1;
	}
	strcpy(dst, val);
	return 0;
}

static int set_timeout(int *dst, const char *arg, const char *val, char *err,
		       size_t errlen)
{
	long v = 0;
	const char *p;

	/* Digits only: strtol alone would take blanks and a sign. */
	for (p = val; *p >= '0' && *p <= '9' && v <= 3600; p++)
		v = v * 10 + (*p - '0');
	for (; *p >= '0' && *p <= '9'; p++)
		;
	if (p == val || *p || v < 1 || v > 3600) {
		snprintf(err, errlen,
			 "option \"%.*s%s\" in plugstack.conf: want whole seconds from 1 to 3600",
			 SHOWN(arg));
		return -1;
	}
	*dst = (int)v;
	return 0;
}

static int set_failure(int *dst, const char *arg, const char *val, char *err,
		       size_t errlen)
{
	if (!strcmp(val, "closed") || !strcmp(val, "open")) {
		*dst = val[0] == 'o';
		return 0;
	}
	snprintf(err, errlen,
		 "option \"%.*s%s\" in plugstack.conf: want closed or open",
		 SHOWN(arg));
	return -1;
}

enum opt { OPT_SOCKET, OPT_TIMEOUT, OPT_FAILURE, OPT_SPOOL, NOPTS };

static const char *const opt_names[NOPTS] = {
	[OPT_SOCKET] = "socket",   [OPT_TIMEOUT] = "timeout",
	[OPT_FAILURE] = "failure", [OPT_SPOOL] = "spool",
};

int gf_config_parse(int ac, char **av, struct gf_config *cfg, char *err,
		    size_t errlen)
{
	bool seen[NOPTS] = { false };

	memset(cfg, 0, sizeof(*cfg));
	strcpy(cfg->socket, GF_DEFAULT_SOCKET);
	cfg->timeout_s = GF_DEFAULT_TIMEOUT_S;
	strcpy(cfg->spool, GF_DEFAULT_SPOOL);

	for (int i = 0; i < ac; i++) {
		const char *arg = av[i];
		const char *eq = strchr(arg, '=');
		const char *val = eq ? eq + 1 : NULL;
		size_t klen = eq ? (size_t)(eq - arg) : 0;
		int o, rc;

		/*
		 * golib= named the Go library that wrote the spool before the
		 * plugin wrote it itself: a line that still has it loads.
		 */
		if (eq && klen == 5 && !strncmp(arg, "golib", 5))
			continue;
		for (o = 0; o < NOPTS; o++)
			if (eq && strlen(opt_names[o]) == klen &&
			    !strncmp(arg, opt_names[o], klen))
				break;
		if (o == NOPTS) {
			snprintf(err, errlen,
				 "unknown option \"%.*s%s\" in plugstack.conf " KNOWN,
				 SHOWN(arg));
			return -1;
		}
		if (seen[o]) {
			snprintf(err, errlen,
				 "option \"%.*s\" given twice in plugstack.conf",
				 (int)klen, arg);
			return -1;
		}
		seen[o] = true;
		switch (o) {
		case OPT_SOCKET:
			rc = set_path(cfg->socket, sizeof(cfg->socket), arg,
				      val, err, errlen);
			break;
		case OPT_TIMEOUT:
			rc = set_timeout(&cfg->timeout_s, arg, val, err,
					 errlen);
			break;
		case OPT_FAILURE:
			rc = set_failure(&cfg->fail_open, arg, val, err,
					 errlen);
			break;
		default:
			rc = set_path(cfg->spool, sizeof(cfg->spool), arg, val,
				      err, errlen);
		}
		if (rc)
			return rc;
	}
	return 0;
}
