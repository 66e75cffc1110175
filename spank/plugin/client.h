/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin's exchanges with the node agent, in C, in the calling process:
 * proto/gpufence/v1/agent.proto as varint-length-delimited frames on the
 * agent's root-only unix socket. No Go runtime starts for them: its start
 * alone costs a step more CPU than the whole exchange (docs/architecture.md,
 * "Step launch cost"). Only slurmstepd's parent process and the prolog and
 * epilog process call these; never srun, sbatch, salloc or slurmd, and a
 * forked task child only the TaskBind pair (plain system calls).
 *
 * spank/internal/cwire holds the encoding to the generated Go types both
 * ways and runs these against a real socket.
 */
#ifndef GPUFENCE_CLIENT_H
#define GPUFENCE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

/* Return codes. */
#define GPUFENCE_OK 0
/* The agent answered with an error; err holds its text, meant for users. */
#define GPUFENCE_E_REFUSED 1
/* The agent could not be reached, or did not answer in time. */
#define GPUFENCE_E_UNREACHABLE 2
/* The arguments were unusable (for example more GPUs than fit in gpus). */
#define GPUFENCE_E_INVALID 3

/* Room kept for GPU indices, error texts and cgroup paths. */
#define GPUFENCE_MAX_GPUS 256
#define GPUFENCE_ERR_LEN 512
#define GPUFENCE_CGROUP_LEN 4096

/* proto/wire's MaxFrameSize: the agent takes no bigger frame, nor do we. */
#define GF_MAX_FRAME (64 << 10)

struct gf_step_result {
	uint32_t gpus[GPUFENCE_MAX_GPUS]; /* ascending, no duplicates */
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
	/* The agent narrows each task to its binding (task_binding: slurm):
	 * each task sends TaskBind before it execs. */
	int task_bind;
};

/* TaskBind's answer: the GPUs the task may open, ascending. */
struct gf_task_result {
	uint32_t gpus[GPUFENCE_MAX_GPUS];
	int ngpus;
};

/*
 * The part of a Response the plugin uses. Strings point into the decoded
 * buffer and are not NUL-terminated.
 */
struct gf_response {
	const char *error;
	size_t error_len;
	uint32_t gpus[GPUFENCE_MAX_GPUS];
	int ngpus;	/* how many are in gpus */
	int gpus_total; /* how many the agent sent (more than fit: refused) */
	int slurm_local;
	const char *step_cgroup;
	size_t step_cgroup_len;
	int imex_pending;
	int has_channel;
	uint32_t channel;
	int task_bind;
};

/*
 * Request encoders: each writes one framed Request (length, then the message
 * with the protocol version and one message of the oneof) into buf and
 * returns its length, or -1 when it would not fit in cap or GF_MAX_FRAME.
 * A NULL list leaves its field out (unset: a CPU-only job); "" is sent as
 * present and empty.
 */
int gf_wire_job_prolog(uint8_t *buf, size_t cap, uint32_t job_id, uint32_t uid,
		       const char *job_gpus);
int gf_wire_job_epilog(uint8_t *buf, size_t cap, uint32_t job_id);
int gf_wire_step_start(uint8_t *buf, size_t cap, uint32_t job_id,
		       uint32_t step_id, uint32_t uid, const char *step_gpus,
		       const uint32_t *pids, int npids);
int gf_wire_step_channel(uint8_t *buf, size_t cap, uint32_t job_id,
			 uint32_t step_id);
int gf_wire_task_bind(uint8_t *buf, size_t cap, uint32_t job_id,
		      uint32_t step_id, uint32_t task_id, const char *visible);

/* The room gf_client_task_bind gives its frame: a task's list is short. */
#define GF_TASK_BIND_FRAME 8192

/*
 * Decodes a Response (without its length prefix) as protobuf does: unknown
 * fields are skipped (a newer agent may add some), the last of a repeated
 * scalar wins. 0, or -1 when b is not a well-formed message.
 */
int gf_wire_parse_response(const uint8_t *b, size_t n, struct gf_response *r);

/*
 * One call: the request, and when the agent could not be reached or did not
 * answer in time, once more, within 1.5 x timeout_ms in all. A refusal is
 * the agent's decision and is not asked twice. Once an exchange on the node
 * has had no answer within its timeout, each call for GF_HUNG_WINDOW_S
 * makes one try of GF_PROBE_MS only (fail fast), until the agent answers
 * one: a marker <socket>.hung in the socket's folder says when (client.c). Each returns
 * GPUFENCE_OK or GPUFENCE_E_REFUSED (err: the agent's words, or a listener
 * that is not root), GPUFENCE_E_UNREACHABLE (err: why, e.g. "no answer
 * within 5s") or GPUFENCE_E_INVALID, with err filled on failure.
 */
int gf_client_job_prolog(const char *socket, int timeout_ms, uint32_t job_id,
			 uint32_t uid, const char *job_gpus, char *err,
			 size_t errlen);
int gf_client_job_epilog(const char *socket, int timeout_ms, uint32_t job_id,
			 char *err, size_t errlen);
/* pids: the tasks to check (an older agent's post_fork check), or none. */
int gf_client_step_start(const char *socket, int timeout_ms, uint32_t job_id,
			 uint32_t step_id, uint32_t uid, const char *step_gpus,
			 const int32_t *pids, int npids,
			 struct gf_step_result *res, char *err, size_t errlen);
/* Fills res->has_channel and res->channel only. */
int gf_client_step_channel(const char *socket, int timeout_ms, uint32_t job_id,
			   uint32_t step_id, struct gf_step_result *res,
			   char *err, size_t errlen);

/*
 * TaskBind in two halves, for a forked task (task_binding: slurm). In
 * task_init_privileged, as root: connect (with call()'s second try) and
 * check the listener, *fd the connected socket (close-on-exec). In
 * task_init, as the user, after Slurm set the task's GPU variables: send
 * TaskBind on it, read the answer (one try: the socket cannot be connected
 * again without root) and close it. Codes as above.
 */
int gf_client_task_connect(const char *socket, int timeout_ms, int *fd,
			   char *err, size_t errlen);
int gf_client_task_bind(int fd, int timeout_ms, uint32_t job_id,
			uint32_t step_id, uint32_t task_id, const char *visible,
			struct gf_task_result *res, char *err, size_t errlen);

/* The pause between the two tries, in ms. */
#define GF_RETRY_PAUSE_MS 200
/* A try's budget once the agent is known hung, in ms. */
#define GF_PROBE_MS 250
/* How long an exchange's timeout with no answer makes later calls fail fast. */
#define GF_HUNG_WINDOW_S 30

/*
 * Writes a message for users and administrators about a failed call into
 * msg: what failed, at which socket, and why.
 */
void gf_describe_failure(const char *socket, int code, const char *reason,
			 char *msg, size_t msglen);

#endif
