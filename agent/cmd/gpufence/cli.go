// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpufence/gpufence/agent/verify"
	"github.com/gpufence/gpufence/agent/version"
)

// Exit statuses every command shares; a command documents any other.
const (
	exitOK      = 0
	exitFailure = 1 // a runtime failure, or a check that failed
	exitUsage   = 2 // a usage error, or a configuration that cannot be used
)

// cliError ends a command with an exit status. err, when set, is printed
// as one line "gpufence CMD: err"; hint adds the line that points to
// --help (usage errors only).
type cliError struct {
	code int
	err  error
	hint bool
}

func (e *cliError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *cliError) Unwrap() error { return e.err }

// usageErrorf is a usage error: exit 2, one line and the --help hint.
func usageErrorf(format string, a ...any) error {
	return &cliError{code: exitUsage, err: fmt.Errorf(format, a...), hint: true}
}

// configError is a configuration that cannot be used: exit 2, no hint
// (the message names the file and the field).
func configError(err error) error { return &cliError{code: exitUsage, err: err} }

// exitStatus ends a command that has printed its own result (doctor,
// status, verify: 1 when a check failed) with code and no more output.
func exitStatus(code int) error {
	if code == exitOK {
		return nil
	}
	return &cliError{code: code}
}

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == verify.ChildCommand {
		// gpufence verify's process inside its cgroup; not a command.
		return verify.ChildMain(args[1:], stdout, stderr)
	}
	root := newRoot(stdout, stderr)
	if args == nil {
		args = []string{} // cobra reads os.Args for nil
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	if cmd == nil {
		cmd = root
	}
	ce := &cliError{code: exitFailure, err: err}
	errors.As(err, &ce)
	if ce.err != nil {
		// One line whatever the error held.
		fmt.Fprintf(stderr, "%s: %s\n", cmd.CommandPath(), strings.ReplaceAll(strings.TrimSpace(ce.err.Error()), "\n", "; "))
	}
	if ce.hint {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return ce.code
}

// newRoot builds the command tree, writing to stdout and stderr, with the
// conventions of every command applied (see applyConventions).
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "gpufence",
		Short: "per-job GPU isolation and audit for Slurm nodes",
		Long: "gpufence " + version.Version + ": per-job GPU isolation and audit for Slurm nodes.\n\n" +
			"Exit status: 0 success, 1 a failure or a failed check, 2 a usage error or an unusable\n" +
			"configuration; a command may document others. Documentation: gpufence(8), README.md, docs/.",
		Version: version.Version,
	}
	root.SetVersionTemplate("gpufence {{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(agentCommand(), auditCommand(), doctorCommand(), inventoryCommand(),
		statusCommand(), verifyCommand(), versionCommand())
	root.SetHelpCommand(helpCommand())
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Short = "print a shell completion script: bash, zsh, fish or powershell (gpufence(8))"
		}
	}
	applyConventions(root)
	return root
}

// applyConventions gives every command of the tree the same behaviour:
// help on stdout (cobra's), usage errors as one line plus a hint (exit 2),
// no usage dump, arguments refused unless a command takes them, and a
// command that only groups others printing its help (no argument) or
// naming the unknown command.
func applyConventions(root *cobra.Command) {
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &cliError{code: exitUsage, err: err, hint: true}
	})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		switch {
		case c.HasSubCommands() && !c.Runnable():
			c.Args = cobra.ArbitraryArgs
			c.RunE = runGroup
			c.SuggestionsMinimumDistance = 2
		case c.Args == nil || (c.Parent() != nil && c.Parent().Name() == "completion"):
			// cobra's completion commands use cobra.NoArgs, whose message
			// is "unknown command"; an argument is not a command there.
			c.Args = noArgs
		}
		if args := c.Args; args != nil {
			c.Args = func(cmd *cobra.Command, a []string) error {
				if err := args(cmd, a); err != nil {
					var ce *cliError
					if errors.As(err, &ce) {
						return err
					}
					return &cliError{code: exitUsage, err: err, hint: true}
				}
				return nil
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// runGroup is the action of a command that groups others (gpufence,
// gpufence audit, gpufence completion): alone it prints its help.
func runGroup(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	msg := fmt.Sprintf("unknown command %q", args[0])
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %q?)", s[0])
	}
	return usageErrorf("%s", msg)
}

// noArgs refuses any argument: the commands take flags only.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unexpected argument %q", args[0])
	}
	return nil
}

// helpCommand is `gpufence help [COMMAND...]`: cobra's, except that an
// unknown command is a usage error rather than the root's usage.
func helpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND...]",
		Short: "print the help of a command (as COMMAND --help does)",
		Long:  "Help prints the help of a command: gpufence help audit tail is gpufence audit tail --help.",
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || cmd == nil || len(rest) > 0 {
				return usageErrorf("unknown help topic %q", strings.Join(args, " "))
			}
			cmd.InitDefaultHelpFlag()
			cmd.InitDefaultVersionFlag()
			return cmd.Help()
		},
	}
}

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version (as gpufence --version does)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "gpufence %s\n", version.Version)
			return nil
		},
	}
}
