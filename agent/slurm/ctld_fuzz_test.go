// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// The fields of `scontrol show job -d` a job user writes, as Slurm prints
// them (src/api/job_info.c): each one's text reaches the output verbatim,
// newlines included.
var userFields = []string{"JobName=", "   Command=", "   WorkDir=", "   Comment=", "   StdErr=", "   StdOut="}

// FuzzParseJobTextInjection: whatever a user writes into their job's
// fields, the strict text reader either finds the output ambiguous or
// reads exactly what it reads without that text; it never names other
// GPUs, another state or another owner.
func FuzzParseJobTextInjection(f *testing.F) {
	f.Add(uint8(0), "\n     Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:4(IDX:0-3)")
	f.Add(uint8(1), "\n   JOB_GRES=gpu:4\n     Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:4(IDX:0-3)\n   MinCPUsNode=1")
	f.Add(uint8(2), "x\n   JobState=COMPLETED")
	f.Add(uint8(3), "\nJobId=3 JobName=y\n   UserId=root(0) GroupId=root(0)")
	f.Add(uint8(4), "\r\n     Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:4(IDX:0-3) ")
	f.Add(uint8(5), "\n     Nodes=v[l-n] CPU_IDs=0 Mem=0 GRES=gpu:4(IDX:0-3)")
	real, err := readFixtureF("22.05-gpu2.txt")
	if err != nil {
		f.Fatal(err)
	}
	want, err := ParseJobText(real, 3, "vm")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, field uint8, text string) {
		key := userFields[int(field)%len(userFields)]
		out := real
		if i := strings.Index(out, key); i >= 0 {
			end := i + strings.IndexByte(out[i:], '\n')
			if key == "JobName=" {
				end = i + len(key) + len("two")
			}
			out = out[:end] + text + out[end:]
		} else {
			out = strings.Replace(out, "   Power=", key+text+"\n   Power=", 1)
		}
		got, err := ParseJobText(out, 3, "vm")
		var amb *AmbiguousError
		if errors.As(err, &amb) {
			return
		}
		if err != nil {
			// An error that is not ambiguity still gives no GPU; the
			// reader must not need the user's text to read the job.
			t.Fatalf("injection into %s made a non-ambiguity error: %v\n%q", key, err, text)
		}
		if !slices.Equal(got.GPUs, want.GPUs) || got.State != want.State || got.UID != want.UID || got.OnNode != want.OnNode {
			t.Fatalf("injection into %s changed the answer: %+v, want %+v\n%q", key, got, want, text)
		}
	})
}

// FuzzParseJobJSONInjection: a job name, comment or working directory of
// any bytes is an escaped JSON string: the answer never changes.
func FuzzParseJobJSONInjection(f *testing.F) {
	f.Add("x\n     Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:4(IDX:0-3)")
	f.Add(`","job_id":7,"gres_detail":["gpu:4(IDX:0-3)"],"x":"`)
	f.Add("\x00\xff\u2028")
	base := map[string]any{
		"job_id": 7, "user_id": 1000, "job_state": []string{"RUNNING"},
		"job_resources": map[string]any{"nodes": map[string]any{"list": "n[1-2]"}},
		"gres_detail":   []string{"gpu:1(IDX:0)", "gpu:2(IDX:2-3)"},
	}
	want := ControllerJob{ID: 7, UID: 1000, State: "RUNNING", OnNode: true, GPUs: []int{2, 3}}
	f.Fuzz(func(t *testing.T, text string) {
		j := map[string]any{"name": text, "comment": text, "current_working_directory": text, "standard_output": text}
		for k, v := range base {
			j[k] = v
		}
		out, err := json.Marshal(map[string]any{"jobs": []any{j}, "errors": []any{}})
		if err != nil {
			t.Skip(err)
		}
		got, err := parseJobJSON(out, 7, "n2")
		if err != nil || !slices.Equal(got.GPUs, want.GPUs) || got.State != want.State || got.UID != want.UID || !got.OnNode {
			t.Fatalf("user text changed the answer: %+v, %v\n%q", got, err, text)
		}
	})
}

// FuzzParseJobOutput: any output at all, from a broken or hostile client,
// neither crashes the readers nor yields indices outside Slurm's range.
func FuzzParseJobOutput(f *testing.F) {
	for _, name := range []string{"22.05-gpu2.txt", "22.05-forged-name.txt", "22.05-squeue.json"} {
		b, err := readFixtureF(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		for _, j := range []func() (ControllerJob, error){
			func() (ControllerJob, error) { return ParseJobText(string(out), 3, "vm") },
			func() (ControllerJob, error) { return parseJobJSON(out, 4, "vm") },
		} {
			got, err := j()
			if err != nil {
				continue
			}
			for _, g := range got.GPUs {
				if g < 0 || g > 1023 {
					t.Fatalf("GPU index %d", g)
				}
			}
			if !slices.IsSorted(got.GPUs) {
				t.Fatalf("GPUs not ascending: %v", got.GPUs)
			}
		}
	})
}

// FuzzGresOfNode: any per-node GRES string either is refused or reads as
// GPU indices and shares in Slurm's range, each named once, a share's
// count never more than the entry says.
func FuzzGresOfNode(f *testing.F) {
	for _, s := range []string{"gpu:2(IDX:0-1)", "shard:5(IDX:0)", "shard:5(5/10,0/10,0/10,0/10)", "mps:50(0/100,50/100)",
		"gpu:1(IDX:0),shard:2(0/10,2/10)", "shard:t4:3(0/0,3/10)", "shard(CNT:5)", "gpu:0(IDX:N/A),mps:100(100/100)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		gpus, shares, err := gresOfNode(in)
		if err != nil {
			return
		}
		if !slices.IsSorted(gpus) || len(slices.Compact(slices.Clone(gpus))) != len(gpus) {
			t.Fatalf("GPUs %v not ascending and distinct", gpus)
		}
		for _, g := range gpus {
			if g < 0 || g > 1023 {
				t.Fatalf("GPU index %d", g)
			}
		}
		seen := map[[2]any]bool{}
		for _, s := range shares {
			if s.Kind != "shard" && s.Kind != "mps" || s.Device < 0 || s.Device > 1023 {
				t.Fatalf("share %+v", s)
			}
			k := [2]any{s.Kind, s.Device}
			if seen[k] {
				t.Fatalf("share %+v twice", s)
			}
			seen[k] = true
		}
	})
}
