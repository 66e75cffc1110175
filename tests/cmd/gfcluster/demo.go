// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gpufence/gpufence/tests/cluster"
)

// demo shows a newcomer what gpufence does on a real Slurm: jobs see only
// their GPUs, forged variables change nothing, denials are logged.
func demo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	bin := fs.String("bin", "bin", "folder with gpufence and spank_gpufence.so")
	keep := fs.Bool("keep", false, "leave the cluster running afterwards (stop it with `gfcluster down`)")
	fs.Parse(args)
	binDir, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	for _, f := range []string{"gpufence", "spank_gpufence.so"} {
		if _, err := os.Stat(filepath.Join(binDir, f)); err != nil {
			return fmt.Errorf("%v (run `make build` first)", err)
		}
	}
	setup, err := cluster.Ensure(ctx, logf)
	if err != nil {
		return err
	}
	c, err := cluster.Start(ctx, cluster.Options{Logf: logf, Keep: *keep})
	if err != nil {
		return errors.Join(err, setup.Teardown(logf))
	}
	var agent *cluster.Process
	defer func() {
		if *keep {
			setup.HoldFor(c.Root())
			c.SetSetup(setup)
			os.WriteFile(currentFile, []byte(c.Root()), 0o644)
			fmt.Printf("\nThe cluster keeps running: export SLURM_CONF=%s; stop it with `gfcluster down`.\n", c.SlurmConf())
			return
		}
		if agent != nil {
			agent.Stop()
		}
		c.Stop()
		setup.Teardown(logf)
	}()

	sock := filepath.Join(c.Root(), "run", "agent.sock")
	if err := c.WritePlugstack([]string{fmt.Sprintf("required %s/spank_gpufence.so socket=%s", binDir, sock)}); err != nil {
		return err
	}
	if err := c.RestartSlurmd(false); err != nil {
		return err
	}
	agent, err = c.StartAgent(ctx, filepath.Join(binDir, "gpufence"), "agent", "--socket", sock, "--slurm-conf", c.SlurmConf(),
		// The demo leaves no pins, state or audit file behind on the host.
		"--pin-dir=", "--state-file=", "--audit-file", filepath.Join(c.Root(), "logs", "audit.jsonl"))
	if err != nil {
		return err
	}
	if err := cluster.WaitSocket(sock, 20*time.Second); err != nil {
		return err
	}
	open, err := c.BuildTool(ctx, "gf-open")
	if err != nil {
		return err
	}

	title := func(s string) { fmt.Printf("\n\033[1m== %s\033[0m\n", s) }
	show := func(r cluster.Result) {
		rep := cluster.ParseOpen(r.Stdout)
		fmt.Printf("   SLURM_STEP_GPUS=%s  CUDA_VISIBLE_DEVICES=%s\n", or(rep.Env["SLURM_STEP_GPUS"], "(unset)"), or(rep.Env["CUDA_VISIBLE_DEVICES"], "(unset)"))
		for i, p := range c.DevPaths() {
			verdict := "denied by the kernel (EPERM)"
			if rep.Open[p] == "ENXIO" || rep.Open[p] == "OK" {
				verdict = "allowed (ENXIO: a fake GPU has no driver)"
			}
			fmt.Printf("   GPU %d  %-14s %s\n", i, rep.Open[p], verdict)
		}
		if r.Code != 0 {
			fmt.Printf("   exit %d: %s\n", r.Code, strings.TrimSpace(r.Stderr))
		}
	}
	probe := append([]string{open, "-env"}, c.DevPaths()...)
	fmt.Printf("A real Slurm %s with 4 fake GPUs (char 195:0-3 under %s/dev) is up; jobs run as user %s.\n",
		slurmVersion(ctx, c), c.Root(), cluster.TestUser)

	title("1. srun --gres=gpu:1: the job can open its GPU and no other")
	show(c.Run(ctx, cluster.TestUser, "srun", append([]string{"--gres=gpu:1"}, probe...)...))

	title("2. The same job with CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS and SLURM_JOB_GPUS forged to 0,1,2,3")
	forged := []string{"CUDA_VISIBLE_DEVICES=0,1,2,3", "SLURM_STEP_GPUS=0,1,2,3", "SLURM_JOB_GPUS=0,1,2,3"}
	show(c.RunEnv(ctx, cluster.TestUser, forged, "srun", append([]string{"--gres=gpu:1"}, probe...)...))

	title("3. Two jobs at once with 2 GPUs each: neither reaches the other's")
	var wg sync.WaitGroup
	res := make([]cluster.Result, 2)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = c.Run(ctx, cluster.TestUser, "srun", append([]string{"--gres=gpu:2"}, probe...)...)
		}()
	}
	wg.Wait()
	for i, r := range res {
		fmt.Printf("  job %c:\n", 'A'+i)
		show(r)
	}

	title("4. A CPU-only job on the GPU node gets no GPU")
	show(c.Run(ctx, cluster.TestUser, "srun", probe...))

	title("5. What the agent logged about the refused opens (the audit trail)")
	time.Sleep(300 * time.Millisecond)
	printDenials(agent.Log, 6)

	title("6. Agent stopped: a GPU job is refused at launch, with the reason")
	agent.Stop()
	agent = nil
	r := c.Run(ctx, cluster.TestUser, "srun", append([]string{"--gres=gpu:1"}, probe...)...)
	fmt.Printf("   exit %d\n", r.Code)
	for _, l := range strings.Split(strings.TrimSpace(r.Stderr), "\n") {
		if strings.Contains(l, "gpufence:") || strings.Contains(l, "srun: error") {
			fmt.Printf("   %s\n", l)
		}
	}
	fmt.Println("\nDone. Run `gfcluster demo --keep` to keep the cluster and its logs afterwards.")
	return nil
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func slurmVersion(ctx context.Context, c *cluster.Cluster) string {
	r := c.Run(ctx, "", "sinfo", "--version")
	return strings.TrimSpace(r.Stdout)
}

// printDenials prints the last n denial lines of the agent log, shortened.
func printDenials(path string, n int) {
	f, err := os.Open(path)
	if err != nil {
		fmt.Println("   ", err)
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "GPU access denied") {
			lines = append(lines, sc.Text())
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for _, l := range lines {
		var keep []string
		for _, kv := range strings.Fields(l) {
			for _, k := range []string{"job_id=", "step_id=", "uid=", "pid=", "comm=", "gpu=", "device="} {
				if strings.HasPrefix(kv, k) {
					keep = append(keep, kv)
				}
			}
		}
		fmt.Println("   denied: " + strings.Join(keep, " "))
	}
	if len(lines) == 0 {
		fmt.Println("   (none found in", path+")")
	}
}
