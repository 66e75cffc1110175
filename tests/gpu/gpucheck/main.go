// SPDX-License-Identifier: Apache-2.0

//go:build cgo

// Command gpucheck checks gpufence on a machine with a real NVIDIA GPU
// (tests/gpu/run.sh drives it):
//
//	gpucheck inventory GPUFENCE   gpufence inventory --json against nvidia-smi
//	gpucheck isolate              a cgroup without the GPU cannot use it, one with it can
//
// Exit status: 0 passed, 1 failed, 77 skipped (the reason is printed).
package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/cgroup"
	"github.com/gpufence/gpufence/agent/devices"
	"github.com/gpufence/gpufence/agent/inventory"
	"github.com/gpufence/gpufence/agent/jobcgroup"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

const exitSkip = 77

// probeEnv makes gpucheck the probing child: it prints one probeResult as
// JSON for the device minors listed in the variable; devDirEnv is where
// their nodes are (default /dev); fakeEnv skips NVML and CUDA.
const (
	probeEnv  = "GPUCHECK_PROBE_MINORS"
	devDirEnv = "GPUCHECK_DEV_DIR"
	fakeEnv   = "GPUCHECK_FAKE"
)

func main() {
	if m := os.Getenv(probeEnv); m != "" {
		os.Exit(probe(m))
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gpucheck inventory GPUFENCE | gpucheck isolate [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "inventory":
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: gpucheck inventory PATH-TO-GPUFENCE")
			os.Exit(2)
		}
		os.Exit(checkInventory(os.Args[2]))
	case "isolate":
		os.Exit(isolate(os.Args[2:]))
	}
	fmt.Fprintf(os.Stderr, "gpucheck: unknown command %q\n", os.Args[1])
	os.Exit(2)
}

func checkInventory(gpufence string) int {
	out, err := exec.Command("nvidia-smi", "--query-gpu=index,minor_number,uuid,pci.bus_id,name", "--format=csv,noheader").Output()
	if err != nil {
		fmt.Printf("FAIL: nvidia-smi --query-gpu: %v\n", err)
		return 1
	}
	rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil {
		fmt.Printf("FAIL: nvidia-smi output is no CSV: %v\n%s", err, out)
		return 1
	}
	start := time.Now()
	cmd := exec.Command(gpufence, "inventory", "--json", "--usage")
	cmd.Stderr = os.Stderr
	js, err := cmd.Output()
	if err != nil {
		fmt.Printf("FAIL: %s inventory --json: %v (exit 3 means it found no driver: a CGO_ENABLED=0 build cannot load NVML)\n", gpufence, err)
		return 1
	}
	took := time.Since(start)
	var report struct {
		GPUs []struct {
			Index      int    `json:"index"`
			Minor      uint32 `json:"minor"`
			UUID       string `json:"uuid"`
			PCIBusID   string `json:"pci_bus_id"`
			Name       string `json:"name"`
			MIGEnabled bool   `json:"mig_enabled"`
			MIG        []any  `json:"mig"`
			Usage      *struct {
				UtilizationGPU *uint32 `json:"utilization_gpu_percent"`
				MemoryUsed     uint64  `json:"memory_used_bytes"`
				MemoryTotal    uint64  `json:"memory_total_bytes"`
			} `json:"usage"`
		} `json:"gpus"`
		Error *string `json:"error"`
	}
	if err := json.Unmarshal(js, &report); err != nil || report.GPUs == nil || report.Error != nil {
		fmt.Printf("FAIL: gpufence inventory --json is not {\"gpus\":[...]} without an error: %v\n%s", err, js)
		return 1
	}
	inv := report.GPUs
	fmt.Printf("nvidia-smi lists %d GPUs, gpufence inventory %d (in %s)\n", len(rows), len(inv), took.Round(time.Millisecond))
	failed := len(rows) != len(inv)
	for i, row := range rows {
		for j := range row {
			row[j] = strings.TrimSpace(row[j])
		}
		if len(row) != 5 {
			fmt.Printf("FAIL: nvidia-smi line %d has %d fields: %q\n", i+1, len(row), row)
			return 1
		}
		if i >= len(inv) {
			fmt.Printf("FAIL: nvidia-smi GPU %s (%s) is missing from gpufence inventory\n", row[0], row[2])
			continue
		}
		g := inv[i]
		got := []string{strconv.Itoa(g.Index), strconv.Itoa(int(g.Minor)), g.UUID, g.PCIBusID, g.Name}
		names := []string{"index", "minor_number", "uuid", "pci.bus_id", "name"}
		verdict := "ok"
		for k := range names {
			// nvidia-smi and NVML print the same bus id, in either case.
			if !strings.EqualFold(got[k], row[k]) {
				fmt.Printf("FAIL: GPU %d %s: gpufence %q, nvidia-smi %q\n", i, names[k], got[k], row[k])
				verdict, failed = "MISMATCH", true
			}
		}
		usage := ""
		if g.Usage != nil {
			util := "n/a"
			if g.Usage.UtilizationGPU != nil {
				util = fmt.Sprintf("%d%%", *g.Usage.UtilizationGPU)
			}
			usage = fmt.Sprintf(" util %s mem %d/%d MiB", util, g.Usage.MemoryUsed>>20, g.Usage.MemoryTotal>>20)
		}
		fmt.Printf("  GPU %d minor %d %s %s %q mig=%v (%d MIG devices)%s: %s\n", g.Index, g.Minor, g.UUID, g.PCIBusID, g.Name, g.MIGEnabled, len(g.MIG), usage, verdict)
	}
	if failed {
		fmt.Println("FAIL: gpufence inventory does not match nvidia-smi")
		return 1
	}
	fmt.Println("PASS: gpufence inventory matches nvidia-smi (index, minor, UUID, bus id, name)")
	return 0
}

// probeResult is what one process in the test cgroup could do.
type probeResult struct {
	Cgroup string            `json:"cgroup"`
	Open   map[string]string `json:"open"` // /dev/nvidiaN -> "OK" or errno name
	NVML   struct {
		Init  string   `json:"init"`
		Count int      `json:"count"`
		UUIDs []string `json:"uuids"`
		Notes []string `json:"notes"`
	} `json:"nvml"`
	CUDA cudaResult `json:"cuda"`
}

func probe(minors string) int {
	var r probeResult
	if cg, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, l := range strings.Split(string(cg), "\n") {
			if strings.HasPrefix(l, "0::") {
				r.Cgroup = strings.TrimPrefix(l, "0::")
			}
		}
	}
	r.Open = map[string]string{}
	devDir := os.Getenv(devDirEnv)
	if devDir == "" {
		devDir = "/dev"
	}
	for _, m := range strings.Split(minors, ",") {
		p := filepath.Join(devDir, "nvidia"+m)
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
			r.Open[p] = "OK"
			continue
		}
		var errno unix.Errno
		if errors.As(err, &errno) {
			r.Open[p] = unix.ErrnoName(errno)
		} else {
			r.Open[p] = err.Error()
		}
	}
	r.NVML.UUIDs = []string{}
	if os.Getenv(fakeEnv) != "" {
		json.NewEncoder(os.Stdout).Encode(r)
		return 0
	}
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		r.NVML.Init = ret.Error()
	} else {
		r.NVML.Init = "SUCCESS"
		n, ret := lib.DeviceGetCount()
		if ret != nvml.SUCCESS {
			r.NVML.Notes = append(r.NVML.Notes, "count: "+ret.Error())
		}
		r.NVML.Count = n
		for i := 0; i < n; i++ {
			dev, ret := lib.DeviceGetHandleByIndex(i)
			if ret != nvml.SUCCESS {
				r.NVML.Notes = append(r.NVML.Notes, fmt.Sprintf("GPU %d handle: %v", i, ret))
				continue
			}
			u, ret := dev.GetUUID()
			if ret != nvml.SUCCESS {
				r.NVML.Notes = append(r.NVML.Notes, fmt.Sprintf("GPU %d UUID: %v", i, ret))
				continue
			}
			r.NVML.UUIDs = append(r.NVML.UUIDs, u)
		}
		lib.Shutdown()
	}
	r.CUDA = probeCUDA()
	json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

// isolate builds <cgroup2>/gpucheck-<pid>/job_1/step_0, puts the device
// filter on it with no GPU, then with one, and runs a probe in it each time.
func isolate(args []string) int {
	fs := flag.NewFlagSet("gpucheck isolate", flag.ExitOnError)
	nvidiaSMI := fs.String("nvidia-smi", "nvidia-smi", "nvidia-smi to run inside the cgroup too (empty: skip)")
	timeout := fs.Duration("timeout", 90*time.Second, "limit for each probe")
	modeFlag := fs.String("mode", "auto", "device filter mode: auto (probe the kernel), scope or per-cgroup")
	fakeDir := fs.String("fake-dev-dir", "", "test the mechanics without a GPU: mknod fake GPUs 195:0 and 195:1 in this directory (an allowed open then fails with ENXIO)")
	fs.Parse(args)
	if os.Geteuid() != 0 {
		fmt.Println("FAIL: isolate needs root (cgroups and BPF)")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var gpus []inventory.GPU
	if *fakeDir != "" {
		for i := range 2 {
			p := filepath.Join(*fakeDir, fmt.Sprintf("nvidia%d", i))
			if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(devices.DefaultNvidiaMajor, uint32(i)))); err != nil && !errors.Is(err, unix.EEXIST) {
				fmt.Printf("FAIL: %v\n", err)
				return 1
			}
			gpus = append(gpus, inventory.GPU{Index: i, Minor: uint32(i), UUID: fmt.Sprintf("fake-%d", i), Name: "fake"})
		}
		*nvidiaSMI = ""
	} else {
		inv, err := inventory.OpenSystem(inventory.Options{})
		if err != nil {
			fmt.Printf("FAIL: NVML in gpucheck itself: %v\n", err)
			return 1
		}
		gpus, err = inv.GPUs()
		inv.Close()
		if err != nil || len(gpus) == 0 {
			fmt.Printf("FAIL: NVML lists no GPU (%v)\n", err)
			return 1
		}
	}
	target := gpus[0]
	var minors []string
	for _, g := range gpus {
		minors = append(minors, strconv.Itoa(int(g.Minor)))
	}
	fmt.Printf("GPU under test: NVML %d, /dev/nvidia%d, %s (%s); %d GPU(s) on this machine\n", target.Index, target.Minor, target.UUID, target.Name, len(gpus))
	if target.MIGEnabled {
		fmt.Println("note: MIG is enabled on it; CUDA then needs the MIG caps devices too, which this check does not narrow")
	}

	mount, err := jobcgroup.Mountpoint()
	if err != nil {
		fmt.Printf("SKIP: no cgroup v2 here: %v\n", err)
		return exitSkip
	}
	mode, err := devfilter.Probe()
	if err != nil {
		fmt.Printf("SKIP: this kernel cannot run gpufence's device filter: %v\n", err)
		return exitSkip
	}
	if *modeFlag != "auto" {
		mode = devfilter.Mode(*modeFlag)
	}
	major, _, err := devices.NvidiaMajor()
	if err != nil {
		fmt.Printf("FAIL: /proc/devices: %v\n", err)
		return 1
	}
	if *fakeDir != "" {
		major = devices.DefaultNvidiaMajor
	}
	scope := filepath.Join(mount, fmt.Sprintf("gpucheck-%d", os.Getpid()))
	step := filepath.Join(scope, "job_1", "step_0")
	if err := os.MkdirAll(step, 0o755); err != nil {
		if errors.Is(err, unix.EROFS) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			fmt.Printf("SKIP: cannot create a cgroup here: %v\n", err)
			return exitSkip
		}
		fmt.Printf("FAIL: %v\n", err)
		return 1
	}
	defer func() {
		for _, d := range []string{step, filepath.Dir(step), scope} {
			if err := os.Remove(d); err != nil {
				fmt.Printf("cleanup: %v\n", err)
			}
		}
	}()
	id, err := jobcgroup.ID(step)
	if err != nil {
		fmt.Printf("FAIL: %v\n", err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := time.Now()
	f, err := devfilter.New(devfilter.Options{Mode: mode, ScopeDir: scope, NvidiaMajor: major, Logger: log, AuditAllowed: devfilter.AuditAllowedFirst})
	if err != nil {
		fmt.Printf("FAIL: load and attach the device filter (%s mode) on %s: %v\n", mode, scope, err)
		return 1
	}
	fmt.Printf("device filter: %s mode on %s, NVIDIA major %d, loaded in %s\n", mode, scope, major, time.Since(start).Round(time.Millisecond))
	events := make(chan devfilter.Event, 1024)
	go func() {
		defer close(events)
		for {
			ev, err := f.ReadEvent()
			if err != nil {
				return
			}
			select {
			case events <- ev:
			default:
			}
		}
	}()
	cg := cgroup.Cgroup{ID: id, Path: step}
	failed := false
	for _, phase := range []struct {
		name  string
		allow []uint32
	}{
		{"no GPU", nil},
		{fmt.Sprintf("GPU minor %d only", target.Minor), []uint32{target.Minor}},
	} {
		if err := f.Set(cg, devfilter.Policy{GPUMinors: phase.allow}); err != nil {
			fmt.Printf("FAIL: set policy: %v\n", err)
			failed = true
			break
		}
		res, smi, took, err := runProbe(ctx, step, strings.Join(minors, ","), *fakeDir, *nvidiaSMI, *timeout)
		if err != nil {
			fmt.Printf("FAIL: phase %q: %v\n", phase.name, err)
			failed = true
			continue
		}
		fmt.Printf("phase %q (%s, cgroup %s):\n", phase.name, took.Round(time.Millisecond), res.Cgroup)
		if !judge(res, smi, gpus, phase.allow, *fakeDir) {
			failed = true
		}
	}
	if err := f.Remove(cg); err != nil {
		fmt.Printf("remove policy: %v\n", err)
	}
	if err := f.Close(); err != nil {
		fmt.Printf("close filter: %v\n", err)
	}
	counts := map[devfilter.Decision]int{}
	for ev := range events {
		counts[ev.Decision]++
	}
	fmt.Printf("kernel audit events: %d denied, %d allowed\n", counts[devfilter.DecisionDenied], counts[devfilter.DecisionAllowed])
	if counts[devfilter.DecisionDenied] == 0 {
		fmt.Println("FAIL: the filter reported no denied access")
		failed = true
	}
	if failed {
		fmt.Println("FAIL: GPU isolation")
		return 1
	}
	fmt.Println("PASS: a process in a cgroup without the GPU cannot open or use it; with it, it can")
	return 0
}

// smiResult is nvidia-smi -L run in the cgroup.
type smiResult struct {
	ran    bool
	rc     int
	output string
}

func runProbe(ctx context.Context, dir, minors, fakeDir, nvidiaSMI string, timeout time.Duration) (probeResult, smiResult, time.Duration, error) {
	var res probeResult
	var smi smiResult
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return res, smi, 0, err
	}
	defer unix.Close(fd)
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return res, smi, 0, err
	}
	start := time.Now()
	cmd := exec.CommandContext(cctx, self)
	cmd.Env = append(cleanEnv(), probeEnv+"="+minors)
	if fakeDir != "" {
		cmd.Env = append(cmd.Env, devDirEnv+"="+fakeDir, fakeEnv+"=1")
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	out, err := cmd.Output()
	took := time.Since(start)
	if err != nil {
		return res, smi, took, fmt.Errorf("probe: %w", err)
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return res, smi, took, fmt.Errorf("probe output: %w: %s", err, out)
	}
	if nvidiaSMI != "" {
		if path, err := exec.LookPath(nvidiaSMI); err == nil {
			c := exec.CommandContext(cctx, path, "-L")
			c.Env = cleanEnv()
			c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
			o, err := c.CombinedOutput()
			smi = smiResult{ran: true, output: strings.TrimSpace(string(o))}
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				smi.rc = ee.ExitCode()
			} else if err != nil {
				return res, smi, took, fmt.Errorf("nvidia-smi -L: %w", err)
			}
		}
	}
	return res, smi, took, nil
}

// cleanEnv drops what would narrow CUDA's view by itself.
func cleanEnv() []string {
	var out []string
	for _, e := range os.Environ() {
		if k, _, _ := strings.Cut(e, "="); k == "CUDA_VISIBLE_DEVICES" || k == "NVIDIA_VISIBLE_DEVICES" || k == probeEnv || k == devDirEnv || k == fakeEnv {
			continue
		}
		out = append(out, e)
	}
	return out
}

// judge prints one phase's figures and says whether each GPU was usable
// exactly when allowed.
func judge(r probeResult, smi smiResult, gpus []inventory.GPU, allow []uint32, fakeDir string) bool {
	ok := true
	devDir := "/dev"
	if fakeDir != "" {
		devDir = fakeDir
	}
	for _, g := range gpus {
		allowed := slices.Contains(allow, g.Minor)
		p := filepath.Join(devDir, fmt.Sprintf("nvidia%d", g.Minor))
		open := r.Open[p]
		nvmlSees := slices.Contains(r.NVML.UUIDs, g.UUID)
		cudaSees := slices.Contains(r.CUDA.UUIDs, g.UUID)
		smiSees := smi.ran && strings.Contains(smi.output, g.UUID)
		want := "EPERM"
		switch {
		case allowed && fakeDir != "":
			want = "ENXIO" // a fake node has no driver behind it
		case allowed:
			want = "OK"
		}
		v := func(cond bool) string {
			if cond {
				return "ok"
			}
			ok = false
			return "WRONG"
		}
		fmt.Printf("  GPU %d %s allowed=%v: open %s %s=%s", g.Index, p, allowed, p, open, v(open == want))
		if fakeDir == "" {
			fmt.Printf("; NVML sees it=%v %s", nvmlSees, v(nvmlSees == allowed))
		}
		if r.CUDA.Loaded {
			fmt.Printf("; CUDA sees it=%v %s", cudaSees, v(cudaSees == allowed))
		}
		if smi.ran {
			fmt.Printf("; nvidia-smi -L lists it=%v %s", smiSees, v(smiSees == allowed))
		}
		fmt.Println()
	}
	if fakeDir != "" {
		return ok
	}
	fmt.Printf("  NVML: init %s, %d device(s), %d reachable %v", r.NVML.Init, r.NVML.Count, len(r.NVML.UUIDs), r.NVML.Notes)
	if r.CUDA.Loaded {
		fmt.Printf("; CUDA: cuInit %d, %d device(s), context on device 0: %d, 1 MiB cuMemAlloc: %d", r.CUDA.Init, r.CUDA.Count, r.CUDA.Ctx, r.CUDA.Alloc)
		if len(allow) > 0 && (r.CUDA.Ctx != 0 || r.CUDA.Alloc != 0) {
			fmt.Print(" WRONG (an allowed GPU must be usable)")
			ok = false
		}
	} else {
		fmt.Print("; CUDA: libcuda.so.1 not loadable, not probed")
	}
	if smi.ran {
		fmt.Printf("; nvidia-smi -L exit %d", smi.rc)
	}
	fmt.Println()
	return ok
}
