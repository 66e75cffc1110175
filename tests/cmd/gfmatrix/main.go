// SPDX-License-Identifier: Apache-2.0

// Command gfmatrix runs the end-to-end suite (tests/e2e) once per Slurm
// release and prints a table of scenario × release (`make e2e-matrix`):
//
//	gfmatrix [-out FILE] [-run REGEX] [-timeout 40m] SELECTION...
//	gfmatrix -prepare [-multislurmd] [-containers] SELECTION...   (build or fetch the releases only)
//
// A SELECTION is a tests/slurmrel release with its variant (22.05, 25.11,
// 25.11+slice, 26.05+jobidpaths, 23.11+pcluster). Each release's daemons are
// made ready first (a source build, once per machine, or a debootstrap
// root) and that time is reported apart from the suite's; -multislurmd
// also builds each source release's multiple-slurmd variant, which the
// multi-node cluster runs on; -containers
// also builds enroot and Apptainer (tests/containers; pyxis is built per
// release by the tests, in seconds). The table and
// every test's result go to FILE as JSON. Exit status 1 when any test failed
// or a run did not complete. Needs root, like the suite.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/gpufence/gpufence/tests/containers"
	"github.com/gpufence/gpufence/tests/slurmrel"
)

// Run is one selection's run of the suite.
type Run struct {
	Selection string `json:"selection"`
	Release   string `json:"release"`
	Version   string `json:"version,omitempty"` // full, as the suite saw it
	Kind      string `json:"kind,omitempty"`    // host, source, debroot
	// SetupSeconds is the time to make the release ready in this run (the
	// source build or debootstrap when not cached); BuildSeconds is how
	// long its cached source build took when it was made.
	SetupSeconds float64           `json:"setup_seconds"`
	Cached       bool              `json:"cached"`
	BuildSeconds int               `json:"build_seconds,omitempty"`
	E2ESeconds   float64           `json:"e2e_seconds"`
	Completed    bool              `json:"completed"` // go test ran to its end
	Passed       bool              `json:"passed"`
	Error        string            `json:"error,omitempty"`
	Tests        map[string]string `json:"tests"` // test name -> pass, fail, skip
	order        []string
}

// Matrix is what -out gets.
type Matrix struct {
	Started   time.Time `json:"started"`
	Runs      []*Run    `json:"runs"`
	Scenarios []string  `json:"scenarios"` // the table's rows, in order
}

type event struct {
	Action  string
	Test    string
	Output  string
	Package string
}

func main() {
	out := flag.String("out", "build/e2e-matrix.json", "write the results here as JSON")
	runRe := flag.String("run", "", "go test -run for each release (default: every test)")
	timeout := flag.Duration("timeout", 40*time.Minute, "go test -timeout for each release")
	prepare := flag.Bool("prepare", false, "only make each release's daemons ready (source builds, Debian roots), say how long each took, and exit")
	withMulti := flag.Bool("multislurmd", false, "with -prepare: build each source release's multislurmd variant too (the multi-node cluster's)")
	withContainers := flag.Bool("containers", false, "with -prepare: build enroot and Apptainer from their release sources too (tests/containers)")
	flag.Parse()
	sels := flag.Args()
	if len(sels) == 0 {
		fmt.Fprintln(os.Stderr, "usage: gfmatrix [-out FILE] [-run REGEX] [-timeout D] SELECTION...")
		os.Exit(2)
	}
	root, err := slurmrel.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *prepare {
		code := prepareAll(sels, *withMulti)
		if *withContainers && prepareContainers() != 0 {
			code = 1
		}
		os.Exit(code)
	}
	m := &Matrix{Started: time.Now().UTC()}
	ok := true
	for _, s := range sels {
		r := runOne(root, s, *runRe, *timeout)
		m.Runs = append(m.Runs, r)
		ok = ok && r.Passed
		if err := write(m, *out); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	m.Scenarios = scenarios(m.Runs)
	printTable(os.Stdout, m)
	if err := write(m, *out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		ok = false
	} else {
		fmt.Printf("\nresults: %s\n", *out)
	}
	if !ok {
		os.Exit(1)
	}
}

// prepareAll makes every selection's release ready, one after the other
// (each source build uses every core), and reports the time each took.
func prepareAll(names []string, multi bool) int {
	code := 0
	seen := map[string]bool{}
	var sels []slurmrel.Selection
	for _, name := range names {
		sel, err := slurmrel.Select(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gfmatrix:", err)
			code = 1
			continue
		}
		sels = append(sels, sel)
		if multi && sel.Release.Tarball() != "" && !sel.Release.MultiSlurmd {
			sel.Name += "+multislurmd"
			sel.Release.MultiSlurmd = true
			sels = append(sels, sel)
		}
	}
	for _, sel := range sels {
		key := fmt.Sprint(sel.Release.Version, sel.Release.MultiSlurmd)
		if seen[key] {
			continue
		}
		seen[key] = true
		_, cached := slurmrel.Cached(sel.Release)
		t0 := time.Now()
		in, err := slurmrel.Ensure(context.Background(), sel.Release, func(f string, a ...any) { fmt.Fprintf(os.Stderr, "gfmatrix: "+f+"\n", a...) })
		if err != nil {
			fmt.Fprintf(os.Stderr, "gfmatrix: %s: %v\n", sel.Release.Version, err)
			code = 1
			continue
		}
		fmt.Printf("Slurm %s (%s) ready (%s) in %.0f s (cached before: %v; source build took %d s)\n",
			sel.Release.Version, sel.Name, in.Kind, time.Since(t0).Seconds(), cached, in.BuildSeconds)
	}
	return code
}

// prepareContainers builds the container runtimes the e2e suite runs
// (tests/containers), one after the other, and reports the time each took.
func prepareContainers() int {
	code := 0
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, "gfmatrix: "+f+"\n", a...) }
	for _, what := range []string{"enroot", "apptainer"} {
		t0 := time.Now()
		b, err := containers.Ensure(context.Background(), what, "", logf)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gfmatrix: %s: %v\n", what, err)
			code = 1
			continue
		}
		fmt.Printf("%s ready in %.0f s (built now: %v; the build took %d s)\n", what, time.Since(t0).Seconds(), b.Fresh, b.Seconds)
	}
	return code
}

func runOne(root, name, runRe string, timeout time.Duration) *Run {
	r := &Run{Selection: name, Tests: map[string]string{}}
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "gfmatrix: %s: "+format+"\n", append([]any{name}, a...)...)
	}
	sel, err := slurmrel.Select(name)
	if err != nil {
		r.Error = err.Error()
		logf("%v", err)
		return r
	}
	r.Release = sel.Release.Version
	if _, ok := slurmrel.Cached(sel.Release); ok {
		r.Cached = true
	}
	t0 := time.Now()
	in, err := slurmrel.Ensure(context.Background(), sel.Release, logf)
	r.SetupSeconds = time.Since(t0).Seconds()
	if err != nil {
		r.Error = err.Error()
		logf("%v", err)
		return r
	}
	r.Kind, r.Version, r.BuildSeconds = string(in.Kind), in.Full, in.BuildSeconds
	logf("Slurm %s ready (%s) in %.0f s; running the suite", sel.Release.Version, in.Kind, r.SetupSeconds)

	args := []string{"test", "-count=1", "-json", "-timeout", timeout.String()}
	if runRe != "" {
		args = append(args, "-run", runRe)
	}
	args = append(args, "./tests/e2e")
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), slurmrel.EnvVar+"="+name)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		r.Error = err.Error()
		return r
	}
	logDir := filepath.Join(root, "build", "e2e-matrix")
	os.MkdirAll(logDir, 0o755)
	logPath := filepath.Join(logDir, strings.ReplaceAll(name, "+", "_")+".log")
	logFile, _ := os.Create(logPath)
	t1 := time.Now()
	if err := cmd.Start(); err != nil {
		r.Error = err.Error()
		return r
	}
	upRe := regexp.MustCompile(`Slurm (\d+\.\d+\.\d+) \(([^,]+), (\w+)\) up in`)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev event
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		if logFile != nil && ev.Output != "" {
			io.WriteString(logFile, ev.Output)
		}
		if m := upRe.FindStringSubmatch(ev.Output); m != nil {
			r.Version, r.Kind = m[1], m[3]
		}
		if ev.Test == "" {
			continue
		}
		switch ev.Action {
		case "run":
			r.order = append(r.order, ev.Test)
		case "pass", "fail", "skip":
			r.Tests[ev.Test] = ev.Action
			if ev.Action != "pass" {
				fmt.Fprintf(os.Stderr, "gfmatrix: %s: %s %s\n", name, strings.ToUpper(ev.Action), ev.Test)
			}
		}
	}
	err = cmd.Wait()
	if logFile != nil {
		logFile.Close()
	}
	r.E2ESeconds = time.Since(t1).Seconds()
	r.Completed = true
	for _, t := range r.order {
		if _, done := r.Tests[t]; !done {
			r.Tests[t] = "fail" // started, never finished (timeout, panic)
			r.Completed = false
		}
	}
	failed := false
	for _, res := range r.Tests {
		failed = failed || res == "fail"
	}
	r.Passed = err == nil && !failed && len(r.Tests) > 0
	if err != nil {
		r.Error = fmt.Sprintf("go test: %v (log: %s)", err, logPath)
	}
	logf("suite %s in %.0f s (log: %s)", map[bool]string{true: "passed", false: "FAILED"}[r.Passed], r.E2ESeconds, logPath)
	return r
}

// scenarios are the table's rows: the top-level tests and the subtests of
// TestPrivilegedIsolation (the per-job isolation scenarios), in the order
// the first run ran them, then any only other runs had.
func scenarios(runs []*Run) []string {
	var rows []string
	seen := map[string]bool{}
	for _, r := range runs {
		for _, t := range r.order {
			parts := strings.Split(t, "/")
			if len(parts) == 1 || (len(parts) == 2 && parts[0] == "TestPrivilegedIsolation") {
				if !seen[t] {
					seen[t] = true
					rows = append(rows, t)
				}
			}
		}
	}
	return rows
}

func label(test string) string {
	l := strings.TrimPrefix(test, "TestPrivileged")
	l = strings.Replace(l, "Isolation/", "Isolation: ", 1)
	return strings.ReplaceAll(l, "_", " ")
}

func printTable(w io.Writer, m *Matrix) {
	width := 10
	for _, s := range m.Scenarios {
		if n := len(label(s)); n > width {
			width = n
		}
	}
	fmt.Fprintf(w, "\n%-*s", width, "scenario")
	for _, r := range m.Runs {
		fmt.Fprintf(w, " | %-16s", r.Selection)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%s", strings.Repeat("-", width))
	for range m.Runs {
		fmt.Fprintf(w, "-|-%s", strings.Repeat("-", 16))
	}
	fmt.Fprintln(w)
	for _, s := range m.Scenarios {
		fmt.Fprintf(w, "%-*s", width, label(s))
		for _, r := range m.Runs {
			res := r.Tests[s]
			if res == "" {
				res = "-"
			}
			fmt.Fprintf(w, " | %-16s", strings.ToUpper(res))
		}
		fmt.Fprintln(w)
	}
	row := func(name string, f func(*Run) string) {
		fmt.Fprintf(w, "%-*s", width, name)
		for _, r := range m.Runs {
			fmt.Fprintf(w, " | %-16s", f(r))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	row("Slurm", func(r *Run) string { return r.Version })
	row("daemons from", func(r *Run) string { return r.Kind })
	row("source build", func(r *Run) string {
		if r.BuildSeconds == 0 {
			return "-"
		}
		return fmt.Sprintf("%d s", r.BuildSeconds)
	})
	row("setup this run", func(r *Run) string { return fmt.Sprintf("%.0f s", r.SetupSeconds) })
	row("e2e suite", func(r *Run) string { return fmt.Sprintf("%.0f s", r.E2ESeconds) })
	row("result", func(r *Run) string {
		n := map[string]int{}
		for _, v := range r.Tests {
			n[v]++
		}
		res := "PASS"
		if !r.Passed {
			res = "FAIL"
		}
		out := fmt.Sprintf("%s %d ok", res, n["pass"])
		if n["fail"] > 0 {
			out += fmt.Sprintf(" %d fail", n["fail"])
		}
		if n["skip"] > 0 {
			out += fmt.Sprintf(" %d skip", n["skip"])
		}
		return out
	})
	var errs []string
	for _, r := range m.Runs {
		if r.Error != "" {
			errs = append(errs, r.Selection+": "+r.Error)
		}
	}
	sort.Strings(errs)
	for _, e := range errs {
		fmt.Fprintln(w, "error:", e)
	}
}

func write(m *Matrix, path string) error {
	m.Scenarios = scenarios(m.Runs)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
