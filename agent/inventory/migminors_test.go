// SPDX-License-Identifier: Apache-2.0

package inventory

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// driverMIGMinors is the head of a real table: the driver prints config and
// monitor, then 15 GPU instances with 8 compute instances each per GPU
// minor (nv-caps.c), numbering minors in that order.
const driverMIGMinors = `config 1
monitor 2
gpu0/gi0/access 3
gpu0/gi0/ci0/access 4
gpu0/gi0/ci1/access 5
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu1/gi2/access 156
gpu1/gi2/ci0/access 157
gpu31/gi14/ci7/access 4322
`

func TestParseMIGMinors(t *testing.T) {
	m, err := ParseMIGMinors(strings.NewReader(driverMIGMinors), "mig-minors")
	if err != nil {
		t.Fatal(err)
	}
	if m.Config != 1 || m.Monitor != 2 {
		t.Errorf("config %d monitor %d, want 1 2", m.Config, m.Monitor)
	}
	gi := map[GIKey]uint32{{0, 0}: 3, {0, 1}: 12, {1, 2}: 156}
	ci := map[CIKey]uint32{{0, 0, 0}: 4, {0, 0, 1}: 5, {0, 1, 0}: 13, {1, 2, 0}: 157, {31, 14, 7}: 4322}
	if len(m.GI) != len(gi) || len(m.CI) != len(ci) {
		t.Fatalf("GI %v CI %v", m.GI, m.CI)
	}
	for k, v := range gi {
		if m.GI[k] != v {
			t.Errorf("GI %+v = %d, want %d", k, m.GI[k], v)
		}
	}
	for k, v := range ci {
		if m.CI[k] != v {
			t.Errorf("CI %+v = %d, want %d", k, m.CI[k], v)
		}
	}
}

func TestParseMIGMinorsRejects(t *testing.T) {
	head := "config 1\nmonitor 2\n"
	for _, tc := range []struct {
		name, text, want string
	}{
		{"one field", head + "gpu0/gi1/access\n", "mig-minors:3: want"},
		{"three fields", head + "gpu0/gi1/access 12 13\n", "mig-minors:3: want"},
		{"minor not a number", head + "gpu0/gi1/access twelve\n", `minor "twelve"`},
		{"negative minor", head + "gpu0/gi1/access -12\n", `minor "-12"`},
		{"minor too big", head + "gpu0/gi1/access 99999999999\n", `minor "99999999999"`},
		{"unknown capability", head + "fabric-mgmt 0\n", `"fabric-mgmt" is not config`},
		{"no access suffix", head + "gpu0/gi1/read 12\n", "is not config"},
		{"gpu without number", head + "gpuX/gi1/access 12\n", `"gpuX" has no number`},
		{"gi misspelled", head + "gpu0/g1/access 12\n", `does not start with "gi"`},
		{"ci misspelled", head + "gpu0/gi1/c0/access 12\n", `does not start with "ci"`},
		{"too deep", head + "gpu0/gi1/ci0/x/access 12\n", "is not config"},
		{"duplicate", head + "gpu0/gi1/access 12\ngpu0/gi1/access 13\n", "listed again (first on line 3)"},
		{"no config", "monitor 2\ngpu0/gi1/access 12\n", "no config or monitor line"},
		{"empty", "", "no config or monitor line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseMIGMinors(strings.NewReader(tc.text), "mig-minors")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestReadMIGMinorsNamesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mig-minors")
	if _, err := ReadMIGMinors(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("missing file: %v", err)
	}
	os.WriteFile(path, []byte("config 1\nmonitor 2\ngpu0/gi1/access x\n"), 0o644)
	if _, err := ReadMIGMinors(path); err == nil || !strings.Contains(err.Error(), path+":3:") {
		t.Errorf("bad line: %v", err)
	}
}

func TestMIGProfile(t *testing.T) {
	for name, want := range map[string]string{
		"NVIDIA H100 80GB HBM3 MIG 1g.10gb":    "1g.10gb",
		"NVIDIA H100 80GB HBM3 MIG 1g.10gb+me": "1g.10gb+me",
		"NVIDIA A100-SXM4-40GB MIG 1c.2g.10gb": "1c.2g.10gb",
		"MIG 3g.40gb":                          "MIG 3g.40gb",
		"some other name":                      "some other name",
	} {
		if got := migProfile(name); got != want {
			t.Errorf("migProfile(%q) = %q, want %q", name, got, want)
		}
	}
}

// A MIG slice's caps (gres.conf's File=/dev/nvidia-caps/nvidia-capN: its
// GPU instance's access and its compute instance's) name its GPU instance.
func TestInstanceOf(t *testing.T) {
	m, err := ParseMIGMinors(strings.NewReader(driverMIGMinors), "mig-minors")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		minor  uint32
		caps   []uint32
		gi     uint32
		wantOK bool
	}{
		{0, []uint32{12, 13}, 1, true},
		{0, []uint32{3, 4}, 0, true},
		{1, []uint32{156, 157}, 2, true},
		{1, []uint32{12, 13}, 0, false},    // GPU 0's instance, not GPU 1's
		{0, []uint32{4, 5}, 0, false},      // compute instances only
		{0, []uint32{3, 12, 13}, 0, false}, // two instances: ambiguous
		{0, nil, 0, false},
	} {
		gi, ok := m.InstanceOf(c.minor, c.caps)
		if ok != c.wantOK || (ok && gi != c.gi) {
			t.Errorf("InstanceOf(%d, %v) = %d, %v; want %d, %v", c.minor, c.caps, gi, ok, c.gi, c.wantOK)
		}
	}
}
