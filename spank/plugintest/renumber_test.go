package plugintest

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Flag values from renumber.h.
const (
	slurmLocal  = 1
	listFromEnv = 2
)

func TestRenumber(t *testing.T) {
	driver := compile(t, "renumber_driver", "testdata/renumber_driver.c",
		filepath.Join(repoRoot, "spank/plugin/renumber.c"))
	tests := []struct {
		name  string
		value string // "-unset-" for an unset variable
		list  string
		flags int
		want  string
	}{
		{"single GPU", "2", "2", 0, "SET 0"},
		{"two GPUs", "1,3", "1,3", 0, "SET 0,1"},
		{"second of two", "3", "1,3", 0, "SET 1"},
		{"order kept", "3,1", "1,3", 0, "SET 1,0"},
		{"list order does not matter", "3", "3,1", 0, "SET 1"},
		{"not allowed is dropped", "0,3", "1,3", 0, "SET 1"},
		{"nothing allowed", "0", "", 0, "SET "},
		{"UUID untouched", "GPU-8f6a1b2c-0000-1111-2222-333344445555", "1", 0, "KEEP"},
		{"MIG untouched", "MIG-GPU-8f6a/1/0", "1", 0, "KEEP"},
		{"Slurm already local", "0", "1", slurmLocal, "KEEP"},
		{"unset", "-unset-", "1", 0, "KEEP"},
		{"empty", "", "1", 0, "KEEP"},
		{"junk entry", "1,x", "1", 0, "KEEP"},
		{"trailing comma", "1,", "1", 0, "KEEP"},
		{"sign", "-1", "1", 0, "KEEP"},
		{"space", "1, 3", "1,3", 0, "KEEP"},
		{"overflow", "4294967296", "1", 0, "KEEP"},
		{"list from env, all in it", "1,3", "1,3", listFromEnv, "SET 0,1"},
		// Under ConstrainDevices=yes Slurm already wrote local indices; an
		// entry outside the global list shows the value is not global.
		{"list from env, local value", "0", "1", listFromEnv, "KEEP"},
		{"list from env, Slurm local wins", "1", "1", listFromEnv | slurmLocal, "KEEP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := exec.Command(driver, "renumber", tt.value, tt.list, strconv.Itoa(tt.flags)).CombinedOutput()
			if err != nil {
				t.Fatalf("driver: %v\n%s", err, out)
			}
			if got := strings.TrimSuffix(string(out), "\n"); got != tt.want {
				t.Errorf("renumber(%q, [%s], %d) = %q, want %q", tt.value, tt.list, tt.flags, got, tt.want)
			}
		})
	}
}

func TestParseGPUList(t *testing.T) {
	driver := compile(t, "renumber_driver", "testdata/renumber_driver.c",
		filepath.Join(repoRoot, "spank/plugin/renumber.c"))
	tests := []struct{ in, want string }{
		{"0,2", "2: 0,2"},
		{"3,1,3", "2: 1,3"},
		{"", "0:"},
		{"1,x", "-1:"},
		{"0,1,2,3,4,5,6,7,8", "-1:"}, // over the driver's capacity of 8
	}
	for _, tt := range tests {
		out, err := exec.Command(driver, "list", tt.in).CombinedOutput()
		if err != nil {
			t.Fatalf("driver: %v\n%s", err, out)
		}
		if got := strings.TrimSuffix(string(out), "\n"); got != tt.want {
			t.Errorf("parse(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
