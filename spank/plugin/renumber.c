#include "renumber.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads one decimal entry ending at ',' or NUL; *end points past it. */
static bool parse_index(const char *s, uint32_t *v, const char **end)
{
	uint64_t acc = 0;
	const char *p = s;

	if (*p < '0' || *p > '9')
		return false;
	for (; *p >= '0' && *p <= '9'; p++) {
		acc = acc * 10 + (uint64_t)(*p - '0');
		if (acc > UINT32_MAX)
			return false;
	}
	if (*p != ',' && *p != '\0')
		return false;
	*v = (uint32_t)acc;
	*end = p;
	return true;
}

static int position(uint32_t e, const uint32_t *gpus, int ngpus)
{
	for (int i = 0; i < ngpus; i++)
		if (gpus[i] == e)
			return i;
	return -1;
}

int gf_renumber(const char *value, const uint32_t *gpus, int ngpus, int flags,
		char *out, size_t outlen)
{
	const char *p;
	size_t used = 0;

	if (!value || !*value || (flags & GF_RENUMBER_SLURM_LOCAL))
		return GF_RENUMBER_KEEP;

	/* First pass: only plain numbers, else keep the value as it is. */
	for (p = value;;) {
		uint32_t e;
		const char *end;

		if (!parse_index(p, &e, &end))
			return GF_RENUMBER_KEEP;
		if ((flags & GF_RENUMBER_LIST_FROM_ENV) &&
		    position(e, gpus, ngpus) < 0)
			return GF_RENUMBER_KEEP;
		if (*end == '\0')
			break;
		p = end + 1;
	}

	if (outlen == 0)
		return GF_RENUMBER_ERROR;
	out[0] = '\0';
	for (p = value;;) {
		uint32_t e;
		const char *end;
		int pos;

		if (!parse_index(p, &e, &end)) /* checked above */
			return GF_RENUMBER_KEEP;
		pos = position(e, gpus, ngpus);
		if (pos >= 0) {
			int n = snprintf(out + used, outlen - used, "%s%d",
					 used ? "," : "", pos);
			if (n < 0 || (size_t)n >= outlen - used)
				return GF_RENUMBER_ERROR;
			used += (size_t)n;
		}
		if (*end == '\0')
			break;
		p = end + 1;
	}
	return GF_RENUMBER_SET;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

int gf_parse_gpu_list(const char *s, uint32_t *out, int cap)
{
	int n = 0, w = 0;

	if (!s)
		return -1;
	if (!*s)
		return 0;
	for (const char *p = s;;) {
		uint32_t e;
		const char *end;

		if (!parse_index(p, &e, &end) || n >= cap)
			return -1;
		out[n++] = e;
		if (*end == '\0')
			break;
		p = end + 1;
	}
	qsort(out, (size_t)n, sizeof(*out), cmp_u32);
	for (int i = 0; i < n; i++)
		if (w == 0 || out[w - 1] != out[i])
			out[w++] = out[i];
	return w;
}
