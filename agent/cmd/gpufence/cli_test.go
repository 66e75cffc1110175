// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/verify"
	"github.com/gpufence/gpufence/agent/version"
)

// cli runs the command line and returns its exit status and outputs.
func cli(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// commandPaths lists every command of the tree as its arguments (nil for
// gpufence itself), hidden ones (cobra's __complete) left out.
func commandPaths(t *testing.T) [][]string {
	t.Helper()
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		if c.Hidden {
			return
		}
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			walk(sub, append(slices.Clone(path), sub.Name()))
		}
	}
	walk(newRoot(&bytes.Buffer{}, &bytes.Buffer{}), nil)
	return paths
}

// TestCommandTree walks every command of the tree (a new one is covered
// without a change here): --help, -h and help CMD print its help on stdout
// and exit 0; an unknown flag is one error line and one hint on stderr,
// exit 2, nothing on stdout.
func TestCommandTree(t *testing.T) {
	paths := commandPaths(t)
	var names []string
	for _, p := range paths {
		names = append(names, strings.Join(p, " "))
	}
	for _, want := range []string{"", "agent", "audit", "audit tail", "audit verify", "completion", "completion bash",
		"completion zsh", "completion fish", "doctor", "help", "inventory", "status", "verify", "version"} {
		if !slices.Contains(names, want) {
			t.Errorf("the tree has no command %q (it has %q)", want, names)
		}
	}
	if slices.Contains(names, verify.ChildCommand) {
		t.Errorf("the hidden %s shows in the tree", verify.ChildCommand)
	}
	for _, p := range paths {
		name := strings.TrimSpace("gpufence " + strings.Join(p, " "))
		var helps []string
		for _, args := range [][]string{append(slices.Clone(p), "--help"), append(slices.Clone(p), "-h"), append([]string{"help"}, p...)} {
			code, out, errs := cli(args...)
			if code != 0 || errs != "" || !strings.Contains(out, "Usage:\n  "+name) {
				t.Errorf("%q: exit %d, stderr %q, stdout without %q:\n%s", args, code, errs, "Usage:\n  "+name, out)
			}
			helps = append(helps, out)
		}
		if helps[0] != helps[1] || helps[0] != helps[2] {
			t.Errorf("%s: --help, -h and help print different texts", name)
		}
		code, out, errs := cli(append(slices.Clone(p), "--no-such-flag")...)
		want := fmt.Sprintf("%s: unknown flag: --no-such-flag\nRun '%s --help' for usage.\n", name, name)
		if code != 2 || out != "" || errs != want {
			t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q; want exit 2, stderr %q", name, code, out, errs, want)
		}
	}
	if len(paths) < 15 {
		t.Errorf("walked %d commands, want 15 at least", len(paths))
	}
}

func TestVersion(t *testing.T) {
	want := "gpufence " + version.Version + "\n"
	for _, args := range [][]string{{"--version"}, {"version"}} {
		if code, out, errs := cli(args...); code != 0 || out != want || errs != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %q", args, code, out, errs, want)
		}
	}
}

// TestGroupsAlone: gpufence, gpufence audit and gpufence completion alone
// print their help on stdout, exit 0, like --help.
func TestGroupsAlone(t *testing.T) {
	for _, args := range [][]string{{}, {"audit"}, {"completion"}} {
		code, out, errs := cli(args...)
		_, help, _ := cli(append(args, "--help")...)
		if code != 0 || errs != "" || out != help {
			t.Errorf("%q: exit %d, stderr %q, stdout is not its --help:\n%s", args, code, errs, out)
		}
	}
}

// TestUsageErrors: every kind of usage error is one line "gpufence CMD:
// what" naming what was wrong, one hint line, exit 2, nothing on stdout.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		cmd  string // the command the line names
		want string // in the error line
	}{
		{[]string{"bogus"}, "gpufence", `unknown command "bogus"`},
		{[]string{"stauts"}, "gpufence", `did you mean "status"?`},
		{[]string{"--bogus"}, "gpufence", "unknown flag: --bogus"},
		{[]string{"audit", "bogus"}, "gpufence audit", `unknown command "bogus"`},
		{[]string{"completion", "tcsh"}, "gpufence completion", `unknown command "tcsh"`},
		{[]string{"completion", "bash", "extra"}, "gpufence completion bash", `unexpected argument "extra"`},
		{[]string{"help", "bogus"}, "gpufence help", `unknown help topic "bogus"`},
		{[]string{"help", "audit", "bogus"}, "gpufence help", `unknown help topic "audit bogus"`},
		{[]string{"version", "extra"}, "gpufence version", `unexpected argument "extra"`},
		{[]string{"doctor", "extra"}, "gpufence doctor", `unexpected argument "extra"`},
		{[]string{"status", "extra"}, "gpufence status", `unexpected argument "extra"`},
		{[]string{"agent", "extra"}, "gpufence agent", `unexpected argument "extra"`},
		{[]string{"inventory", "extra"}, "gpufence inventory", `unexpected argument "extra"`},
		{[]string{"audit", "tail", "extra"}, "gpufence audit tail", `unexpected argument "extra"`},
		{[]string{"audit", "verify"}, "gpufence audit verify", "no file given"},
		{[]string{"audit", "tail", "--job", "abc"}, "gpufence audit tail", `invalid argument "abc" for "--job"`},
		{[]string{"audit", "tail", "--job"}, "gpufence audit tail", "flag needs an argument: --job"},
		{[]string{"audit", "tail", "--since", "yesterday"}, "gpufence audit tail", `"yesterday" is neither an RFC 3339 time`},
		{[]string{"audit", "tail", "--until", "5x"}, "gpufence audit tail", `invalid argument "5x" for "--until"`},
		{[]string{"audit", "tail", "--since", "1h", "--until", "2h"}, "gpufence audit tail", "is before --since"},
		{[]string{"audit", "tail", "--format", "yaml"}, "gpufence audit tail", `--format "yaml": not a format`},
		{[]string{"audit", "tail", "--json", "--format", "text"}, "gpufence audit tail", "contradicts --format text"},
		{[]string{"audit", "tail", "--event", "nope"}, "gpufence audit tail", `--event "nope": not an event`},
		{[]string{"audit", "tail", "-n", "-1"}, "gpufence audit tail", "-n -1"},
		{[]string{"verify", "--timeout", "0"}, "gpufence verify", "--timeout 0s must be above 0"},
		{[]string{"verify", "--gpu", "one"}, "gpufence verify", `invalid argument "one" for "--gpu"`},
	} {
		code, out, errs := cli(tc.args...)
		lines := strings.SplitAfter(errs, "\n")
		if code != 2 || out != "" || len(lines) != 3 || lines[2] != "" ||
			!strings.HasPrefix(lines[0], tc.cmd+": ") || !strings.Contains(lines[0], tc.want) ||
			lines[1] != "Run '"+tc.cmd+" --help' for usage.\n" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, %q: ...%s... and the hint", tc.args, code, out, errs, tc.cmd, tc.want)
		}
	}
}

// TestConfigErrors: a configuration that cannot be used is exit 2 and one
// line naming the file or field, without the --help hint.
func TestConfigErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, args := range [][]string{
		{"agent", "--config", missing},
		{"agent", "--mode", "sideways", "--config", writeDoctorConfig(t, "node_name: n1\n")},
		{"status", "--config", missing},
		{"doctor", "--config", missing},
		{"verify", "--config", missing},
	} {
		code, out, errs := cli(args...)
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.HasPrefix(errs, "gpufence "+args[0]+": ") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and one line", args, code, out, errs)
		}
	}
}

func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{
		"bash": "# bash completion V2 for gpufence",
		"zsh":  "#compdef gpufence",
		"fish": "complete -c gpufence ",
	} {
		code, out, errs := cli("completion", shell)
		if code != 0 || errs != "" || !strings.Contains(out, want) {
			t.Errorf("completion %s: exit %d, stderr %q, stdout without %q", shell, code, errs, want)
		}
	}
	// What the scripts ask the binary: the commands, not the hidden child.
	code, out, _ := cli("__complete", "")
	if code != 0 || !strings.Contains(out, "audit\t") || !strings.Contains(out, "doctor\t") || strings.Contains(out, verify.ChildCommand) {
		t.Errorf("__complete: exit %d:\n%s", code, out)
	}
	code, out, _ = cli("__complete", "audit", "tail", "--s")
	if code != 0 || !strings.Contains(out, "--since\t") {
		t.Errorf("__complete audit tail --s: exit %d:\n%s", code, out)
	}
}

// TestInventoryJSON: inventory --json prints one JSON object on stdout
// whether the GPUs could be listed or not, and exits non-zero on error.
func TestInventoryJSON(t *testing.T) {
	type report struct {
		GPUs  []json.RawMessage `json:"gpus"`
		Error *string           `json:"error"`
	}
	decode := func(args []string, out string) report {
		var r report
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil || dec.More() || r.GPUs == nil {
			t.Fatalf("%q: stdout is not one {\"gpus\":[...]} object: %v\n%s", args, err, out)
		}
		return r
	}
	defer func(f func(string, bool) ([]inventory.GPU, map[int]inventory.Usage, error)) { listGPUs = f }(listGPUs)
	for _, tc := range []struct {
		err  error
		code int
	}{
		{fmt.Errorf("%w: NVML init: ERROR_LIBRARY_NOT_FOUND", inventory.ErrNoDriver), exitNoDriver},
		{errors.New("nvml: GPU 1: ERROR_GPU_IS_LOST"), 1},
	} {
		listGPUs = func(string, bool) ([]inventory.GPU, map[int]inventory.Usage, error) { return nil, nil, tc.err }
		args := []string{"inventory", "--json", "--usage"}
		code, out, errs := cli(args...)
		r := decode(args, out)
		if code != tc.code || r.Error == nil || *r.Error != tc.err.Error() || len(r.GPUs) != 0 || errs != "gpufence inventory: "+tc.err.Error()+"\n" {
			t.Errorf("%v: exit %d (want %d), error %v, %d gpus, stderr %q", tc.err, code, tc.code, r.Error, len(r.GPUs), errs)
		}
		if code, out, _ := cli("inventory"); code != tc.code || out != "" {
			t.Errorf("text, %v: exit %d, stdout %q", tc.err, code, out)
		}
	}
	listGPUs = func(string, bool) ([]inventory.GPU, map[int]inventory.Usage, error) {
		return []inventory.GPU{{Index: 0, Minor: 0, UUID: "GPU-0", Name: "Fake"}}, nil, nil
	}
	code, out, _ := cli("inventory", "--json")
	if r := decode(nil, out); code != 0 || r.Error != nil || len(r.GPUs) != 1 || !strings.Contains(string(r.GPUs[0]), `"uuid": "GPU-0"`) {
		t.Errorf("one GPU: exit %d\n%s", code, out)
	}
	listGPUs = listInventory
	// The machine's own driver, or its absence: JSON either way.
	code, out, errs := cli("inventory", "--json")
	r := decode(nil, out)
	if (code == 0) != (r.Error == nil) || (code != 0 && !strings.HasPrefix(errs, "gpufence inventory: ")) {
		t.Errorf("this machine: exit %d, error %v, stderr %q", code, r.Error, errs)
	}
	t.Logf("this machine: exit %d, %d GPUs, stderr %q", code, len(r.GPUs), errs)
}

// TestVerifyChild: the hidden child of gpufence verify still runs as the
// first argument, with its own flags, and shows in no help.
func TestVerifyChild(t *testing.T) {
	code, out, errs := cli(verify.ChildCommand, "--open", os.DevNull)
	if code != 0 || !regexp.MustCompile(`"path":\s*"/dev/null",\s*"errno":\s*"OK"`).MatchString(out) {
		t.Errorf("%s --open /dev/null: exit %d\n%s\n%s", verify.ChildCommand, code, out, errs)
	}
	if code, _, _ := cli(verify.ChildCommand, "--bogus"); code != 2 {
		t.Errorf("%s --bogus: exit %d, want 2", verify.ChildCommand, code)
	}
	if _, out, _ := cli("--help"); strings.Contains(out, verify.ChildCommand) {
		t.Errorf("--help shows %s", verify.ChildCommand)
	}
}

// TestAgentFlagsOverFile: a flag given on the command line wins over the
// configuration file, one not given leaves the file's value, also across a
// reload (SIGHUP) for --audit-only.
func TestAgentFlagsOverFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	body := "node_name: n1\nsocket: /run/file.sock\nlog_level: warn\npin_dir: /sys/fs/bpf/from-file\nenforcement: audit-only\n"
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	defer func(f func(config.Config, *slog.Logger, func() (config.Config, error)) error) { startAgent = f }(startAgent)
	var got config.Config
	var reload func() (config.Config, error)
	startAgent = func(cfg config.Config, _ *slog.Logger, r func() (config.Config, error)) error {
		got, reload = cfg, r
		return nil
	}
	code, out, errs := cli("agent", "--config", file, "--socket", "/run/flag.sock", "--audit-only=false", "--state-file", "")
	if code != 0 || out != "" || errs != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if got.Socket != "/run/flag.sock" || got.LogLevel != "warn" || got.PinDir != "/sys/fs/bpf/from-file" ||
		got.Enforcement != config.EnforcementEnforce || got.StateFile != "" || got.NodeName != "n1" {
		t.Errorf("socket %q (flag), log_level %q, pin_dir %q (file), enforcement %q (flag), state_file %q (flag, empty), node %q",
			got.Socket, got.LogLevel, got.PinDir, got.Enforcement, got.StateFile, got.NodeName)
	}
	re, err := reload()
	if err != nil || re.Enforcement != config.EnforcementEnforce {
		t.Errorf("reload: enforcement %q, %v; want the flag's %q", re.Enforcement, err, config.EnforcementEnforce)
	}
	// Without the flag the file's enforcement holds, at start and reload.
	if code, _, errs := cli("agent", "--config", file); code != 0 || got.Enforcement != config.EnforcementAuditOnly || got.Socket != "/run/file.sock" {
		t.Errorf("no flags: exit %d %q, enforcement %q, socket %q", code, errs, got.Enforcement, got.Socket)
	}
	startAgent = func(config.Config, *slog.Logger, func() (config.Config, error)) error { return errors.New("boom") }
	if code, out, _ := cli("agent", "--config", file); code != 1 || out != "" {
		t.Errorf("agent failed: exit %d, want 1", code)
	}
}
