// SPDX-License-Identifier: Apache-2.0

// Command gf-open is the job payload of the end-to-end tests: it opens each
// path read-write and prints `PATH RESULT`, where RESULT is OK or the errno
// name (ENXIO: the device cgroup allowed a fake GPU that has no driver;
// EPERM: a device filter denied it). With -env it first prints the GPU
// variables and its cgroup2 path as `env NAME=VALUE`, `env NAME (unset)`
// and `cgroup 0::PATH`. With -comm it first renames itself (prctl
// PR_SET_NAME, as any process may); with -exec it opens each path once,
// prints nothing, and at once execs another program, as a process that
// opens a GPU and becomes another program would.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The main goroutine stays on the main thread, whose comm -comm sets and
// the kernel reports for the opens.
func init() { runtime.LockOSThread() }

var envVars = []string{
	"CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
	"SLURM_JOB_ID", "SLURM_STEP_ID",
}

func main() {
	showEnv := flag.Bool("env", false, "print GPU variables and the cgroup2 path first")
	loop := flag.Int("loop", 1, "open every path this many times")
	sleep := flag.Duration("sleep", 0, "pause between rounds of -loop")
	until := flag.String("until", "", "open every path in rounds (pausing -sleep) until this file exists, instead of -loop rounds")
	stamp := flag.Bool("stamp", false, "start each PATH RESULT line with the time of the open (Unix nanoseconds)")
	count := flag.Int("count", 0, "open every path this many times as fast as possible and print one line per path and result: PATH RESULT xN")
	comm := flag.String("comm", "", "set the process name (prctl PR_SET_NAME, at most 15 bytes, any bytes) before opening")
	execProg := flag.String("exec", "", "open each path once, print nothing, then exec this program at once")
	var execArgs multi
	flag.Var(&execArgs, "exec-arg", "an argument for -exec (repeatable)")
	flag.Parse()
	if *comm != "" {
		name := append([]byte(*comm), 0)
		if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "gf-open: prctl(PR_SET_NAME):", err)
			os.Exit(2)
		}
	}
	if *execProg != "" {
		for _, p := range flag.Args() {
			open(p)
		}
		err := syscall.Exec(*execProg, append([]string{*execProg}, execArgs...), os.Environ())
		fmt.Fprintln(os.Stderr, "gf-open: exec:", err)
		os.Exit(2)
	}
	if *showEnv {
		for _, k := range envVars {
			if v, ok := os.LookupEnv(k); ok {
				fmt.Printf("env %s=%s\n", k, v)
			} else {
				fmt.Printf("env %s (unset)\n", k)
			}
		}
		fmt.Printf("cgroup %s\n", cgroup2())
	}
	if *count > 0 {
		for _, p := range flag.Args() {
			tally := map[string]int{}
			for range *count {
				tally[open(p)]++
			}
			for res, n := range tally {
				fmt.Printf("%s %s x%d\n", p, res, n)
			}
		}
		return
	}
	for i := 0; *until != "" || i < *loop; i++ {
		if *until != "" {
			if _, err := os.Stat(*until); err == nil {
				return
			}
		}
		if i > 0 && *sleep > 0 {
			time.Sleep(*sleep)
		}
		for _, p := range flag.Args() {
			if *stamp {
				t := time.Now().UnixNano()
				fmt.Printf("%d %s %s\n", t, p, open(p))
				continue
			}
			fmt.Printf("%s %s\n", p, open(p))
		}
	}
}

func open(p string) string {
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
		return "OK"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if name := unix.ErrnoName(errno); name != "" {
			return strings.ToUpper(name)
		}
		return fmt.Sprintf("ERRNO%d", int(errno))
	}
	return "ERROR"
}

func cgroup2() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "0::") {
			return l
		}
	}
	return "none"
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }
