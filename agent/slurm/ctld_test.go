// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "ctld", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readFixtureF(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("testdata", "ctld", name))
	return string(b), err
}

// The fixtures were printed by Slurm 22.05.8's scontrol and squeue on a real
// cluster (node vm). The forged ones come from jobs whose name, comment and
// working directory hold newlines and fake per-node lines naming all four
// GPUs; the real allocation was one GPU.
func TestParseJobText(t *testing.T) {
	tests := []struct {
		file    string
		id      uint32
		node    string
		want    []int
		state   string
		onNode  bool
		wantAmb bool
	}{
		{file: "22.05-gpu2.txt", id: 3, node: "vm", want: []int{0, 1}, state: "RUNNING", onNode: true},
		{file: "22.05-cpu.txt", id: 2, node: "vm", want: []int{}, state: "RUNNING", onNode: true},
		{file: "22.05-gpu2.txt", id: 3, node: "other", want: []int{}, state: "RUNNING"},
		// JobName injects a whole fake block before the real one.
		{file: "22.05-forged-name.txt", id: 4, node: "vm", wantAmb: true},
		// Comment and WorkDir inject node lines after the real block.
		{file: "22.05-forged-comment.txt", id: 5, node: "vm", wantAmb: true},
		// Asked for another job than the output is about.
		{file: "22.05-gpu2.txt", id: 4, node: "vm", wantAmb: true},
	}
	for _, tt := range tests {
		t.Run(tt.file+"/"+tt.node, func(t *testing.T) {
			j, err := ParseJobText(string(readFixture(t, tt.file)), tt.id, tt.node)
			var amb *AmbiguousError
			if tt.wantAmb {
				if !errors.As(err, &amb) {
					t.Fatalf("got %+v, %v; want an AmbiguousError", j, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(j.GPUs, tt.want) || j.State != tt.state || j.OnNode != tt.onNode || j.UID != 2951 {
				t.Errorf("got %+v, want GPUs %v state %s on node %v uid 2951", j, tt.want, tt.state, tt.onNode)
			}
		})
	}
}

// Every way a user's text can add lines: each one makes the output
// ambiguous, never a wider list.
func TestParseJobTextForgeries(t *testing.T) {
	real := string(readFixture(t, "22.05-gpu2.txt"))
	const fake = "     Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:4(IDX:0-3)"
	inject := func(after, text string) string {
		return strings.Replace(real, after, after+text, 1)
	}
	cases := map[string]string{
		"node line in the name":          inject("JobName=two", "\n"+fake),
		"whole block in the name":        inject("JobName=two", "\n   JOB_GRES=gpu:4\n"+fake+"\n   MinCPUsNode=1"),
		"node line in the comment":       inject("   Command=(null)", "\n   Comment=x\n"+fake),
		"node line in the block":         strings.Replace(real, "   MinCPUsNode=", fake+"\n   MinCPUsNode=", 1),
		"second record":                  real + "\n" + real,
		"fake state":                     inject("JobName=two", "\n   JobState=COMPLETED"),
		"fake owner":                     inject("JobName=two", "\n   UserId=root(0) GroupId=root(0)"),
		"node range naming vm":           inject("JobName=two", "\n     Nodes=v[l-n],vm CPU_IDs=0 Mem=0 GRES=gpu:4(IDX:0-3)"),
		"not a node line inside a block": strings.Replace(real, "   MinCPUsNode=", "   Nodes=x\n   MinCPUsNode=", 1),
	}
	for name, out := range cases {
		t.Run(name, func(t *testing.T) {
			j, err := ParseJobText(out, 3, "vm")
			var amb *AmbiguousError
			if !errors.As(err, &amb) {
				t.Fatalf("got %+v, %v; want an AmbiguousError", j, err)
			}
		})
	}
}

func TestParseJobJSON(t *testing.T) {
	squeue := readFixture(t, "22.05-squeue.json")
	tests := []struct {
		name    string
		out     []byte
		id      uint32
		node    string
		want    []int
		state   string
		onNode  bool
		running bool
		wantErr error
		wantAmb bool
	}{
		// The forged name and comment are escaped JSON strings.
		{name: "22.05 forged name", out: squeue, id: 4, node: "vm", want: []int{0}, state: "RUNNING", onNode: true, running: true},
		{name: "22.05 forged comment", out: squeue, id: 5, node: "vm", want: []int{1}, state: "RUNNING", onNode: true, running: true},
		{name: "22.05 completed", out: squeue, id: 1, node: "vm", want: []int{}, state: "COMPLETED", onNode: true},
		{name: "22.05 other node", out: squeue, id: 4, node: "vm2", want: []int{}, state: "RUNNING"},
		{name: "22.05 purged", out: squeue, id: 999, node: "vm", wantErr: ErrJobUnknown},
		{name: "24.05+ layout", out: []byte(`{"jobs":[{"job_id":7,"user_id":1000,"job_state":["RUNNING"],"name":"x\n     Nodes=n2 CPU_IDs=0 Mem=0 GRES=gpu:4(IDX:0-3)",
			"job_resources":{"select_type":["CR_CPU"],"nodes":{"count":3,"list":"n[1-3]","whole":false,"allocation":[]}},
			"gres_detail":["gpu:1(IDX:0)","gpu:a100:2(IDX:1,3),mps:100(100/100)","gpu:0(IDX:N/A)"]}],"errors":[]}`),
			id: 7, node: "n2", want: []int{1, 3}, state: "RUNNING", onNode: true, running: true},
		{name: "two GPU types on one node", out: []byte(`{"jobs":[{"job_id":7,"user_id":1000,"job_state":"RUNNING",
			"job_resources":{"nodes":"n1"},"gres_detail":["gpu:h100:1(IDX:3),gpu:a100:2(IDX:0-1)"]}]}`),
			id: 7, node: "n1", want: []int{0, 1, 3}, state: "RUNNING", onNode: true, running: true},
		{name: "completing flag", out: []byte(`{"jobs":[{"job_id":7,"user_id":1000,"job_state":["COMPLETED","COMPLETING"],
			"job_resources":{"nodes":"n1"},"gres_detail":["gpu:1(IDX:0)"]}]}`),
			id: 7, node: "n1", want: []int{0}, state: "COMPLETING", onNode: true, running: true},
		{name: "requeued", out: []byte(`{"jobs":[{"job_id":7,"user_id":1000,"job_state":["PENDING","REQUEUED"],"job_resources":null,"gres_detail":[]}]}`),
			id: 7, node: "n1", want: []int{}, state: "PENDING"},
		{name: "unknown job error", out: []byte(`{"jobs":[],"errors":[{"error":"Invalid job id specified","error_number":2017}]}`),
			id: 7, node: "n1", wantErr: ErrJobUnknown},
		{name: "fewer gres entries than nodes", out: []byte(`{"jobs":[{"job_id":7,"user_id":1000,"job_state":"RUNNING","job_resources":{"nodes":"n[1-2]"},"gres_detail":["gpu:1(IDX:0)"]}]}`),
			id: 7, node: "n1", wantAmb: true},
		{name: "two records of one job", out: []byte(`{"jobs":[{"job_id":7,"user_id":1000,"job_state":"RUNNING","job_resources":{"nodes":"n1"},"gres_detail":["gpu:1(IDX:0)"]},
			{"job_id":7,"user_id":1000,"job_state":"RUNNING","job_resources":{"nodes":"n1"},"gres_detail":["gpu:4(IDX:0-3)"]}]}`),
			id: 7, node: "n1", wantAmb: true},
		{name: "gpu without indices", out: []byte(`{"jobs":[{"job_id":7,"user_id":1000,"job_state":"RUNNING","job_resources":{"nodes":"n1"},"gres_detail":["gpu:2"]}]}`),
			id: 7, node: "n1", wantErr: errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := parseJobJSON(tt.out, tt.id, tt.node)
			var amb *AmbiguousError
			switch {
			case tt.wantAmb:
				if !errors.As(err, &amb) {
					t.Fatalf("got %+v, %v; want an AmbiguousError", j, err)
				}
				return
			case tt.wantErr == errAny:
				if err == nil {
					t.Fatalf("got %+v, want an error", j)
				}
				return
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("got %+v, %v; want %v", j, err, tt.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if !slices.Equal(j.GPUs, tt.want) || j.State != tt.state || j.OnNode != tt.onNode || j.Running() != tt.running {
				t.Errorf("got %+v (running %v), want GPUs %v state %s on node %v running %v", j, j.Running(), tt.want, tt.state, tt.onNode, tt.running)
			}
		})
	}
}

var errAny = errors.New("any error")

// Controller falls back from scontrol --json (23.02+) to squeue --json
// (22.05) and remembers it; the fakes print what those releases print.
func TestControllerFallback(t *testing.T) {
	dir := t.TempDir()
	squeue := filepath.Join(dir, "squeue.json")
	if err := os.WriteFile(squeue, readFixture(t, "22.05-squeue.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	calls := filepath.Join(dir, "calls")
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\necho \"$0 $*\" >> "+calls+"\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("scontrol", `case "$1" in --json) echo "scontrol: unrecognized option '--json'" >&2; exit 1;; esac
echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1`)
	write("squeue", "cat "+squeue)
	c := &Controller{Node: "vm", BinDir: dir}
	for range 2 {
		j, err := c.Job(context.Background(), 4)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(j.GPUs, []int{0}) || j.Source != "squeue --json" {
			t.Errorf("got %+v", j)
		}
	}
	b, _ := os.ReadFile(calls)
	if n := strings.Count(string(b), "scontrol --json"); n != 1 {
		t.Errorf("scontrol --json tried %d times, want once (then remembered):\n%s", n, b)
	}
	// No JSON at all: the text form, strictly.
	write("squeue", `echo "squeue: error: JSON plugin load failure" >&2; exit 1`)
	c = &Controller{Node: "vm", BinDir: dir}
	if _, err := c.Job(context.Background(), 4); !errors.Is(err, ErrJobUnknown) {
		t.Errorf("text form of an unknown job: %v, want ErrJobUnknown", err)
	}
}

// fakeClients writes scontrol and squeue scripts into a directory for a
// Controller's BinDir; each call is logged to calls as "name args".
type fakeClients struct {
	t     *testing.T
	dir   string
	calls string
}

func newFakeClients(t *testing.T) *fakeClients {
	dir := t.TempDir()
	return &fakeClients{t: t, dir: dir, calls: filepath.Join(dir, "calls")}
}

func (f *fakeClients) write(name, body string) {
	f.t.Helper()
	script := "#!/bin/sh\necho \"" + name + " $*\" >> " + f.calls + "\n" + body + "\n"
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(script), 0o755); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeClients) count(prefix string) int {
	b, _ := os.ReadFile(f.calls)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

func (f *fakeClients) controller() *Controller { return &Controller{Node: "n1", BinDir: f.dir} }

// jobJSON is one job as scontrol --json show job prints it (24.05+ layout).
func jobJSON(id, gpu int) string {
	return fmt.Sprintf(`{"jobs":[{"job_id":%d,"user_id":1000,"job_state":["RUNNING"],"job_resources":{"nodes":{"list":"n1"}},"gres_detail":["gpu:1(IDX:%d)"]}],"errors":[]}`, id, gpu)
}

// What slurmctld's clients print when it is slow, too large, malformed or
// down: only a connect failure is unreachable; everything else is
// ambiguous (the job gets no GPU, whatever adopt_unconfirmed says), and
// the agent never waits past its deadline or reads past its cap.
func TestControllerBoundedAnswers(t *testing.T) {
	const budget = 500 * time.Millisecond
	tests := []struct {
		name     string
		scontrol string
		squeue   string // "": must not be asked
		want     string // "unreachable", "ambiguous", "unknown" or "ok"
		reason   string // in the error
	}{
		{name: "slow, nothing printed", scontrol: "exec sleep 10", want: "ambiguous", reason: "no complete answer"},
		{name: "slow after part of the answer", scontrol: `printf '{"jobs":[{"job_id":7,'; exec sleep 10`, want: "ambiguous", reason: "no complete answer"},
		{name: "endless answer", scontrol: `exec yes '{"name":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"},'`, want: "ambiguous", reason: "printed more than"},
		{name: "oversize answer", scontrol: fmt.Sprintf(`head -c %d /dev/zero | tr '\0' ' '; echo '%s'`, maxJobOutput+1, jobJSON(7, 0)), want: "ambiguous", reason: "printed more than"},
		{name: "malformed JSON", scontrol: `echo '{"jobs":[{"job_id":7,"user_id":1000,'`, want: "ambiguous", reason: "does not parse"},
		{name: "no user_id", scontrol: `echo '{"jobs":[{"job_id":7,"job_state":"RUNNING"}]}'`, want: "ambiguous", reason: "user_id"},
		{name: "connect failure", scontrol: "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1", want: "unreachable"},
		{name: "connect failure as JSON", scontrol: `echo '{"jobs":[],"errors":[{"error":"Unable to contact slurm controller (connect failure)","error_number":1001}]}'; exit 1`, want: "unreachable"},
		{name: "socket timeout: slurmctld answered slowly", scontrol: "echo 'slurm_load_jobs error: Socket timed out on send/recv operation' >&2; exit 1", want: "ambiguous", reason: "Socket timed out"},
		{name: "send failure after connecting", scontrol: "echo 'slurm_load_jobs error: Unable to contact slurm controller (send failure)' >&2; exit 1", want: "ambiguous", reason: "send failure"},
		// A user's job name cannot make an answer read as a connect failure.
		{name: "connect failure text in a job name", scontrol: `echo '{"jobs":[{"job_id":7,"name":"Unable to contact slurm controller (connect failure)","user_id":1000,"job_state":["RUNNING"],"job_resources":{"nodes":{"list":"n1"}},"gres_detail":["gpu:1(IDX:3)"]}],"errors":[]}'; echo 'Unable to contact slurm controller (connect failure)' >&2`, want: "ok"},
		// 25.11 prints this for an unknown job and when it cannot connect:
		// the node's listing says which.
		{name: "empty answer, slurmctld down", scontrol: `echo '{"jobs":[],"errors":[]}'`, squeue: "echo 'slurm_load_node error: Unable to contact slurm controller (connect failure)' >&2; exit 1", want: "unreachable"},
		{name: "empty answer, job unknown", scontrol: `echo '{"jobs":[],"errors":[]}'`, squeue: `echo '{"jobs":[],"errors":[]}'`, want: "unknown"},
		{name: "unknown job", scontrol: "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1", want: "unknown"},
		{name: "answer", scontrol: "echo '" + jobJSON(7, 3) + "'", want: "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeClients(t)
			f.write("scontrol", tt.scontrol)
			if tt.squeue == "" {
				tt.squeue = "echo 'squeue must not be asked' >&2; exit 1"
			}
			f.write("squeue", tt.squeue)
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			t0 := time.Now()
			j, err := f.controller().Job(ctx, 7)
			took := time.Since(t0)
			if took > budget+time.Second {
				t.Errorf("took %v with a %v budget", took, budget)
			}
			var amb *AmbiguousError
			var unreach *UnreachableError
			got := "ok"
			switch {
			case errors.As(err, &unreach):
				got = "unreachable"
			case errors.As(err, &amb):
				got = "ambiguous"
			case errors.Is(err, ErrJobUnknown):
				got = "unknown"
			case err != nil:
				got = "other: " + err.Error()
			}
			if got != tt.want {
				t.Fatalf("got %s (%+v, %v), want %s", got, j, err, tt.want)
			}
			if tt.reason != "" && !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q does not say %q", err, tt.reason)
			}
			if got == "ok" && !slices.Equal(j.GPUs, []int{3}) {
				t.Errorf("got %+v", j)
			}
			if n := f.count("squeue"); n != 0 && strings.Contains(tt.squeue, "must not") {
				t.Errorf("squeue asked %d times: a per-job answer was there", n)
			}
		})
	}
}

// Each question names its job: scontrol --json show job <id>, nothing
// about the other jobs of the cluster.
func TestControllerAsksPerJob(t *testing.T) {
	f := newFakeClients(t)
	f.write("scontrol", `id=$4; echo "{\"jobs\":[{\"job_id\":$id,\"user_id\":1000,\"job_state\":\"RUNNING\",\"job_resources\":{\"nodes\":\"n1\"},\"gres_detail\":[\"gpu:1(IDX:$((id % 4)))\"]}]}"`)
	c := f.controller()
	for _, id := range []uint32{5, 6, 7} {
		j, err := c.Job(context.Background(), id)
		if err != nil || !slices.Equal(j.GPUs, []int{int(id % 4)}) {
			t.Fatalf("job %d: %+v, %v", id, j, err)
		}
		if n := f.count(fmt.Sprintf("scontrol --json show job %d", id)); n != 1 {
			t.Errorf("job %d asked %d times", id, n)
		}
	}
	if n := f.count(""); n != 3 {
		t.Errorf("%d client calls for 3 jobs", n)
	}
}

// 22.05 (no scontrol --json): questions asked at once share one squeue
// --json -w <node>; an answer too large or too slow for its share of the
// time passes to the per-job text form, and squeue is skipped for a while.
func TestControllerSqueueShared(t *testing.T) {
	squeue := readFixture(t, "22.05-squeue.json")
	noJSON := `case "$1" in --json) echo "scontrol: unrecognized option '--json'" >&2; exit 1;; esac`
	t.Run("shared", func(t *testing.T) {
		f := newFakeClients(t)
		file := filepath.Join(f.dir, "squeue.json")
		if err := os.WriteFile(file, squeue, 0o644); err != nil {
			t.Fatal(err)
		}
		f.write("scontrol", noJSON+"\necho 'text form must not be needed' >&2; exit 1")
		// Slow enough that the questions overlap.
		f.write("squeue", "sleep 0.3; cat "+file)
		c := &Controller{Node: "vm", BinDir: f.dir}
		if _, err := c.Job(context.Background(), 4); err != nil { // learns that scontrol has no --json
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				j, err := c.Job(ctx, 4+uint32(i%2))
				if err == nil && len(j.GPUs) != 1 {
					err = fmt.Errorf("GPUs %v", j.GPUs)
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		// One for the first question, at most a few for the eight at once
		// (a question may come as one listing ends).
		if n := f.count("squeue --json -w vm"); n < 2 || n > 4 {
			t.Errorf("squeue --json -w vm ran %d times for 9 questions", n)
		}
	})
	t.Run("slurmctld down", func(t *testing.T) {
		// What 22.05's squeue --json prints then (exit 0); its scontrol
		// says why.
		f := newFakeClients(t)
		f.write("scontrol", noJSON+"\necho 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1")
		f.write("squeue", `echo '{"errors":[{"description":"Failed while looking for jobs","error_number":-1,"error":"Unspecified error","source":"slurm_load_jobs"}],"jobs":[]}'`)
		c := &Controller{Node: "vm", BinDir: f.dir}
		var unreach *UnreachableError
		if _, err := c.Job(context.Background(), 3); !errors.As(err, &unreach) {
			t.Errorf("got %v, want an UnreachableError", err)
		}
	})
	for _, tc := range []struct{ name, squeue string }{
		{"too large", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' ' '", maxSqueueOutput+1)},
		{"too slow", "exec sleep 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeClients(t)
			text := filepath.Join(f.dir, "job.txt")
			if err := os.WriteFile(text, readFixture(t, "22.05-gpu2.txt"), 0o644); err != nil {
				t.Fatal(err)
			}
			f.write("scontrol", noJSON+"\ncat "+text)
			f.write("squeue", tc.squeue)
			c := &Controller{Node: "vm", BinDir: f.dir}
			for range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				t0 := time.Now()
				j, err := c.Job(ctx, 3)
				cancel()
				if err != nil || !slices.Equal(j.GPUs, []int{0, 1}) || j.Source != "scontrol show job -d" {
					t.Fatalf("got %+v, %v; want GPUs [0 1] from the text form", j, err)
				}
				if took := time.Since(t0); took > 2*time.Second {
					t.Errorf("took %v", took)
				}
			}
			if n := f.count("squeue"); n != 1 {
				t.Errorf("squeue ran %d times; want once, then skipped", n)
			}
		})
	}
}

// TestGresOfNode holds the per-node GRES reader to every form Slurm prints
// (gres_ctld.c, gres_stepmgr.c: *_job_build_details): 22.05's indices for
// gpu and the shared GRES alike, 23.02 on allocated/available per device
// for shard and mps (recorded on 22.05.8 and 25.11.7 by TestPrivilegedSharedGPUs).
func TestGresOfNode(t *testing.T) {
	for _, tt := range []struct {
		in     string
		gpus   []int
		shares []Share
		err    string
	}{
		{in: "gpu:2(IDX:0-1)", gpus: []int{0, 1}},
		{in: "gpu:a100:1(IDX:3),mps:100(0/100,0/100,0/100,100/100)", gpus: []int{3}, shares: []Share{{"mps", 3, 100}}},
		{in: "shard:5(IDX:0)", gpus: []int{}, shares: []Share{{"shard", 0, 5}}},
		{in: "shard:4(IDX:1-2)", gpus: []int{}, shares: []Share{{"shard", 1, 0}, {"shard", 2, 0}}},
		{in: "mps:50(IDX:2)", gpus: []int{}, shares: []Share{{"mps", 2, 50}}},
		{in: "shard:5(5/10,0/10,0/10,0/10)", gpus: []int{}, shares: []Share{{"shard", 0, 5}}},
		{in: "shard:12(0/10,0/10,10/10,2/10)", gpus: []int{}, shares: []Share{{"shard", 2, 10}, {"shard", 3, 2}}},
		{in: "shard:t4:3(0/0,3/10)", gpus: []int{}, shares: []Share{{"shard", 1, 3}}},
		{in: "mps:50(0/100,50/100,0/100,0/100)", gpus: []int{}, shares: []Share{{"mps", 1, 50}}},
		{in: "gpu:1(IDX:0),shard:2(0/10,2/10)", gpus: []int{0}, shares: []Share{{"shard", 1, 2}}},
		{in: "gpu:0(IDX:N/A),shard:1(0/10,1/10)", gpus: []int{}, shares: []Share{{"shard", 1, 1}}},
		{in: "shard:0(IDX:N/A)", gpus: []int{}},
		{in: "nic:1(IDX:0),gpu:1(IDX:2)", gpus: []int{2}},
		// Shares Slurm cannot place are refused, naming the entry.
		{in: "shard(CNT:5)", err: `GRES "shard(CNT:5)" names no device indices`},
		{in: "mps:50", err: `GRES "mps:50" names no devices`},
		{in: "shard:5(5/10", err: "unterminated"},
		{in: "shard:5(3/10,3/10)", err: "add up to 6, the entry says 5"},
		{in: "shard:11(11/10)", err: "11 allocated of 10"},
		{in: "shard:2(2/10,x/10)", err: `"x/10" is not allocated/available`},
		{in: "shard:2(2,0)", err: `"2" is not allocated/available`},
		{in: "shard:x(IDX:0)", err: `count "x"`},
		{in: "shard:1(IDX:0),shard:1(1/10)", err: "shard device 0 twice"},
		{in: "gpu:1(IDX:0),gpu:1(IDX:0)", err: "GPU index twice"},
	} {
		gpus, shares, err := gresOfNode(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: %v %v, %v; want an error with %q", tt.in, gpus, shares, err, tt.err)
			}
			continue
		}
		if err != nil || !slices.Equal(gpus, tt.gpus) || !slices.Equal(shares, tt.shares) {
			t.Errorf("%q: %v %v, %v; want %v %v", tt.in, gpus, shares, err, tt.gpus, tt.shares)
		}
	}
}

// TestParseJobShares: a shard job's record names no GPU, only its share;
// the reader returns the share (the GPU table places it), never nothing.
func TestParseJobShares(t *testing.T) {
	for _, tt := range []struct {
		name, out string
		want      []Share
	}{
		{"22.05 squeue", `{"jobs":[{"job_id":9,"user_id":1000,"job_state":"RUNNING","job_resources":{"nodes":"n1"},"gres_detail":["shard:5(IDX:2)"]}]}`, []Share{{"shard", 2, 5}}},
		{"25.11 scontrol", `{"jobs":[{"job_id":9,"user_id":1000,"job_state":["RUNNING"],"job_resources":{"nodes":{"list":"n1"}},"gres_detail":["mps:50(0/100,50/100,0/100,0/100)"]}],"errors":[]}`, []Share{{"mps", 1, 50}}},
	} {
		j, err := parseJobJSON([]byte(tt.out), 9, "n1")
		if err != nil || len(j.GPUs) != 0 || !slices.Equal(j.Shares, tt.want) || !j.Running() {
			t.Errorf("%s: %+v, %v; want shares %v", tt.name, j, err, tt.want)
		}
	}
	text := "JobId=9 JobName=x\n   UserId=u(1000) GroupId=u(1000)\n   JobState=RUNNING Reason=None\n   JOB_GRES=shard:5\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=shard:5(IDX:3)\n   MinCPUsNode=1\n"
	j, err := ParseJobText(text, 9, "n1")
	if err != nil || !slices.Equal(j.Shares, []Share{{"shard", 3, 5}}) {
		t.Errorf("text: %+v, %v", j, err)
	}
}

// parseJobJSON reads job id on node from `scontrol --json show job` or
// `squeue --json` output. gres_detail holds one entry per node of the job's
// allocation (job_resources), in that order.
func parseJobJSON(out []byte, id uint32, node string) (ControllerJob, error) {
	doc, err := parseJobsDoc(out)
	if err != nil {
		return ControllerJob{}, err
	}
	return doc.job(id, node)
}
