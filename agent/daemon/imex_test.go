// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/imexchan"
	"github.com/gpufence/gpufence/agent/peer"
	"github.com/gpufence/gpufence/agent/recovery"
	"github.com/gpufence/gpufence/bpf/devfilter"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// The slurmstepd stand-in for IMEX: the test binary re-executed in a step's
// cgroup waits for a line on stdin (the step registered, as spank_init
// comes before switch_g_job_init), then does what switch/nvidia_imex does
// there (a mount namespace of its own, a tmpfs on the channel directory,
// one channel node, made in the step's cgroup), then waits.
func init() {
	spec := os.Getenv("GPUFENCE_TEST_IMEX_STEPD")
	if spec == "" {
		return
	}
	var dir string
	var major, minor uint32
	if _, err := fmt.Sscanf(spec, "%s %d %d", &dir, &major, &minor); err != nil {
		fmt.Fprintln(os.Stderr, "stepd spec:", err)
		os.Exit(2)
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("started")
	in.ReadString('\n')
	for _, step := range []func() error{
		func() error { return unix.Unshare(unix.CLONE_NEWNS) },
		func() error { return unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, "") },
		func() error {
			return unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=0,mode=0755")
		},
		func() error {
			return unix.Mknod(filepath.Join(dir, fmt.Sprintf("channel%d", minor)), unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor)))
		},
	} {
		if err := step(); err != nil {
			fmt.Fprintln(os.Stderr, "stepd:", err)
			os.Exit(2)
		}
	}
	fmt.Println("ready")
	io.ReadAll(in)
	os.Exit(0)
}

// imexStepd starts the stand-in in cgroup dir and returns its pid and the
// function that lets it make its channel (after its StepStart).
func (tr *tree) imexStepd(dir, chanDir string, major, minor uint32) (int, func()) {
	tr.t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("GPUFENCE_TEST_IMEX_STEPD=%s %d %d", chanDir, major, minor))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tr.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tr.t.Fatal(err)
	}
	if err := tr.inCgroup(dir, cmd, cmd.Start); err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { in.Close(); cmd.Wait() })
	r := bufio.NewReader(out)
	wait := func(want string) {
		tr.t.Helper()
		line, err := r.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != want {
			tr.t.Fatalf("IMEX stepd stand-in: %q %v, want %q", line, err, want)
		}
	}
	wait("started")
	return cmd.Process.Pid, func() {
		tr.t.Helper()
		if _, err := in.Write([]byte("go\n")); err != nil {
			tr.t.Fatal(err)
		}
		wait("ready")
	}
}

func callChannel(d *Daemon, pid int, job, step uint32) *pb.Response {
	return d.h.Handle(nil, peer.Peer{PID: pid}, &pb.Request{Version: pb.ProtocolVersion_PROTOCOL_VERSION_1,
		Msg: &pb.Request_StepChannel{StepChannel: &pb.StepChannel{JobId: job, StepId: step}}})
}

// TestPrivilegedIMEXStepChannel: a GPU step's StepStart answer asks for its
// channel; until StepChannel its tasks open none; StepChannel from the
// step's slurmstepd takes the channel from that process's own namespace
// and lets the step open it and no other; a caller outside the step, an
// unregistered step, a step with no channel mount, and a CPU-only step get
// none; every denial is a record with the channel's device.
func TestPrivilegedIMEXStepChannel(t *testing.T) {
	tr := newTree(t)
	if m, _ := devfilter.Probe(); m != devfilter.ModeScope {
		t.Skipf("kernel has no bpf_get_current_ancestor_cgroup_id for device programs (probe says %s)", m)
	}
	const major = 227 // fake: no driver, so an allowed open gives ENXIO
	for c := uint32(0); c < 4; c++ {
		tr.mknod(fmt.Sprintf("imex%d", c), major, c)
	}
	chanDir := t.TempDir()
	cfg := config.Default()
	cfg.SlurmConf = filepath.Join(tr.gres, "slurm.conf")
	cfg.Scope, cfg.PinDir, cfg.FailOpenSpool = tr.scope, "", ""
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	cfg.IMEXChannels, cfg.IMEXChannelsMajor = config.IMEXSlurm, major
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	jobSource = func(config.Config) recovery.JobSource { return tr.ctld }
	d, err := New(cfg, log, NewKernelFilter(devfilter.Options{Mode: devfilter.ModeScope, NvidiaMajor: 195, IMEXMajor: major, Logger: log, AuditAllowed: devfilter.AuditAllowedNone}), 195, tr.rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	d.h.IMEX = imexchan.Reader{Dir: chanDir}

	task1 := tr.mkdir("job_1/step_0/user/task_0")
	stepd1, setup1 := tr.imexStepd(tr.mkdir("job_1/step_0/slurm"), chanDir, major, 2)
	task2 := tr.mkdir("job_2/step_0/user/task_0")
	stepd2 := tr.sleeper(tr.mkdir("job_2/step_0/slurm")) // Slurm made no channel
	task3 := tr.mkdir("job_3/step_0/user/task_0")
	stepd3, setup3 := tr.imexStepd(tr.mkdir("job_3/step_0/slurm"), chanDir, major, 3)
	for _, m := range []*pb.JobProlog{{JobId: 1, Uid: 1000, JobGpus: ptr("0")}, {JobId: 2, Uid: 1000, JobGpus: ptr("1")}, {JobId: 3, Uid: 1000}} {
		if r := call(d, 0, m); r.Error != "" {
			t.Fatalf("prolog %d: %s", m.JobId, r.Error)
		}
	}
	if r := call(d, stepd1, &pb.StepStart{JobId: 1, StepId: 0, Uid: 1000, StepGpus: ptr("0")}); r.Error != "" || !r.ImexPending {
		t.Fatalf("step 1.0: %+v, want imex_pending", r)
	}
	if r := call(d, stepd2, &pb.StepStart{JobId: 2, StepId: 0, Uid: 1000, StepGpus: ptr("1")}); r.Error != "" || !r.ImexPending {
		t.Fatalf("step 2.0: %+v, want imex_pending", r)
	}
	if r := call(d, stepd3, &pb.StepStart{JobId: 3, StepId: 0, Uid: 1000}); r.Error != "" || r.ImexPending {
		t.Fatalf("CPU-only step 3.0: %+v, want no imex_pending", r)
	}
	// The channel nodes are made in the steps' cgroups before the agent
	// knows them: mknod is allowed, opening is not yet.
	setup1()
	setup3()
	names := []string{"imex0", "imex1", "imex2", "imex3"}
	expect := func(what, dir string, allowed string) {
		t.Helper()
		got := tr.openNames(dir, names...)
		for _, n := range names {
			want := "EPERM"
			if n == allowed {
				want = "ENXIO"
			}
			if got[n] != want {
				t.Errorf("%s: %s = %s, want %s", what, n, got[n], want)
			}
		}
	}
	expect("job 1 before StepChannel", task1, "")

	// Refused: a caller outside the step (job 3's slurmstepd, whose own
	// namespace holds channel 3), and a step that is not registered.
	if r := callChannel(d, stepd3, 1, 0); r.Error == "" || !strings.Contains(r.Error, "not in the step's cgroup") {
		t.Errorf("StepChannel for 1.0 from job 3's slurmstepd: %+v", r)
	}
	if r := callChannel(d, stepd1, 1, 7); r.Error == "" || !strings.Contains(r.Error, "not registered") {
		t.Errorf("StepChannel for an unregistered step: %+v", r)
	}
	expect("job 1 after refused StepChannels", task1, "")

	r := callChannel(d, stepd1, 1, 0)
	if r.Error != "" || r.ImexChannel == nil || *r.ImexChannel != 2 {
		t.Fatalf("StepChannel 1.0: %+v, want channel 2", r)
	}
	expect("job 1", task1, "imex2")
	if r := callChannel(d, stepd2, 2, 0); r.Error != "" || r.ImexChannel != nil {
		t.Errorf("StepChannel 2.0 (no mount): %+v, want no channel", r)
	}
	expect("job 2 (Slurm made no channel)", task2, "")
	if r := callChannel(d, stepd3, 3, 0); r.Error != "" || r.ImexChannel != nil {
		t.Errorf("StepChannel 3.0 (CPU-only): %+v, want no channel", r)
	}
	expect("CPU-only job 3", task3, "")
	if s, ok := d.reg.Step(1, 0); !ok || len(s.IMEXChannels) != 1 || s.IMEXChannels[0] != 2 {
		t.Errorf("registry step 1.0 = %+v, want IMEX channel 2", s)
	}

	d.flush()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var n int
		for _, r := range tr.rec.Records(audit.EventGPUAccess) {
			if r.JobID == 1 && r.Decision == audit.DecisionDenied && r.Device != nil && r.Device.Major == major && r.Device.Minor == 3 {
				n++
				if r.Device.Kind != audit.DeviceIMEXChannel || r.Device.Path != "/dev/nvidia-caps-imex-channels/channel3" {
					t.Errorf("denied record of channel 3: device %+v, want kind %s, path /dev/nvidia-caps-imex-channels/channel3", r.Device, audit.DeviceIMEXChannel)
				}
			}
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no denied record of job 1 opening channel 3: %+v", tr.rec.Records(audit.EventGPUAccess))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
