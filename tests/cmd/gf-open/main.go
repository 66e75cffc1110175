// Command gf-open is the job payload of the end-to-end tests: it opens each
// path read-write and prints `PATH RESULT`, where RESULT is OK or the errno
// name (ENXIO: the device cgroup allowed a fake GPU that has no driver;
// EPERM: a device filter denied it). With -env it first prints the GPU
// variables and its cgroup2 path as `env NAME=VALUE`, `env NAME (unset)`
// and `cgroup 0::PATH`.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

var envVars = []string{
	"CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
	"SLURM_JOB_ID", "SLURM_STEP_ID",
}

func main() {
	showEnv := flag.Bool("env", false, "print GPU variables and the cgroup2 path first")
	loop := flag.Int("loop", 1, "open every path this many times")
	sleep := flag.Duration("sleep", 0, "pause between rounds of -loop")
	count := flag.Int("count", 0, "open every path this many times as fast as possible and print one line per path and result: PATH RESULT xN")
	flag.Parse()
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
	for i := 0; i < *loop; i++ {
		if i > 0 && *sleep > 0 {
			time.Sleep(*sleep)
		}
		for _, p := range flag.Args() {
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
