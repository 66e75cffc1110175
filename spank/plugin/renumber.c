/* SPDX-License-Identifier: Apache-2.0 */
#include "renumber.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/*
 * Reads the entry at s, which must be above prev (-1 for the first): "0" or
 * a digit 1-9 and more digits, at most GF_MAX_GPU_INDEX, ending at ',' or
 * NUL. *end points past it.
 */
static bool parse_index(const char *s, long prev, uint32_t *v,
			const char **end)
{
	long acc = 0;
	const char *p = s;

	if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
		return false;
	for (; *p >= '0' && *p <= '9'; p++) {
		acc = acc * 10 + (*p - '0');
		if (acc > GF_MAX_GPU_INDEX)
			return false;
	}
	if ((*p != ',' && *p != '\0') || acc <= prev)
		return false;
	*v = (uint32_t)acc;
	*end = p;
	return true;
}

int gf_parse_gpu_list(const char *s, uint32_t *out, int cap)
{
	long prev = -1;
	int n = 0;

	if (!s)
		return -1;
	if (!*s)
		return 0;
	for (const char *p = s;; p++) {
		uint32_t e;

		if (!parse_index(p, prev, &e, &p) || n >= cap)
			return -1;
		out[n++] = e;
		prev = e;
		if (*p == '\0')
			return n;
	}
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
	/* A list of the grammar has at most one entry per index. */
	uint32_t entries[GF_MAX_GPU_INDEX + 1];
	size_t used = 0;
	int n;

	if (!value || !*value || (flags & GF_RENUMBER_SLURM_LOCAL))
		return GF_RENUMBER_KEEP;
	n = gf_parse_gpu_list(value, entries, GF_MAX_GPU_INDEX + 1);
	if (n < 0)
		return GF_RENUMBER_KEEP;
	if (flags & GF_RENUMBER_LIST_FROM_ENV)
		for (int i = 0; i < n; i++)
			if (position(entries[i], gpus, ngpus) < 0)
				return GF_RENUMBER_KEEP;
	if (outlen == 0)
		return GF_RENUMBER_ERROR;
	out[0] = '\0';
	for (int i = 0; i < n; i++) {
		int pos = position(entries[i], gpus, ngpus), w;

		if (pos < 0)
			continue;
		w = snprintf(out + used, outlen - used, "%s%d", used ? "," : "",
			     pos);
		if (w < 0 || (size_t)w >= outlen - used)
			return GF_RENUMBER_ERROR;
		used += (size_t)w;
	}
	return GF_RENUMBER_SET;
}
