/* SPDX-License-Identifier: Apache-2.0 */
/* The plugin's arguments on its plugstack.conf line. */
#ifndef GPUFENCE_ARGS_H
#define GPUFENCE_ARGS_H

#include <limits.h>
#include <stddef.h>

#define GF_DEFAULT_SOCKET "/run/gpufence/agent.sock"
#define GF_DEFAULT_TIMEOUT_S 5
#define GF_DEFAULT_SPOOL "/var/spool/gpufence/failopen.jsonl"
/* Bytes of an argument an error message quotes; longer ones are cut. */
#define GF_ARG_SHOWN 80

struct gf_config {
	char socket[108]; /* sizeof(sockaddr_un.sun_path) */
	int timeout_s;
	/* failure=open: a step the agent cannot be reached for runs unfiltered. */
	int fail_open;
	char spool[PATH_MAX]; /* where such steps are recorded */
};

/*
 * Fills cfg from the defaults and then av[0..ac): socket=PATH, timeout=SECONDS,
 * failure=closed|open, spool=PATH. Returns 0, or -1 with a message for the
 * administrator in err (naming the bad option) on an unknown key, a repeated
 * key or a bad value. golib=, the Go library of older versions, is ignored.
 */
int gf_config_parse(int ac, char **av, struct gf_config *cfg, char *err,
		    size_t errlen);

#endif
