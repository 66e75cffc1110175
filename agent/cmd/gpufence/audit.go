// SPDX-License-Identifier: Apache-2.0

package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/gpufence/gpufence/agent/audit"
)

func auditCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit COMMAND",
		Short: "read the audit trail (audit tail) and check its hash chains (audit verify)",
		Long: "Reads the JSON Lines audit trail the agent writes (docs/audit.md): gpufence audit tail prints\n" +
			"records, rotated files included; gpufence audit verify checks the hash chains of audit files.",
	}
	cmd.AddCommand(auditTailCommand(), auditVerifyCommand())
	return cmd
}

// timeBound is the value of --since and --until (audit.ParseTimeBound).
type timeBound struct{ t *time.Time }

func (b timeBound) String() string {
	if b.t.IsZero() {
		return ""
	}
	return b.t.Format(time.RFC3339Nano)
}

func (b timeBound) Set(s string) error {
	t, err := audit.ParseTimeBound(s, time.Now())
	if err != nil {
		return err
	}
	*b.t = t
	return nil
}

func (timeBound) Type() string { return "TIME" }

func auditTailCommand() *cobra.Command {
	var o audit.TailOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "tail [flags]",
		Short: "print the last audit records, rotated files included, and follow new ones",
		Long: `Prints the last matching records of the audit file and its rotated files, oldest first:
logrotate's FILE.N.gz ... FILE.2.gz, FILE.1 (or FILE-YYYYMMDD[.gz] with dateext), then FILE.
Compressed files are read whatever their name says when they start as gzip does. The filters
apply across all of them; -n counts the matching records of all files (the newest rotated
files are read only as far back as -n needs; -n 0 reads them all).

--since and --until compare with each record's "time" (when the agent wrote it, not the
kernel's access_time) and take an RFC 3339 time (2026-05-04T10:00:00Z, 2026-05-04T12:00:00+02:00),
a date (2026-05-04, midnight UTC) or a duration before now (90s, 30m, 1h30m, 2d, 1d12h); both
bounds are included.

--format text prints one aligned line per record, every field escaped (no control character
reaches the terminal); --format json (or --json) prints each record as written, any
non-printable character written as a \u escape; --format ocsf prints each record as the
OCSF event audit.ocsf_file holds for it (docs/audit.md, "OCSF output"), escaped the same way.

Exit status: 0 printed (also when nothing matched), 1 a file could not be read, 2 usage error.`,
	}
	fs := cmd.Flags()
	fs.StringVar(&o.File, "file", audit.DefaultFile, "audit file (JSON Lines); its rotated siblings are read before it")
	fs.Uint32Var(&o.JobID, "job", 0, "only records of this job id")
	fs.StringVar(&o.User, "user", "", "only records of this user name or uid")
	fs.BoolVar(&o.Denied, "denied", false, "only denied and would-deny accesses")
	fs.StringVar(&o.Event, "event", "", "only records of this event (gpu_access, job_adopted, policy_applied, ...; docs/audit.md)")
	fs.Var(timeBound{&o.Since}, "since", "only records written at or after TIME (RFC 3339, YYYY-MM-DD, or a duration before now: 30m, 1h, 2d)")
	fs.Var(timeBound{&o.Until}, "until", "only records written at or before TIME (as --since)")
	fs.StringVar(&o.Format, "format", audit.FormatText, "output format: text, json or ocsf")
	fs.BoolVar(&asJSON, "json", false, "same as --format json: the records as written (JSON Lines)")
	fs.BoolVarP(&o.Follow, "follow", "f", false, "keep printing records as they are written")
	fs.IntVarP(&o.N, "lines", "n", 20, "print the last N matching records (0: all)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if asJSON {
			if fs.Changed("format") && o.Format != audit.FormatJSON {
				return usageErrorf("--json is --format json; it contradicts --format %s", o.Format)
			}
			o.Format = audit.FormatJSON
		}
		if err := o.Check(); err != nil {
			return usageErrorf("%v", err)
		}
		return audit.Tail(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
	}
	return cmd
}

func auditVerifyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "verify FILE...",
		Short: "check the hash chains of audit files and name the first broken record",
		Long: "Checks the hash chain of each agent run's records in the JSON Lines audit files\n" +
			"(rotated files too, .gz included, in any order) and names the first edited,\n" +
			"missing, out-of-order or cut-short record.\n\n" +
			"Exit status: 0 whole, 1 broken, 2 usage error or unreadable file.",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("no file given (e.g. gpufence audit verify %s*)", audit.DefaultFile)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := audit.Verify(args, cmd.OutOrStdout())
			if err != nil {
				return &cliError{code: code, err: err}
			}
			return exitStatus(code)
		},
	}
}
