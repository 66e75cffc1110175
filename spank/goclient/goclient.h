/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The boundary between the C SPANK entry (spank_gpufence.so) and the Go
 * client (spank_gpufence_go.so). The C side dlopen()s the Go library and
 * looks these functions up by name; the Go side includes this header and
 * a static assertion there fails its build if an exported function stops
 * matching the type declared here.
 *
 * Strings are NUL-terminated and owned by the caller. A NULL string means
 * "absent" (not sent to the agent), which is not the same as "". Every
 * function fills err (always NUL-terminated, truncated to errlen) when it
 * returns anything but GPUFENCE_OK.
 */
#ifndef GPUFENCE_GOCLIENT_H
#define GPUFENCE_GOCLIENT_H

#include <stdint.h>

/* Bumped whenever a type below changes; the C side refuses a library that
 * reports another value. */
#define GPUFENCE_GO_ABI 4

/* Return codes. */
#define GPUFENCE_OK 0
/* The agent answered with an error; err holds its text, meant for users. */
#define GPUFENCE_E_REFUSED 1
/* The agent could not be reached, or did not answer in time. */
#define GPUFENCE_E_UNREACHABLE 2
/* The arguments were unusable (for example more GPUs than fit in gpus). */
#define GPUFENCE_E_INVALID 3

/*
 * timeout_ms bounds one try; a call that gets no answer tries once more and
 * takes at most 1.5 × timeout_ms in all (a refusal is never retried).
 */

/* Room the C side keeps for GPU indices and error texts. */
#define GPUFENCE_MAX_GPUS 256
#define GPUFENCE_ERR_LEN 512

typedef int (*gpufence_abi_version_fn)(void);

typedef int (*gpufence_job_prolog_fn)(char *socket, int timeout_ms,
				      uint32_t job_id, uint32_t uid,
				      char *job_gpus, char *err, int errlen);

typedef int (*gpufence_job_epilog_fn)(char *socket, int timeout_ms,
				      uint32_t job_id, char *err, int errlen);

/* Room for the step's cgroup path (as /proc/<pid>/cgroup writes it). */
#define GPUFENCE_CGROUP_LEN 4096

/*
 * pids/npids: the task pids (npids may be 0). On GPUFENCE_OK, gpus[0..*ngpus)
 * holds the global GPU indices the step may open, ascending,
 * *slurm_local_indices is 1 when Slurm already numbers CUDA_VISIBLE_DEVICES
 * locally, *imex_pending is 1 when the step must send StepChannel from
 * task_post_fork (ABI 4), and step_cgroup the step's cgroup as /proc/<pid>/cgroup names it
 * ("" from an agent too old to say).
 */
typedef int (*gpufence_step_start_fn)(char *socket, int timeout_ms,
				      uint32_t job_id, uint32_t step_id,
				      uint32_t uid, char *step_gpus,
				      int32_t *pids, int npids,
				      uint32_t *gpus, int gpus_cap, int *ngpus,
				      int *slurm_local_indices, int *imex_pending,
				      char *step_cgroup, int step_cgroup_len,
				      char *err, int errlen);

/*
 * From task_post_fork, when step_start set *imex_pending: the agent reads
 * the step's IMEX channel from the caller's own mount namespace. On
 * GPUFENCE_OK, *has_channel is 1 and *channel the channel, or 0: none.
 */
typedef int (*gpufence_step_channel_fn)(char *socket, int timeout_ms,
					uint32_t job_id, uint32_t step_id,
					int *has_channel, uint32_t *channel,
					char *err, int errlen);

typedef int (*gpufence_step_end_fn)(char *socket, int timeout_ms,
				    uint32_t job_id, uint32_t step_id,
				    char *err, int errlen);

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
