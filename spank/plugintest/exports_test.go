// SPDX-License-Identifier: Apache-2.0

package plugintest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestExportsOnlySpankSymbols(t *testing.T) {
	trackSources(t)
	out, err := exec.Command("nm", "-D", "--defined-only", filepath.Join(binDir, "spank_gpufence.so")).Output()
	if err != nil {
		t.Fatalf("nm: %v", err)
	}
	got := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		name := f[len(f)-1]
		got[name] = true
		switch {
		case name == "plugin_name", name == "plugin_type", name == "plugin_version",
			strings.HasPrefix(name, "slurm_spank_"):
		default:
			t.Errorf("exports %q; only slurm_spank_* and plugin_name/type/version may be exported", name)
		}
	}
	for _, want := range []string{"plugin_name", "plugin_type", "plugin_version",
		"slurm_spank_init", "slurm_spank_job_prolog", "slurm_spank_task_post_fork",
		"slurm_spank_task_init", "slurm_spank_job_epilog"} {
		if !got[want] {
			t.Errorf("does not export %s", want)
		}
	}
	// The step's end sends nothing: Slurm need not call the plugin then.
	if got["slurm_spank_exit"] {
		t.Error("exports slurm_spank_exit, which has nothing to do")
	}
}

// srun, sbatch and salloc load the entry: it must not carry a Go runtime.
func TestNoGoRuntime(t *testing.T) {
	trackSources(t)
	so := filepath.Join(binDir, "spank_gpufence.so")
	all, err := exec.Command("nm", "-D", so).Output()
	if err != nil {
		t.Fatalf("nm: %v", err)
	}
	for _, marker := range []string{"_cgo_", "runtime.", "x_cgo", "crosscall"} {
		if strings.Contains(string(all), marker) {
			t.Errorf("dynamic symbols mention %q: the C entry must not contain Go", marker)
		}
	}
	dyn, err := exec.Command("readelf", "-d", so).Output()
	if err != nil {
		t.Fatalf("readelf: %v", err)
	}
	for _, line := range strings.Split(string(dyn), "\n") {
		if !strings.Contains(line, "(NEEDED)") {
			continue
		}
		if !strings.Contains(line, "[libc.so.6]") {
			t.Errorf("links more than libc: %s", strings.TrimSpace(line))
		}
	}
	// Nothing in the plugin forks slurmstepd, loads a library or starts
	// a thread: every call is a plain system call in the caller.
	undef, err := exec.Command("nm", "-D", "--undefined-only", so).Output()
	if err != nil {
		t.Fatalf("nm --undefined-only: %v", err)
	}
	for _, f := range strings.Fields(string(undef)) {
		name, _, _ := strings.Cut(f, "@")
		switch name {
		case "fork", "vfork", "clone", "clone3", "posix_spawn", "posix_spawnp", "system", "popen",
			"dlopen", "dlmopen", "pthread_create", "execve", "execv", "execvp":
			t.Errorf("the plugin calls %s", name)
		}
	}
}

// Slurm refuses a plugin whose major.minor differs from its own.
func TestPluginVersionMatchesHeaders(t *testing.T) {
	src := filepath.Join(t.TempDir(), "version.c")
	if err := os.WriteFile(src, []byte(`#include <dlfcn.h>
#include <stdio.h>
#include <slurm/slurm_version.h>
int main(int argc, char **argv)
{
	void *h = dlopen(argv[argc - 1], RTLD_LAZY | RTLD_LOCAL);
	const unsigned int *v;
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	if (!(v = dlsym(h, "plugin_version"))) { printf("no plugin_version\n"); return 1; }
	printf("%#x %#x\n", *v, (unsigned int)SLURM_VERSION_NUMBER);
	return 0;
}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := compile(t, "version", src, "-ldl")
	out, err := exec.Command(exe, filepath.Join(binDir, "spank_gpufence.so")).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 || f[0] != f[1] {
		t.Errorf("plugin_version %s, installed headers say SLURM_VERSION_NUMBER %s", f[0], f[len(f)-1])
	}
}
