/* SPDX-License-Identifier: Apache-2.0 */
/* Prolog/epilog (S_CTX_JOB_SCRIPT): the job's trusted GPU list. */
#include "job_script.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "client.h"
#include "log.h"

static int job_ids(spank_t sp, uint32_t *job_id, uint32_t *uid)
{
	uid_t u;

	if (spank_get_item(sp, S_JOB_ID, job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &u) != ESPANK_SUCCESS)
		return -1;
	*uid = (uint32_t)u;
	return 0;
}

int gf_job_prolog(spank_t sp, int ac, char **av)
{
	struct gf_config cfg;
	uint32_t job_id, uid;
	char reason[GPUFENCE_ERR_LEN], msg[GPUFENCE_ERR_LEN * 2];
	int rc;

	if (gf_config_parse(ac, av, &cfg, reason, sizeof(reason))) {
		gf_error("%s; job prolog skipped, the job's steps will get no GPU",
			 reason);
		return 0;
	}
	if (job_ids(sp, &job_id, &uid)) {
		gf_error("job prolog: cannot read the job id or uid from Slurm; the job's steps will get no GPU");
		return 0;
	}
	/*
	 * slurmd builds this environment from the job credential: the only
	 * GPU list a user cannot forge. Unset means a CPU-only job.
	 */
	rc = gf_client_job_prolog(cfg.socket, cfg.timeout_s * 1000, job_id, uid,
				  getenv("SLURM_JOB_GPUS"), reason,
				  sizeof(reason));
	if (rc != GPUFENCE_OK) {
		gf_describe_failure(cfg.socket, rc, reason, msg, sizeof(msg));
		gf_error("job %u prolog: %s; the job's steps will get no GPU",
			 job_id, msg);
	}
	return 0;
}

int gf_job_epilog(spank_t sp, int ac, char **av)
{
	struct gf_config cfg;
	uint32_t job_id, uid;
	char reason[GPUFENCE_ERR_LEN], msg[GPUFENCE_ERR_LEN * 2];
	int rc;

	if (gf_config_parse(ac, av, &cfg, reason, sizeof(reason))) {
		gf_error("%s; job epilog skipped", reason);
		return 0;
	}
	if (job_ids(sp, &job_id, &uid)) {
		gf_error("job epilog: cannot read the job id from Slurm");
		return 0;
	}
	rc = gf_client_job_epilog(cfg.socket, cfg.timeout_s * 1000, job_id,
				  reason, sizeof(reason));
	if (rc != GPUFENCE_OK) {
		gf_describe_failure(cfg.socket, rc, reason, msg, sizeof(msg));
		gf_error("job %u epilog: %s", job_id, msg);
	}
	return 0;
}
