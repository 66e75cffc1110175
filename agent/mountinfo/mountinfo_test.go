// SPDX-License-Identifier: Apache-2.0

package mountinfo

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	const text = `22 1 0:20 / / rw - ext4 /dev/root rw
30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
41 22 0:37 /system.slice /mnt/with\040space rw shared:9 master:2 - cgroup2 cgroup2 rw
42 22 259:3 /a\134b /x\011y rw - xfs /dev/nvme0n1p3
`
	got, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{ID: 22, Major: 0, Minor: 20, Root: "/", MountPoint: "/", FSType: "ext4", Source: "/dev/root", Options: "rw"},
		{ID: 30, Major: 0, Minor: 27, Root: "/", MountPoint: "/sys/fs/cgroup", FSType: "tmpfs", Source: "tmpfs", Options: "rw,mode=755"},
		{ID: 40, Major: 0, Minor: 37, Root: "/", MountPoint: "/sys/fs/cgroup/unified", FSType: "cgroup2", Source: "cgroup2", Options: "rw,nsdelegate"},
		{ID: 41, Major: 0, Minor: 37, Root: "/system.slice", MountPoint: "/mnt/with space", FSType: "cgroup2", Source: "cgroup2", Options: "rw"},
		{ID: 42, Major: 259, Minor: 3, Root: `/a\b`, MountPoint: "/x\ty", FSType: "xfs", Source: "/dev/nvme0n1p3"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Parse() =\n%+v\nwant\n%+v", got, want)
	}
	if c := Cgroup2(got); len(c) != 2 || c[0].ID != 40 || c[1].ID != 41 {
		t.Errorf("Cgroup2() = %+v, want mounts 40 and 41", c)
	}
	for _, bad := range []string{
		"garbage\n",
		"x 1 0:20 / / rw - ext4 /dev/root rw\n", // mount id
		"22 1 020 / / rw - ext4 /dev/root rw\n", // device without ':'
		"22 1 0:20 / / rw ext4 /dev/root rw\n",  // no separator
		"22 1 0:20 / / rw -\n",                  // nothing after the separator
	} {
		if m, err := Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("Parse accepted the malformed line %q: %+v", bad, m)
		}
	}
}

func TestReadSelf(t *testing.T) {
	mounts, err := Read("/proc/self/mountinfo")
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	var root bool
	for _, m := range mounts {
		root = root || m.MountPoint == "/"
	}
	if !root {
		t.Errorf("Read(/proc/self/mountinfo) has no mount at /: %+v", mounts)
	}
	if _, err := Read("/nonexistent/mountinfo"); err == nil {
		t.Error("Read of a missing file gave no error")
	}
}
