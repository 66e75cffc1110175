/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one call into the Go library (spank_gpufence_go.so): the fail-open
 * spool, in a child process forked for it, so that no Go runtime ever starts
 * in the caller. The exchanges with the agent are C (client.h). Only
 * slurmstepd's parent process calls this; never srun, sbatch, salloc,
 * slurmd or a forked task child.
 */
#ifndef GPUFENCE_GOLIB_H
#define GPUFENCE_GOLIB_H

#include <stddef.h>
#include <stdint.h>

#include "../goclient/goclient.h"
#include "args.h"
#include "client.h"

/* The Go library could not be loaded; err names the path and dlerror(). */
#define GF_E_LOAD 100

/*
 * Appends the record of a step failure=open let run without GPU isolation to
 * cfg->spool; step is its name (0, batch, extern, interactive).
 */
int gf_go_spool_failopen(const struct gf_config *cfg, uint32_t job_id,
			 const char *step, uint32_t uid, const char *reason,
			 char *err, size_t errlen);

/*
 * Writes a message for users and administrators about a failed call into
 * msg: what failed, at which socket or path, and why.
 */
void gf_describe_failure(const struct gf_config *cfg, int code,
			 const char *reason, char *msg, size_t msglen);

#endif
