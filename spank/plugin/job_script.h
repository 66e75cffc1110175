/* SPDX-License-Identifier: Apache-2.0 */
/* Callbacks in the prolog/epilog process (S_CTX_JOB_SCRIPT, root). */
#ifndef GPUFENCE_JOB_SCRIPT_H
#define GPUFENCE_JOB_SCRIPT_H

#include <slurm/spank.h>

/* Both always return 0: a failed prolog would drain the node. */
int gf_job_prolog(spank_t sp, int ac, char **av);
int gf_job_epilog(spank_t sp, int ac, char **av);

#endif
