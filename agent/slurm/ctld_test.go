// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
			"gres_detail":["gpu:1(IDX:0)","gpu:a100:2(IDX:1,3),mps:100(0/100)","gpu:0(IDX:N/A)"]}],"errors":[]}`),
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
			j, err := ParseJobJSON(tt.out, tt.id, tt.node)
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
