// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"slices"
	"testing"
)

func TestMountsUnder(t *testing.T) {
	mi := `22 1 0:21 / /sys rw - sysfs sysfs rw
101 22 0:50 / /var/tmp/gpufence-cluster-1/bpffs rw,relatime - bpf gpufence-e2e rw
102 22 0:51 / /var/tmp/gpufence-cluster-1/a\040b rw - tmpfs x rw
103 22 0:52 / /var/tmp/gpufence-cluster-10/bpffs rw - bpf gpufence-e2e rw
104 22 0:53 / /var/tmp/gpufence-cluster-1 rw - tmpfs y rw
`
	got := mountsUnder(mi, "/var/tmp/gpufence-cluster-1")
	want := []string{"/var/tmp/gpufence-cluster-1/bpffs", "/var/tmp/gpufence-cluster-1/a b"}
	if !slices.Equal(got, want) {
		t.Errorf("mountsUnder = %q, want %q (not the root itself, not a sibling with the same prefix)", got, want)
	}
}
