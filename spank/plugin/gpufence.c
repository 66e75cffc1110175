/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpufence SPANK plugin: the C entry Slurm loads in every context, and all
 * of the plugin: its exchanges with the agent (client.c) and the fail-open
 * spool (spool.c) are plain system calls in the calling process, so no
 * other runtime ever starts in srun, sbatch, salloc, slurmd or slurmstepd
 * and nothing forks a multi-threaded slurmstepd (docs/architecture.md).
 */
#include <slurm/spank.h>

#include "args.h"
#include "job_script.h"
#include "log.h"
#include "remote.h"

SPANK_PLUGIN(gpufence, 1)

/* A bad plugstack.conf line fails srun, sbatch and slurmd where it is seen. */
static int check_config(int ac, char **av)
{
	struct gf_config cfg;
	char err[512];

	if (gf_config_parse(ac, av, &cfg, err, sizeof(err))) {
		gf_error("%s", err);
		return -1;
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	switch (spank_context()) {
	case S_CTX_REMOTE:
		return gf_remote_init(sp, ac, av);
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
	case S_CTX_SLURMD:
		return check_config(ac, av);
	default:
		return 0;
	}
}

int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
	switch (spank_context()) {
	case S_CTX_JOB_SCRIPT:
		return gf_job_prolog(sp, ac, av);
	default:
		return 0;
	}
}

int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	switch (spank_context()) {
	case S_CTX_REMOTE:
		return gf_remote_task_post_fork(sp);
	default:
		return 0;
	}
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	switch (spank_context()) {
	case S_CTX_REMOTE:
		return gf_remote_task_init_privileged(sp);
	default:
		return 0;
	}
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	switch (spank_context()) {
	case S_CTX_REMOTE:
		return gf_remote_task_init(sp);
	default:
		return 0;
	}
}

int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	switch (spank_context()) {
	case S_CTX_JOB_SCRIPT:
		return gf_job_epilog(sp, ac, av);
	default:
		return 0;
	}
}
