// SPDX-License-Identifier: Apache-2.0

package statefile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "state.json")
	if f, exists, err := Read(p); f != nil || exists || err != nil {
		t.Fatalf("missing file: %v %v %v", f, exists, err)
	}
	in := File{Scope: "/s", Jobs: []Job{{ID: 7, UID: 1001, GPUs: []int{0, 2}, Created: time.Unix(100, 0).UTC(),
		Steps: []Step{{ID: 0, UID: 1001, CgroupID: 42, Cgroup: "/s/job_7/step_0", GPUs: []int{2}}}}}}
	if err := Write(p, in); err != nil {
		t.Fatal(err)
	}
	out, exists, err := Read(p)
	if err != nil || !exists || out.Version != Version || out.Jobs[0].Steps[0].CgroupID != 42 || !out.Jobs[0].Created.Equal(in.Jobs[0].Created) {
		t.Fatalf("got %+v %v %v", out, exists, err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(p), ".state-*")); len(left) != 0 {
		t.Errorf("temp files left: %v", left)
	}
	os.WriteFile(p, []byte(`{"version":9,"jobs":[]}`), 0o600)
	if _, _, err := Read(p); err == nil || !strings.Contains(err.Error(), "version 9") {
		t.Errorf("unknown version: %v", err)
	}
	os.WriteFile(p, []byte(`{`), 0o600)
	if _, exists, err := Read(p); err == nil || !exists {
		t.Errorf("torn file: %v %v", exists, err)
	}
}
