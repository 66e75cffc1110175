#define _GNU_SOURCE
#include "args.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KNOWN "(known: socket, timeout, golib)"

static int set_path(char *dst, size_t size, const char *key, const char *val,
		    char *err, size_t errlen)
{
	if (val[0] != '/') {
		snprintf(err, errlen,
			 "option \"%s=%s\" in plugstack.conf: not an absolute path",
			 key, val);
		return -1;
	}
	if (strlen(val) >= size) {
		snprintf(err, errlen,
			 "option \"%s=%s\" in plugstack.conf: longer than %zu bytes",
			 key, val, size - 1);
		return -1;
	}
	strcpy(dst, val);
	return 0;
}

static int set_timeout(int *dst, const char *val, char *err, size_t errlen)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(val, &end, 10);
	if (errno || end == val || *end || val[0] == '+' || val[0] == '-' ||
	    v < 1 || v > 3600) {
		snprintf(err, errlen,
			 "option \"timeout=%s\" in plugstack.conf: want whole seconds from 1 to 3600",
			 val);
		return -1;
	}
	*dst = (int)v;
	return 0;
}

/* The directory this plugin was loaded from, for the default golib. */
static int default_golib(char *dst, size_t size, char *err, size_t errlen)
{
	Dl_info info;
	const char *slash;

	if (!dladdr((void *)gf_config_parse, &info) || !info.dli_fname ||
	    !(slash = strrchr(info.dli_fname, '/'))) {
		snprintf(err, errlen,
			 "cannot tell where this plugin was loaded from; set golib=PATH in plugstack.conf");
		return -1;
	}
	if (snprintf(dst, size, "%.*s/%s", (int)(slash - info.dli_fname),
		     info.dli_fname, GF_GOLIB_NAME) >= (int)size) {
		snprintf(err, errlen, "plugin path too long; set golib=PATH in plugstack.conf");
		return -1;
	}
	return 0;
}

int gf_config_parse(int ac, char **av, struct gf_config *cfg, char *err,
		    size_t errlen)
{
	bool seen_socket = false, seen_timeout = false, seen_golib = false;

	memset(cfg, 0, sizeof(*cfg));
	strcpy(cfg->socket, GF_DEFAULT_SOCKET);
	cfg->timeout_s = GF_DEFAULT_TIMEOUT_S;

	for (int i = 0; i < ac; i++) {
		const char *arg = av[i];
		const char *eq = strchr(arg, '=');
		const char *val = eq ? eq + 1 : NULL;
		size_t klen = eq ? (size_t)(eq - arg) : 0;
		bool *seen;
		int rc;

		if (eq && klen == 6 && !strncmp(arg, "socket", klen))
			seen = &seen_socket;
		else if (eq && klen == 7 && !strncmp(arg, "timeout", klen))
			seen = &seen_timeout;
		else if (eq && klen == 5 && !strncmp(arg, "golib", klen))
			seen = &seen_golib;
		else {
			snprintf(err, errlen,
				 "unknown option \"%s\" in plugstack.conf " KNOWN,
				 arg);
			return -1;
		}
		if (*seen) {
			snprintf(err, errlen,
				 "option \"%.*s\" given twice in plugstack.conf",
				 (int)klen, arg);
			return -1;
		}
		*seen = true;
		if (seen == &seen_socket)
			rc = set_path(cfg->socket, sizeof(cfg->socket),
				      "socket", val, err, errlen);
		else if (seen == &seen_timeout)
			rc = set_timeout(&cfg->timeout_s, val, err, errlen);
		else
			rc = set_path(cfg->golib, sizeof(cfg->golib), "golib",
				      val, err, errlen);
		if (rc)
			return rc;
	}
	if (!seen_golib)
		return default_golib(cfg->golib, sizeof(cfg->golib), err,
				     errlen);
	return 0;
}
