#define _GNU_SOURCE
#include "golib.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/*
 * The Go library, once loaded and checked. Go links it NODELETE and a Go
 * runtime cannot be unloaded, so it is never dlclose()d; a failed load is
 * tried again on the next call.
 */
static struct {
	void *handle;
	gpufence_job_prolog_fn job_prolog;
	gpufence_job_epilog_fn job_epilog;
	gpufence_step_start_fn step_start;
	gpufence_step_end_fn step_end;
	gpufence_spool_failopen_fn spool_failopen;
} go;

static int load(const char *path, char *err, size_t errlen)
{
	void *h;
	gpufence_abi_version_fn abi;
	const char *e;

	if (go.handle)
		return GPUFENCE_OK;
	dlerror();
	if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
		e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return GF_E_LOAD;
	}
	abi = (gpufence_abi_version_fn)dlsym(h, "gpufence_abi_version");
	go.job_prolog = (gpufence_job_prolog_fn)dlsym(h, "gpufence_job_prolog");
	go.job_epilog = (gpufence_job_epilog_fn)dlsym(h, "gpufence_job_epilog");
	go.step_start = (gpufence_step_start_fn)dlsym(h, "gpufence_step_start");
	go.step_end = (gpufence_step_end_fn)dlsym(h, "gpufence_step_end");
	go.spool_failopen = (gpufence_spool_failopen_fn)dlsym(
		h, "gpufence_spool_failopen");
	if (!abi || !go.job_prolog || !go.job_epilog || !go.step_start ||
	    !go.step_end || !go.spool_failopen) {
		snprintf(err, errlen, "%s: not a gpufence client library", path);
		return GF_E_LOAD;
	}
	if (abi() != GPUFENCE_GO_ABI) {
		snprintf(err, errlen,
			 "%s: client library ABI %d, this plugin needs %d (install matching versions)",
			 path, abi(), GPUFENCE_GO_ABI);
		return GF_E_LOAD;
	}
	go.handle = h;
	return GPUFENCE_OK;
}

static int timeout_ms(const struct gf_config *cfg)
{
	return cfg->timeout_s * 1000;
}

/* The Go side takes char *; it never writes through these. */
#define MUT(s) ((char *)(s))

int gf_go_job_prolog(const struct gf_config *cfg, uint32_t job_id, uint32_t uid,
		     const char *job_gpus, char *err, size_t errlen)
{
	int rc = load(cfg->golib, err, errlen);

	if (rc)
		return rc;
	return go.job_prolog(MUT(cfg->socket), timeout_ms(cfg), job_id, uid,
			     MUT(job_gpus), err, (int)errlen);
}

int gf_go_job_epilog(const struct gf_config *cfg, uint32_t job_id, char *err,
		     size_t errlen)
{
	int rc = load(cfg->golib, err, errlen);

	if (rc)
		return rc;
	return go.job_epilog(MUT(cfg->socket), timeout_ms(cfg), job_id, err,
			     (int)errlen);
}

int gf_go_step_start(const struct gf_config *cfg, uint32_t job_id,
		     uint32_t step_id, uint32_t uid, const char *step_gpus,
		     const int32_t *pids, int npids, struct gf_step_result *res,
		     char *err, size_t errlen)
{
	int rc = load(cfg->golib, err, errlen);

	memset(res, 0, sizeof(*res));
	if (rc)
		return rc;
	return go.step_start(MUT(cfg->socket), timeout_ms(cfg), job_id, step_id,
			     uid, MUT(step_gpus), (int32_t *)pids, npids,
			     res->gpus, GPUFENCE_MAX_GPUS, &res->ngpus,
			     &res->slurm_local_indices, err, (int)errlen);
}

int gf_go_step_end(const struct gf_config *cfg, uint32_t job_id,
		   uint32_t step_id, char *err, size_t errlen)
{
	int rc = load(cfg->golib, err, errlen);

	if (rc)
		return rc;
	return go.step_end(MUT(cfg->socket), timeout_ms(cfg), job_id, step_id,
			   err, (int)errlen);
}

int gf_go_spool_failopen(const struct gf_config *cfg, uint32_t job_id,
			 const char *step, uint32_t uid, const char *reason,
			 char *err, size_t errlen)
{
	int rc = load(cfg->golib, err, errlen);

	if (rc)
		return rc;
	return go.spool_failopen(MUT(cfg->spool), job_id, MUT(step), uid,
				 MUT(reason), err, (int)errlen);
}

void gf_describe_failure(const struct gf_config *cfg, int code,
			 const char *reason, char *msg, size_t msglen)
{
	switch (code) {
	case GF_E_LOAD:
		snprintf(msg, msglen, "cannot load the gpufence client library %s (%s)",
			 cfg->golib, reason);
		break;
	case GPUFENCE_E_REFUSED:
		snprintf(msg, msglen, "the gpufence agent refused: %s", reason);
		break;
	case GPUFENCE_E_UNREACHABLE:
		snprintf(msg, msglen, "cannot reach the gpufence agent at %s (%s)",
			 cfg->socket, reason);
		break;
	default:
		snprintf(msg, msglen, "internal error talking to the gpufence agent at %s (code %d: %s)",
			 cfg->socket, code, reason);
	}
}
