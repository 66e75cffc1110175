/* SPDX-License-Identifier: Apache-2.0 */
/* Callbacks in slurmstepd (S_CTX_REMOTE). */
#ifndef GPUFENCE_REMOTE_H
#define GPUFENCE_REMOTE_H

#include <slurm/spank.h>

/* Registers the step with the agent, its one exchange; never fails. */
int gf_remote_init(spank_t sp, int ac, char **av);
/*
 * Checks the task is in the registered step's cgroup (C, no exchange) and
 * sets the verdict its task_init reads; -1 only without the shared gate.
 */
int gf_remote_task_post_fork(spank_t sp);
/*
 * In the forked task child, as root, before it becomes the user: with
 * task_binding: slurm, connects to the agent for task_init's TaskBind.
 */
int gf_remote_task_init_privileged(spank_t sp);
/*
 * In the forked task child, as the user: C only; sends the task's binding
 * when the agent asked for it, renumbers GPU variables.
 */
int gf_remote_task_init(spank_t sp);

#endif
