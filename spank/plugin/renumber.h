/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GPU index list grammar of the plugin, and the renumbering of
 * CUDA_VISIBLE_DEVICES-style values from global GPU indices (what Slurm hands
 * out when it does not constrain devices itself) to the local numbering CUDA
 * uses when only the step's GPUs can be opened. No Slurm dependency, so it is
 * unit-tested and fuzzed on its own (spank/internal/cparse).
 *
 * The grammar is the agent's (gpulist.Parse; docs/architecture.md,
 * "GPU lists"): exactly what Slurm writes into SLURM_JOB_GPUS and
 * SLURM_STEP_GPUS, decimal indices without sign, blank or leading zero,
 * joined by commas, strictly ascending, each at most GF_MAX_GPU_INDEX. Both
 * parsers are tested against agent/gpulist/testdata/gpulist.txt.
 */
#ifndef GPUFENCE_RENUMBER_H
#define GPUFENCE_RENUMBER_H

#include <stddef.h>
#include <stdint.h>

/* The agent's gpulist.MaxIndex. */
#define GF_MAX_GPU_INDEX 1023

/* Slurm already numbers the value locally: never touch it. */
#define GF_RENUMBER_SLURM_LOCAL 0x1
/*
 * The list did not come from the agent but from the step's environment, and
 * whether Slurm already renumbered is unknown: keep the value unless every
 * entry is in the list. (When all local indices 0..n-1 are in an n-entry
 * global list, the list is 0..n-1 and renumbering changes nothing.)
 */
#define GF_RENUMBER_LIST_FROM_ENV 0x2

enum gf_renumber_result {
	GF_RENUMBER_ERROR = -1, /* out too small */
	GF_RENUMBER_KEEP = 0,   /* leave the variable as it is */
	GF_RENUMBER_SET = 1,    /* set the variable to out */
};

/*
 * value: the variable's value, NULL when unset. gpus[0..ngpus): the global
 * indices the step may open, ascending. A value that is a non-empty GPU
 * index list is renumbered: each entry e becomes the position of e in gpus,
 * and entries not in gpus are dropped. Any other value (empty, UUIDs,
 * MIG-..., a mix, ranges, blanks, junk) is kept as it is.
 */
int gf_renumber(const char *value, const uint32_t *gpus, int ngpus, int flags,
		char *out, size_t outlen);

/*
 * Parses a GPU index list ("0,2") into out, ascending. Returns the count, or
 * -1 when s is not such a list or has more than cap entries. "" is an empty
 * list.
 */
int gf_parse_gpu_list(const char *s, uint32_t *out, int cap);

#endif
