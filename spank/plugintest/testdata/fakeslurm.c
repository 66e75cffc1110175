/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stand-in for the parts of Slurm a SPANK plugin calls, for plugin_test.go.
 * It dlopen()s the plugin (RTLD_NOW, so every Slurm symbol the plugin uses
 * must be stubbed here) and runs callbacks the way slurmstepd orders them.
 *
 *   fakeslurm PLUGIN CONTEXT STEP[,STEP...] [PLUGIN ARGS...]
 *
 * CONTEXT: local, remote, allocator, slurmd, job_script. STEPs: a callback
 * name without slurm_spank_ (init, job_prolog, task_post_fork, task_init,
 * exit, job_epilog), fork (fork a task child that waits, as slurmstepd's do), release (let it
 * run task_init and print its environment) or threads (how many the process runs: 1, no runtime started). Items come from FAKE_JOB_ID,
 * FAKE_STEP_ID, FAKE_UID; the job environment is this process's variables
 * prefixed JOB_. S_TASK_PID is the last forked child, else unavailable.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/spank.h>

static spank_context_t ctx;
static pid_t task_pid = -1;

static void logline(const char *level, const char *fmt, va_list ap)
{
	printf("%s: ", level);
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
}

void slurm_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	logline("error", fmt, ap);
	va_end(ap);
}

void slurm_info(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	logline("info", fmt, ap);
	va_end(ap);
}

void slurm_debug(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	logline("debug", fmt, ap);
	va_end(ap);
}

spank_context_t spank_context(void)
{
	return ctx;
}

const char *spank_strerror(spank_err_t err)
{
	static char buf[32];
	snprintf(buf, sizeof(buf), "spank error %d", (int)err);
	return buf;
}

static uint32_t envnum(const char *name)
{
	const char *v = getenv(name);
	return v ? (uint32_t)strtoul(v, NULL, 0) : 0;
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
	spank_err_t rc = ESPANK_SUCCESS;
	va_list ap;
	pid_t *pid;

	(void)sp;
	va_start(ap, item);
	switch (item) {
	case S_JOB_ID:
		*va_arg(ap, uint32_t *) = envnum("FAKE_JOB_ID");
		break;
	case S_JOB_STEPID:
		if (ctx != S_CTX_REMOTE)
			rc = ESPANK_NOT_AVAIL;
		else
			*va_arg(ap, uint32_t *) = envnum("FAKE_STEP_ID");
		break;
	case S_JOB_UID:
		*va_arg(ap, uid_t *) = envnum("FAKE_UID");
		break;
	case S_TASK_PID:
		pid = va_arg(ap, pid_t *);
		*pid = task_pid > 0 ? task_pid : 0;
		if (task_pid <= 0)
			rc = ESPANK_NOT_TASK;
		break;
	default:
		rc = ESPANK_NOT_AVAIL;
	}
	va_end(ap);
	return rc;
}

static void job_name(char *buf, size_t len, const char *var)
{
	snprintf(buf, len, "JOB_%s", var);
}

spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{
	char name[256];
	const char *v;

	(void)sp;
	if (ctx != S_CTX_REMOTE)
		return ESPANK_NOT_REMOTE;
	job_name(name, sizeof(name), var);
	if (!(v = getenv(name)))
		return ESPANK_ENV_NOEXIST;
	if ((int)strlen(v) >= len)
		return ESPANK_NOSPACE;
	strcpy(buf, v);
	return ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val,
			 int overwrite)
{
	char name[256];

	(void)sp;
	if (ctx != S_CTX_REMOTE)
		return ESPANK_NOT_REMOTE;
	job_name(name, sizeof(name), var);
	return setenv(name, val, overwrite) ? ESPANK_ERROR : ESPANK_SUCCESS;
}

static void print_env(const char *var)
{
	char name[256];
	const char *v;

	job_name(name, sizeof(name), var);
	v = getenv(name);
	printf("env %s=%s\n", var, v ? v : "(unset)");
}

/* The process's threads: 1 unless something (a Go runtime) started more. */
static int threads(void)
{
	char line[256];
	int n = -1;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Threads: %d", &n) == 1)
			break;
	fclose(f);
	return n;
}

/* How many descriptors the process has open (the one that counts not included). */
static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;
}

static int release_fd = -1;

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		spank_context_t ctx;
	} ctxs[] = {
		{ "local", S_CTX_LOCAL },	{ "remote", S_CTX_REMOTE },
		{ "allocator", S_CTX_ALLOCATOR }, { "slurmd", S_CTX_SLURMD },
		{ "job_script", S_CTX_JOB_SCRIPT },
	};
	void *h;
	char *steps, *step, *save;
	int pac;
	char **pav;

	if (argc < 4)
		return 2;
	for (size_t i = 0; i < sizeof(ctxs) / sizeof(ctxs[0]); i++)
		if (!strcmp(argv[2], ctxs[i].name))
			ctx = ctxs[i].ctx;
	if (ctx == S_CTX_ERROR)
		return 2;
	if (!(h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL))) {
		printf("dlopen: %s\n", dlerror());
		return 3;
	}
	pac = argc - 4;
	pav = argv + 4;
	steps = strdup(argv[3]);
	for (step = strtok_r(steps, ",", &save); step;
	     step = strtok_r(NULL, ",", &save)) {
		char sym[64];
		spank_f *fn;
		int rc;

		if (!strcmp(step, "fds")) {
			printf("fds %d\n", open_fds());
			continue;
		}
		if (!strcmp(step, "threads")) {
			printf("threads %d\n", threads());
			continue;
		}
		if (!strcmp(step, "fork")) {
			/* As slurmstepd: the task child blocks until the
			 * parent has run every task_post_fork. */
			int p[2];
			pid_t pid;

			if (pipe(p))
				return 4;
			fflush(stdout);
			if ((pid = fork()) == 0) {
				char c;

				close(p[1]);
				if (read(p[0], &c, 1) != 1)
					_exit(1);
				fn = (spank_f *)dlsym(h, "slurm_spank_task_init");
				rc = fn ? fn(NULL, pac, pav) : 0;
				printf("rc task_init %d\n", rc);
				print_env("CUDA_VISIBLE_DEVICES");
				print_env("GPU_DEVICE_ORDINAL");
				fflush(stdout);
				_exit(0);
			}
			close(p[0]);
			release_fd = p[1];
			task_pid = pid;
			continue;
		}
		if (!strcmp(step, "release")) {
			int status;

			if (write(release_fd, "x", 1) != 1)
				return 5;
			close(release_fd);
			waitpid(task_pid, &status, 0);
			continue;
		}
		snprintf(sym, sizeof(sym), "slurm_spank_%s", step);
		if (!(fn = (spank_f *)dlsym(h, sym))) {
			printf("rc %s absent\n", step);
			continue;
		}
		rc = fn(NULL, pac, pav);
		printf("rc %s %d\n", step, rc);
		if (!strcmp(step, "task_init")) {
			print_env("CUDA_VISIBLE_DEVICES");
			print_env("GPU_DEVICE_ORDINAL");
		}
		fflush(stdout);
	}
	free(steps);
	return 0;
}
