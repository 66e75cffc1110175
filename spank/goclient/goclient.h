/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The boundary between the C SPANK entry (spank_gpufence.so) and the Go
 * library (spank_gpufence_go.so), and the codes and sizes both sides use.
 * The C side speaks to the agent itself (spank/plugin/client.c); it
 * dlopen()s the Go library, in a child process, only to append the record of
 * a step that failure=open let run without the agent to the spool. The Go
 * side includes this header and a static assertion there fails its build if
 * an exported function stops matching the type declared here.
 *
 * Strings are NUL-terminated and owned by the caller. Every function fills
 * err (always NUL-terminated, truncated to errlen) when it returns anything
 * but GPUFENCE_OK.
 */
#ifndef GPUFENCE_GOCLIENT_H
#define GPUFENCE_GOCLIENT_H

#include <stdint.h>

/* Bumped whenever a type below changes; the C side refuses a library that
 * reports another value. 5: the exchanges with the agent moved to C. */
#define GPUFENCE_GO_ABI 5

/* Return codes. */
#define GPUFENCE_OK 0
/* The agent answered with an error; err holds its text, meant for users. */
#define GPUFENCE_E_REFUSED 1
/* The agent could not be reached, or did not answer in time. */
#define GPUFENCE_E_UNREACHABLE 2
/* The arguments were unusable (for example more GPUs than fit in gpus). */
#define GPUFENCE_E_INVALID 3

/* Room the C side keeps for GPU indices, error texts and cgroup paths. */
#define GPUFENCE_MAX_GPUS 256
#define GPUFENCE_ERR_LEN 512
#define GPUFENCE_CGROUP_LEN 4096

typedef int (*gpufence_abi_version_fn)(void);

/*
 * Appends one line for a step that failure=open lets run without GPU
 * isolation to the spool file at spool (format: spool.go); step_id is the
 * step's name (0, batch, extern, interactive) and reason why the agent was
 * unreachable. Any failure returns GPUFENCE_E_INVALID with err filled.
 */
typedef int (*gpufence_spool_failopen_fn)(char *spool, uint32_t job_id,
					  char *step_id, uint32_t uid,
					  char *reason, char *err, int errlen);

#endif
