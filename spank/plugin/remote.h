/* Callbacks in slurmstepd (S_CTX_REMOTE). */
#ifndef GPUFENCE_REMOTE_H
#define GPUFENCE_REMOTE_H

#include <slurm/spank.h>

/* Registers the step with the agent (no task pids yet); never fails. */
int gf_remote_init(spank_t sp, int ac, char **av);
/* Registers the task pid; -1 (the tasks are killed) when the agent did not accept it. */
int gf_remote_task_post_fork(spank_t sp);
/* In the forked task child, as the user: C only, renumbers GPU variables. */
int gf_remote_task_init(spank_t sp);
/* Tells the agent the step ended; errors are logged only. */
int gf_remote_exit(spank_t sp);

#endif
