// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// manPage is the hand-written man page the package ships.
const manPage = "../../../packaging/man/gpufence.8"

// TestManPage fails when a command of the tree (walked, so a new command
// is covered), or one of its flags, has no place in the man page: each
// command its own `.SS "gpufence PATH"` section, each flag written there
// as \-\-name (and \-x for its shorthand); gpufence's own flags under
// `.SH OPTIONS`.
func TestManPage(t *testing.T) {
	page, err := os.ReadFile(manPage)
	if err != nil {
		t.Fatal(err)
	}
	root := newRoot(&bytes.Buffer{}, &bytes.Buffer{})
	n := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		n++
		for _, p := range missingFromMan(string(page), manCommand(c), manFlags(c)) {
			t.Errorf("%s: %s", manPage, p)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	if n < 15 {
		t.Errorf("checked %d commands, want 15 at least", n)
	}
}

// manCommand is c's path below gpufence ("" for gpufence itself).
func manCommand(c *cobra.Command) string {
	return strings.TrimPrefix(strings.TrimPrefix(c.CommandPath(), "gpufence"), " ")
}

// manFlags lists c's own flags as the man page writes them (name, and
// shorthand when it has one), --help left out: every command has it.
func manFlags(c *cobra.Command) []string {
	c.InitDefaultVersionFlag()
	var flags []string
	c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || f.Hidden {
			return
		}
		flags = append(flags, f.Name)
		if f.Shorthand != "" {
			flags = append(flags, f.Shorthand)
		}
	})
	return flags
}

// TestManPageChecker shows that the check above can fail.
func TestManPageChecker(t *testing.T) {
	page := ".SH OPTIONS\n.TP\n.B \\-\\-version\n" +
		".SS \"gpufence agent\"\n.TP\n.BI \\-\\-config \" FILE\"\n.TP\n.B \\-\\-json\n" +
		".SS \"gpufence audit tail\"\n.TP\n.BR \\-f \", \" \\-\\-follow\n.TP\n.BI \\-n \" N\"\n" +
		".SS \"gpufence audit verify \\fIFILE\\fP...\"\nChecks.\n.SH FILES\n"
	for _, tc := range []struct {
		cmd   string
		flags []string
		want  int
	}{
		{"", []string{"version"}, 0},
		{"", []string{"version", "json"}, 1},
		{"agent", []string{"config", "json"}, 0},
		{"agent", []string{"config", "socket"}, 1},
		{"agent", []string{"f"}, 1}, // documented for audit tail, not agent
		{"audit tail", []string{"f", "follow", "n"}, 0},
		{"audit tail", []string{"config"}, 1}, // documented for agent only
		{"audit verify", nil, 0},
		{"audit", nil, 1},               // "audit tail" is not "audit"
		{"doctor", []string{"json"}, 2}, // no section, and the flag
	} {
		if got := missingFromMan(page, tc.cmd, tc.flags); len(got) != tc.want {
			t.Errorf("%q %v: %d problems %q, want %d", tc.cmd, tc.flags, len(got), got, tc.want)
		}
	}
	c := &cobra.Command{Use: "tail"}
	c.Flags().BoolP("follow", "f", false, "")
	c.Flags().Int("job", 0, "")
	if got := strings.Join(manFlags(c), ","); got != "follow,f,job" {
		t.Errorf("manFlags: %q", got)
	}
}

var sectionHead = regexp.MustCompile(`(?m)^\.S[SH] `)

// missingFromMan lists what the man page lacks for one command: its
// `.SS "gpufence CMD"` section (`.SH OPTIONS` for gpufence itself; the
// heading may go on with the arguments: \fIFILE\fP, [FLAGS]), and each flag written there as
// \-\-name (or \-x for a one-letter one).
func missingFromMan(page, cmd string, flags []string) []string {
	head := regexp.MustCompile(`(?m)^\.SS "gpufence ` + regexp.QuoteMeta(cmd) + `("| \\f| [A-Z\[]).*\n`)
	name := `.SS "gpufence ` + cmd + `"`
	if cmd == "" {
		head, name = regexp.MustCompile(`(?m)^\.SH OPTIONS\n`), ".SH OPTIONS"
	}
	loc := head.FindStringIndex(page)
	if loc == nil {
		missing := []string{"no section " + name}
		for _, f := range flags {
			missing = append(missing, "no section for "+cmd+"'s --"+f)
		}
		return missing
	}
	sec := page[loc[1]:]
	if j := sectionHead.FindStringIndex(sec); j != nil {
		sec = sec[:j[0]]
	}
	var missing []string
	for _, f := range flags {
		q := regexp.QuoteMeta(strings.ReplaceAll(f, "-", `\-`))
		re := regexp.MustCompile(`\\-\\-` + q + `($|[^-A-Za-z0-9])`)
		if len(f) == 1 {
			re = regexp.MustCompile(`\\-` + q + `($|[^-A-Za-z0-9])`)
		}
		if !re.MatchString(sec) {
			missing = append(missing, "section "+name+" does not describe --"+f)
		}
	}
	return missing
}
