/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Calls into the Go client (spank_gpufence_go.so), each in a child process
 * forked for it, so that no Go runtime ever starts in the caller. Only
 * slurmstepd's parent process and the prolog/epilog process call these;
 * never srun, sbatch, salloc, slurmd or a forked task child.
 */
#ifndef GPUFENCE_GOLIB_H
#define GPUFENCE_GOLIB_H

#include <stddef.h>
#include <stdint.h>

#include "../goclient/goclient.h"
#include "args.h"

/* The Go library could not be loaded; err names the path and dlerror(). */
#define GF_E_LOAD 100

struct gf_step_result {
	uint32_t gpus[GPUFENCE_MAX_GPUS];
	int ngpus;
	int slurm_local_indices;
	/* The agent narrows IMEX channels: ask for the step's (StepChannel)
	 * from task_post_fork, before any task may exec. */
	int imex_pending;
	/* StepChannel's answer: the step's channel, when has_channel. */
	int has_channel;
	uint32_t channel;
	/* The step's cgroup as /proc/<pid>/cgroup names it; "" when the
	 * agent did not say (an older agent). */
	char step_cgroup[GPUFENCE_CGROUP_LEN];
};

/*
 * Each returns GPUFENCE_OK or a failure code (GPUFENCE_E_* or GF_E_LOAD) and
 * then fills err with the reason.
 */
int gf_go_job_prolog(const struct gf_config *cfg, uint32_t job_id, uint32_t uid,
		     const char *job_gpus, char *err, size_t errlen);
int gf_go_job_epilog(const struct gf_config *cfg, uint32_t job_id, char *err,
		     size_t errlen);
int gf_go_step_start(const struct gf_config *cfg, uint32_t job_id,
		     uint32_t step_id, uint32_t uid, const char *step_gpus,
		     const int32_t *pids, int npids, struct gf_step_result *res,
		     char *err, size_t errlen);
int gf_go_step_channel(const struct gf_config *cfg, uint32_t job_id,
		       uint32_t step_id, struct gf_step_result *res, char *err,
		       size_t errlen);
int gf_go_step_end(const struct gf_config *cfg, uint32_t job_id,
		   uint32_t step_id, char *err, size_t errlen);

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
