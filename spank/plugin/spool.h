/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fail-open spool (plugstack spool=, default
 * /var/spool/gpufence/failopen.jsonl): one JSON line per step that
 * failure=open let run WITHOUT GPU isolation because no agent answered,
 * written by the plugin itself in slurmstepd with plain system calls (no
 * fork, no other runtime). The agent reads it (agent/failopen):
 *
 *	{"time":"2025-05-01T12:00:00Z","job_id":7,"step_id":"0","uid":2001,"node":"gpu01","reason":"connect: no such file or directory"}
 *
 * docs/configuration.md documents the format for administrators.
 *
 * Appending and reading never lose a line: a writer holds a shared flock(2)
 * on the file for its one write(2), and writes only while the name still
 * leads to the file it locked; the agent renames the file away, then takes
 * an exclusive lock on it before it reads, so every writer that could still
 * write into it has finished.
 */
#ifndef GPUFENCE_SPOOL_H
#define GPUFENCE_SPOOL_H

#include <stddef.h>
#include <stdint.h>

/* The longest line, its newline included: every field is cut to fit. */
#define GF_SPOOL_LINE_MAX 4096

/* What one line says. Strings are NUL-terminated, any bytes. */
struct gf_spool_rec {
	const char *time; /* RFC 3339 */
	uint32_t job_id;
	const char *step; /* 0, batch, extern, interactive */
	uint32_t uid;
	const char *node;   /* the host name */
	const char *reason; /* why the agent could not be reached */
};

/*
 * Renders rec as one JSON object and a newline into buf (cap at least
 * GF_SPOOL_LINE_MAX): strings JSON-escaped (quotes, backslashes, control
 * bytes, U+2028 and U+2029 as escapes; each byte of invalid UTF-8 as
 * U+FFFD), each cut at a character to its share of the line. Returns the
 * length, or -1 when cap is too small.
 */
int gf_spool_line(char *buf, size_t cap, const struct gf_spool_rec *rec);

/*
 * Appends the line of a step that runs without GPU isolation to the spool at
 * path, with the time and host name of now. The folder is made (0700) when
 * missing and must be ours and writable by no one else; the file (0600)
 * must be a regular file of ours (no link is followed). 0, or -1 with err
 * filled.
 */
int gf_spool_append(const char *path, uint32_t job_id, const char *step,
		    uint32_t uid, const char *reason, char *err,
		    size_t errlen);

#endif
