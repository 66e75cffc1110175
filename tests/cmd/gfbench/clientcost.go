// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// clientCostC times what one call of the plugin's client costs the calling
// process, from a parent as big as a slurmstepd (8 MB touched), with nothing
// else of Slurm around it. Modes: 0 one JobEpilog exchange with a stand-in
// agent that answers at once, by spank/plugin/client.c in the calling
// process (what the plugin does for every exchange); 1 fork and exit (what
// the smallest child of a slurmstepd costs: the plugin forks none); 2 one
// fail-open spool line by spank/plugin/spool.c in the calling process (what
// a step failure=open lets run costs; a forked child that loaded a Go
// library for it cost 3-4 ms before). It prints "<median ms> <p90 ms> <CPU
// ms per call>".
const clientCostC = `#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "client.h"
#include "spool.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static double cpu_ms(int who) { struct rusage ru; getrusage(who, &ru); return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv)
{
	if (argc != 5) return 2;
	const char *spool = argv[1], *sock = argv[4];
	int n = atoi(argv[2]), mode = atoi(argv[3]);
	char *ballast = malloc(8 << 20);
	double *t = malloc(n * sizeof(double));
	double cpu0 = cpu_ms(RUSAGE_SELF);
	if (!ballast || !t || n < 1) return 2;
	memset(ballast, 1, 8 << 20);
	for (int i = 0; i < n; i++) {
		double s = now();
		if (mode == 0) {
			char e[512];
			if (gf_client_job_epilog(sock, 5000, 1, e, sizeof(e))) { fprintf(stderr, "%s\n", e); return 7; }
			t[i] = now() - s;
			continue;
		}
		if (mode == 2) {
			char e[512];
			if (gf_spool_append(spool, 1, "0", 0, "connect: connection refused", e, sizeof(e))) { fprintf(stderr, "%s\n", e); return 8; }
			t[i] = now() - s;
			continue;
		}
		pid_t p = fork();
		int st;
		if (p < 0) return 3;
		if (p == 0)
			_exit(0);
		if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st)) { fprintf(stderr, "child failed: %d\n", st); return 1; }
		t[i] = now() - s;
	}
	qsort(t, n, sizeof(double), cmp);
	printf("%.4f %.4f %.4f\n", t[n / 2], t[n * 9 / 10],
	       (mode != 1 ? cpu_ms(RUSAGE_SELF) - cpu0 : cpu_ms(RUSAGE_CHILDREN)) / n);
	return 0;
}
`

// clientCost is one mode of clientCostC.
type clientCost struct {
	What   string  `json:"what"`
	N      int     `json:"n"`
	Median float64 `json:"median_ms"`
	P90    float64 `json:"p90_ms"`
	CPU    float64 `json:"cpu_ms_per_call"` // the caller's, the child's for fork + exit
}

var clientCostModes = []string{
	"one exchange, C client in the caller (stand-in agent)",
	"fork + exit",
	"one fail-open spool line, C writer in the caller",
}

// pluginSrc is where clientCostC finds the plugin's client and spool files:
// gfbench runs from the repository root (make bench).
const pluginSrc = "spank/plugin"

// measureClientCost builds clientCostC in dir with the plugin's client and
// spool writer and runs each mode n times (the spool under dir).
func measureClientCost(dir string, n int) ([]clientCost, error) {
	src, bin := filepath.Join(dir, "clientcost.c"), filepath.Join(dir, "clientcost")
	if err := os.WriteFile(src, []byte(clientCostC), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.Command("cc", "-std=gnu11", "-O2", "-Wall", "-Werror", "-I"+pluginSrc, "-o", bin, src,
		filepath.Join(pluginSrc, "client.c"), filepath.Join(pluginSrc, "spool.c")).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the client cost probe: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "standin.sock")
	ln, err := standInAgent(sock)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	var out []clientCost
	for mode, what := range clientCostModes {
		res, err := exec.Command(bin, filepath.Join(dir, "spool", "failopen.jsonl"), strconv.Itoa(n), strconv.Itoa(mode), sock).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("client cost probe, %s: %v\n%s", what, err, res)
		}
		c, err := parseClientCost(string(res))
		if err != nil {
			return nil, fmt.Errorf("client cost probe, %s: %w", what, err)
		}
		c.What, c.N = what, n
		out = append(out, c)
	}
	return out, nil
}

func parseClientCost(line string) (clientCost, error) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return clientCost{}, fmt.Errorf("output %q: want 3 numbers", line)
	}
	var v [3]float64
	for i := range f {
		x, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return clientCost{}, fmt.Errorf("output %q: %w", line, err)
		}
		v[i] = x
	}
	return clientCost{Median: v[0], P90: v[1], CPU: v[2]}, nil
}

// standInAgent answers each request framed as the agent's protocol is
// (varint length, message) with an empty Response: success, no GPUs. It
// measures the client, not the agent (whose time is its histogram).
func standInAgent(sock string) (net.Listener, error) {
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if readFrame(c) == nil {
					c.Write(protowire.AppendVarint(nil, 0))
				}
			}()
		}
	}()
	return ln, nil
}

// readFrame reads one varint-length-prefixed message from r.
func readFrame(r io.Reader) error {
	var buf []byte
	chunk := make([]byte, 512)
	for {
		if size, n := protowire.ConsumeVarint(buf); n > 0 && len(buf) >= n+int(size) {
			return nil
		}
		k, err := r.Read(chunk)
		if err != nil {
			return err
		}
		buf = append(buf, chunk[:k]...)
	}
}

func printClientCost(w io.Writer, cs []clientCost) {
	fmt.Fprintln(w, "one call of the plugin's client, from an 8 MB parent (no Slurm around it; CPU: the caller's for the exchange, the child's for the others)")
	fmt.Fprintf(w, "%-54s %5s %10s %8s %12s\n", "what", "N", "median ms", "p90 ms", "CPU ms")
	for _, c := range cs {
		fmt.Fprintf(w, "%-54s %5d %10.3f %8.3f %12.3f\n", c.What, c.N, c.Median, c.P90, c.CPU)
	}
}
