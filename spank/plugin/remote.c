/* SPDX-License-Identifier: Apache-2.0 */
/*
 * slurmstepd (remote context): register the step in init (its one exchange
 * with the agent), check in task_post_fork that each task is in the
 * registered step's cgroup, gate the tasks on that, renumber in task_init.
 * The step's end needs no call: the agent sees its cgroup go.
 */
#include "remote.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <slurm/slurm.h>

#include "args.h"
#include "client.h"
#include "log.h"
#include "renumber.h"
#include "spool.h"

#define ENV_LEN 4096

/*
 * What slurm_spank_init learned. Task children are forked after init and
 * before task_post_fork, so they inherit this copy and read it in task_init.
 */
static struct {
	bool have_config;
	struct gf_config cfg;
	bool registered; /* the agent answered StepStart in init */
	int rc;		 /* init's failure code when not registered */
	struct gf_step_result res;
	char reason[GPUFENCE_ERR_LEN * 2]; /* why not, for the logs and the batch refusal */
	char cause[GPUFENCE_ERR_LEN];	   /* the client's own words, for the spool */
} stash;

/*
 * The verdict task_post_fork reaches in the parent, shared with the task
 * children (MAP_SHARED, created in init before they are forked). Children
 * wait until every post_fork has returned, then read it in task_init: a step
 * the agent did not confirm exits there with the reason on the task's stderr
 * (srun's, or the batch job's output file) before anything of the user runs.
 * Failing task_post_fork itself would make srun report a launch failure yet
 * exit 0, and a failed batch launch drains the node. With failure=open, a
 * step whose agent was unreachable is marked unfiltered instead: its tasks
 * run, and say so.
 */
struct gate {
	int refused;
	int confirmed;
	int unfiltered; /* failure=open let the step run without the agent */
	int imex_asked; /* StepChannel was sent (first task's post_fork) */
	char msg[GPUFENCE_ERR_LEN * 3];
};
static struct gate *gate;

/*
 * task_binding: slurm, in one forked task child: the connection that
 * task_init_privileged made as root (the socket is root's only) and
 * task_init sends the task's binding on, or why it could not be made.
 * Each child has its own copy; the parent never sets it.
 */
static struct {
	int fd;
	int rc;
	char err[GPUFENCE_ERR_LEN];
} task_conn = { .fd = -1 };

static void gate_open(void)
{
	void *p;

	if (gate)
		return;
	p = mmap(NULL, sizeof(*gate), PROT_READ | PROT_WRITE,
		 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		gf_error("cannot map the task gate (%m); failed steps will be reported as launch failures");
		return;
	}
	gate = p;
}

static void gate_refuse(const char *msg)
{
	if (!gate)
		return;
	__atomic_store_n(&gate->refused, 1, __ATOMIC_SEQ_CST);
	snprintf(gate->msg, sizeof(gate->msg), "%s", msg);
}

static void step_name(uint32_t step_id, char *buf, size_t len)
{
	switch (step_id) {
	case SLURM_BATCH_SCRIPT:
		snprintf(buf, len, "batch");
		break;
	case SLURM_EXTERN_CONT:
		snprintf(buf, len, "extern");
		break;
	case SLURM_INTERACTIVE_STEP:
		snprintf(buf, len, "interactive");
		break;
	default:
		snprintf(buf, len, "%u", step_id);
	}
}

static int timeout_ms(void)
{
	return stash.cfg.timeout_s * 1000;
}

static bool is_batch(spank_t sp)
{
	uint32_t step_id;

	return spank_get_item(sp, S_JOB_STEPID, &step_id) == ESPANK_SUCCESS &&
	       step_id == SLURM_BATCH_SCRIPT;
}

static int step_ids(spank_t sp, uint32_t *job_id, uint32_t *step_id,
		    uint32_t *uid)
{
	uid_t u;

	if (spank_get_item(sp, S_JOB_ID, job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, step_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &u) != ESPANK_SUCCESS)
		return -1;
	*uid = (uint32_t)u;
	return 0;
}

/* The variable from the step's environment, or NULL when unset. */
static const char *job_env(spank_t sp, const char *name, char *buf, int len)
{
	spank_err_t rc = spank_getenv(sp, name, buf, len);

	if (rc == ESPANK_SUCCESS)
		return buf;
	if (rc != ESPANK_ENV_NOEXIST)
		gf_debug("cannot read %s from the step environment: %s", name,
			 spank_strerror(rc));
	return NULL;
}

int gf_remote_init(spank_t sp, int ac, char **av)
{
	uint32_t job_id, step_id, uid;
	char env[ENV_LEN], step[32], msg[GPUFENCE_ERR_LEN * 2];
	int rc;

	gate_open();
	/* Errors here do not reach srun: task_post_fork reports them. */
	if (gf_config_parse(ac, av, &stash.cfg, stash.reason,
			    sizeof(stash.reason))) {
		gf_error("%s", stash.reason);
		return 0;
	}
	stash.have_config = true;
	if (step_ids(sp, &job_id, &step_id, &uid)) {
		snprintf(stash.reason, sizeof(stash.reason),
			 "cannot read the job id, step id or uid from Slurm");
		gf_error("%s", stash.reason);
		return 0;
	}
	step_name(step_id, step, sizeof(step));
	/*
	 * The step's one exchange with the agent: its tries and their
	 * timeouts are all the step waits (1.5 x timeout at most); a failure
	 * here is the step's verdict, not tried again by later callbacks.
	 */
	rc = gf_client_step_start(stash.cfg.socket, timeout_ms(), job_id,
				  step_id, uid,
				  job_env(sp, "SLURM_STEP_GPUS", env, sizeof(env)),
				  NULL, 0, &stash.res, stash.cause,
				  sizeof(stash.cause));
	if (rc != GPUFENCE_OK) {
		stash.rc = rc;
		gf_describe_failure(stash.cfg.socket, rc, stash.cause, msg,
				    sizeof(msg));
		gf_error("job %u step %s: %s", job_id, step, msg);
		snprintf(stash.reason, sizeof(stash.reason), "%s", msg);
		return 0;
	}
	stash.registered = true;
	gf_debug("job %u step %s registered: %d GPUs%s, cgroup %s", job_id,
		 step, stash.res.ngpus,
		 stash.res.slurm_local_indices ? ", Slurm numbers them" : "",
		 stash.res.step_cgroup[0] ? stash.res.step_cgroup : "(not said)");
	return 0;
}

/*
 * Whether pid runs inside the cgroup step (as /proc/<pid>/cgroup names
 * cgroups): every task must be in the step whose policy the agent set
 * before it may exec. 0 when it is; otherwise -1 with where it is in where.
 */
static int task_in_step(pid_t pid, const char *step, char *where, size_t len)
{
	char path[64], line[GPUFENCE_CGROUP_LEN + 8];
	size_t n = strlen(step);
	FILE *f;
	int found = -1;

	snprintf(where, len, "(no cgroup v2 entry)");
	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	if (!(f = fopen(path, "re"))) {
		snprintf(where, len, "(%s: %m)", path);
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		char *cg;

		if (strncmp(line, "0::", 3))
			continue;
		cg = line + 3;
		cg[strcspn(cg, "\n")] = 0;
		snprintf(where, len, "%.*s", (int)(len - 1), cg);
		if (!strncmp(cg, step, n) && (cg[n] == 0 || cg[n] == '/'))
			found = 0;
		break;
	}
	fclose(f);
	return found;
}

/*
 * failure=open and the agent unreachable: the step runs without the device
 * filter. A refusal never gets here: it is the agent's decision and always
 * stops the step. The line reaches slurmd's log here and the user's output
 * from each task; the spool keeps a record for the audit trail.
 */
static void fail_open(uint32_t job_id, const char *step, uint32_t uid,
		      const char *reason, const char *msg)
{
	char line[GPUFENCE_ERR_LEN * 3], err[GPUFENCE_ERR_LEN];

	snprintf(line, sizeof(line),
		 "agent unreachable; failure=open lets job %u step %s run WITHOUT GPU isolation: %s",
		 job_id, step, msg);
	gf_error("%s", line);
	if (gate) {
		snprintf(gate->msg, sizeof(gate->msg), "%s", line);
		__atomic_store_n(&gate->unfiltered, 1, __ATOMIC_SEQ_CST);
	}
	if (gf_spool_append(stash.cfg.spool, job_id, step, uid, reason, err,
			    sizeof(err)))
		gf_error("job %u step %s: cannot record the step that runs WITHOUT GPU isolation in %s (%s); the line above is its only record",
			 job_id, step, stash.cfg.spool, err);
}

/*
 * Slurm's switch/nvidia_imex makes the job's IMEX channel node in
 * slurmstepd's own mount namespace after init (switch_g_job_init follows
 * spank_init), so the agent learns the channel here, once per step, before
 * any task may exec; until then the step opens no channel. 0 when the agent
 * has it (or the step needs none); else -1 with the reason in msg.
 */
static int imex_channel(uint32_t job_id, uint32_t step_id, const char *step,
			char *msg, size_t len)
{
	char reason[GPUFENCE_ERR_LEN];
	int rc;

	if (!stash.res.imex_pending)
		return 0;
	if (gate && __atomic_exchange_n(&gate->imex_asked, 1, __ATOMIC_SEQ_CST))
		return 0; /* an earlier task's post_fork asked; a failure refused the step */
	rc = gf_client_step_channel(stash.cfg.socket, timeout_ms(), job_id,
				    step_id, &stash.res, reason, sizeof(reason));
	if (rc != GPUFENCE_OK) {
		char why[GPUFENCE_ERR_LEN * 2];

		gf_describe_failure(stash.cfg.socket, rc, reason, why, sizeof(why));
		snprintf(msg, len, "cannot set the step's IMEX channel: %.900s", why);
		return -1;
	}
	if (stash.res.has_channel)
		gf_debug("job %u step %s: IMEX channel %u", job_id, step, stash.res.channel);
	else
		gf_debug("job %u step %s: no IMEX channel", job_id, step);
	return 0;
}

int gf_remote_task_post_fork(spank_t sp)
{
	uint32_t job_id = 0, step_id, uid;
	pid_t pid;
	int32_t pids[1];
	struct gf_step_result res;
	char env[ENV_LEN], step[32] = "?", reason[GPUFENCE_ERR_LEN],
		where[GPUFENCE_CGROUP_LEN], msg[GPUFENCE_ERR_LEN * 2],
		full[GPUFENCE_ERR_LEN * 3];
	int rc;

	/* The extern step calls this without a task: nothing to gate. */
	if (spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS || pid <= 0)
		return 0;
	if (!stash.have_config) {
		snprintf(msg, sizeof(msg), "%s", stash.reason);
	} else if (step_ids(sp, &job_id, &step_id, &uid)) {
		snprintf(msg, sizeof(msg), "cannot read the job id, step id or uid from Slurm");
	} else if (!stash.registered) {
		/* One verdict, log line and spool line per step, not per task. */
		if (gate && __atomic_load_n(&gate->unfiltered, __ATOMIC_SEQ_CST))
			return 0;
		step_name(step_id, step, sizeof(step));
		snprintf(msg, sizeof(msg), "%s", stash.reason);
		if (stash.rc == GPUFENCE_E_UNREACHABLE && stash.cfg.fail_open &&
		    !(gate && __atomic_load_n(&gate->refused, __ATOMIC_SEQ_CST))) {
			fail_open(job_id, step, uid, stash.cause, msg);
			return 0;
		}
	} else if (stash.res.step_cgroup[0]) {
		/* Checked here, with no second exchange with the agent. */
		step_name(step_id, step, sizeof(step));
		if (task_in_step(pid, stash.res.step_cgroup, where, sizeof(where)) != 0) {
			snprintf(msg, sizeof(msg), "task pid %d is in cgroup %.400s, not in its step's cgroup %.400s",
				 (int)pid, where, stash.res.step_cgroup);
		} else if (imex_channel(job_id, step_id, step, msg, sizeof(msg)) == 0) {
			if (gate)
				__atomic_add_fetch(&gate->confirmed, 1, __ATOMIC_SEQ_CST);
			return 0;
		}
	} else {
		/* An agent too old to name the step's cgroup checks the task. */
		step_name(step_id, step, sizeof(step));
		pids[0] = (int32_t)pid;
		rc = gf_client_step_start(stash.cfg.socket, timeout_ms(), job_id,
					  step_id, uid,
					  job_env(sp, "SLURM_STEP_GPUS", env, sizeof(env)),
					  pids, 1, &res, reason, sizeof(reason));
		if (rc == GPUFENCE_OK) {
			if (gate)
				__atomic_add_fetch(&gate->confirmed, 1, __ATOMIC_SEQ_CST);
			return 0;
		}
		gf_describe_failure(stash.cfg.socket, rc, reason, msg, sizeof(msg));
	}
	snprintf(full, sizeof(full),
		 "%s; refusing to start job %u step %s without GPU isolation (ask the cluster administrators to check the gpufence agent on this node)",
		 msg, job_id, step);
	if (!gate) {
		gf_error("%s", full);
		return -1;
	}
	/* The task prints it to the user; the log keeps it for admins. */
	gf_info("%s", full);
	gate_refuse(full);
	return 0;
}

int gf_remote_task_init_privileged(spank_t sp)
{
	(void)sp;
	/*
	 * Only for a step the agent asked to bind per task. The gate's
	 * verdict is not in yet (the parent's post_fork may still run): a
	 * refused step stops in task_init, and the agent sees the
	 * connection close unused.
	 */
	if (!stash.registered || !stash.res.task_bind)
		return 0;
	task_conn.rc = gf_client_task_connect(stash.cfg.socket, timeout_ms(),
					      &task_conn.fd, task_conn.err,
					      sizeof(task_conn.err));
	return 0;
}

/*
 * Sends the task's binding (Slurm's per-task CUDA_VISIBLE_DEVICES, set
 * before this callback) on the connection task_init_privileged made; the
 * agent narrows the task's cgroup to the step's GPUs it names. 0 with the
 * task's GPUs in res, 1 when the task keeps its step's GPUs (failure=open,
 * agent unreachable), -1 when the task must not run (msg says why).
 */
static int task_bind(spank_t sp, struct gf_task_result *res, char *msg,
		     size_t len)
{
	uint32_t job_id, step_id, uid, task_id = 0;
	char val[ENV_LEN], err[GPUFENCE_ERR_LEN], why[GPUFENCE_ERR_LEN * 2],
		step[32];
	int rc = task_conn.rc;

	if (step_ids(sp, &job_id, &step_id, &uid)) {
		snprintf(msg, len, "cannot read the job id, step id or uid from Slurm");
		if (task_conn.fd >= 0)
			close(task_conn.fd);
		return -1;
	}
	step_name(step_id, step, sizeof(step));
	if (spank_get_item(sp, S_TASK_GLOBAL_ID, &task_id) != ESPANK_SUCCESS)
		task_id = 0;
	if (task_conn.fd >= 0) {
		rc = gf_client_task_bind(task_conn.fd, timeout_ms(), job_id, step_id,
					 task_id,
					 job_env(sp, "CUDA_VISIBLE_DEVICES", val, sizeof(val)),
					 res, err, sizeof(err));
		task_conn.fd = -1;
	} else {
		snprintf(err, sizeof(err), "%s", task_conn.err);
	}
	if (rc == GPUFENCE_OK)
		return 0;
	gf_describe_failure(stash.cfg.socket, rc, err, why, sizeof(why));
	if (rc == GPUFENCE_E_UNREACHABLE && stash.cfg.fail_open) {
		/* The step's entry still holds: no other job's GPU opens. */
		gf_error("job %u step %s task %u: cannot set the task's own GPUs (%s); failure=open lets it run with its step's GPUs",
			 job_id, step, task_id, why);
		return 1;
	}
	snprintf(msg, len, "job %u step %s task %u: cannot set the task's own GPUs: %.900s; refusing to start the task (ask the cluster administrators to check the gpufence agent on this node)",
		 job_id, step, task_id, why);
	return -1;
}

static void renumber_var(spank_t sp, const char *name, const uint32_t *gpus,
			 int ngpus, int flags)
{
	char val[ENV_LEN], out[ENV_LEN];
	spank_err_t err;

	if (!job_env(sp, name, val, sizeof(val)))
		return;
	switch (gf_renumber(val, gpus, ngpus, flags, out, sizeof(out))) {
	case GF_RENUMBER_SET:
		if ((err = spank_setenv(sp, name, out, 1)) != ESPANK_SUCCESS)
			gf_error("cannot set %s=%s: %s", name, out,
				 spank_strerror(err));
		break;
	case GF_RENUMBER_ERROR:
		gf_error("%s=%s left as it is: renumbered value too long", name,
			 val);
		break;
	default:
		break;
	}
}

int gf_remote_task_init(spank_t sp)
{
	uint32_t env_gpus[GPUFENCE_MAX_GPUS];
	const uint32_t *gpus = stash.res.gpus;
	int ngpus = stash.res.ngpus;
	int flags = 0;
	struct gf_task_result tres;
	char msg[GPUFENCE_ERR_LEN * 3];

	if (gate) {
		bool refused = __atomic_load_n(&gate->refused, __ATOMIC_SEQ_CST);
		bool confirmed = __atomic_load_n(&gate->confirmed, __ATOMIC_SEQ_CST);

		if (!refused && !confirmed &&
		    __atomic_load_n(&gate->unfiltered, __ATOMIC_SEQ_CST)) {
			/* No filter hides a GPU: Slurm's numbering stands. */
			gf_error("%s", gate->msg);
			return 0;
		}
		if (refused || !confirmed || !stash.registered) {
			gf_error("%s", gate->msg[0] ? gate->msg :
				 "the step was not confirmed by the gpufence agent; refusing to start it without GPU isolation");
			return -1;
		}
		if (stash.res.slurm_local_indices)
			flags |= GF_RENUMBER_SLURM_LOCAL;
	} else if (stash.registered) {
		if (stash.res.slurm_local_indices)
			flags |= GF_RENUMBER_SLURM_LOCAL;
	} else if (is_batch(sp)) {
		gf_error("%s; refusing to run the batch script without GPU isolation (ask the cluster administrators to check the gpufence agent on this node)",
			 stash.reason[0] ? stash.reason : "the step was not registered with the gpufence agent");
		return -1;
	} else {
		/*
		 * No gate, and init did not reach the agent (post_fork then
		 * refused the step, which Slurm reports). Fall back to the
		 * variable Slurm overwrites for this kind of step; a forged
		 * value only misnumbers the user's own view, the kernel still
		 * decides what opens.
		 */
		uint32_t job_id, step_id, uid;
		char list[ENV_LEN];
		const char *var, *val;

		if (step_ids(sp, &job_id, &step_id, &uid))
			return 0;
		var = step_id == SLURM_BATCH_SCRIPT ? "SLURM_JOB_GPUS"
						    : "SLURM_STEP_GPUS";
		val = job_env(sp, var, list, sizeof(list));
		ngpus = gf_parse_gpu_list(val ? val : "", env_gpus,
					  GPUFENCE_MAX_GPUS);
		if (ngpus < 0) {
			gf_debug("%s=%s is not a GPU index list; GPU variables left as they are",
				 var, val);
			return 0;
		}
		gpus = env_gpus;
		flags |= GF_RENUMBER_LIST_FROM_ENV;
	}
	if (stash.registered && stash.res.task_bind) {
		/* CUDA numbers only what the task opens: renumber within it. */
		switch (task_bind(sp, &tres, msg, sizeof(msg))) {
		case 0:
			gpus = tres.gpus;
			ngpus = tres.ngpus;
			break;
		case 1:
			break;
		default:
			gf_error("%s", msg);
			return -1;
		}
	}
	renumber_var(sp, "CUDA_VISIBLE_DEVICES", gpus, ngpus, flags);
	renumber_var(sp, "GPU_DEVICE_ORDINAL", gpus, ngpus, flags);
	return 0;
}
