// SPDX-License-Identifier: Apache-2.0

package slurmrel

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := "# comment\n22.05 debian:bookworm\n\n25.11 src:slurm-25.11.7.tar.xz\n"
	rs, err := Parse("x", good)
	if err != nil || len(rs) != 2 || rs[0].Suite() != "bookworm" || rs[1].Tarball() != "slurm-25.11.7.tar.xz" || rs[1].Suite() != "" {
		t.Fatalf("Parse = %+v, %v", rs, err)
	}
	for text, want := range map[string]string{
		"25.11\n":                          `want "MAJOR.MINOR SOURCE"`,
		"25.1 debian:sid\n":                "not a major.minor",
		"latest debian:sid\n":              "not a major.minor",
		"25.11 http://x\n":                 "not debian:SUITE or src:TARBALL",
		"25.11 debian:a\n25.11 debian:b\n": "listed twice",
		"# none\n":                         "lists no release",
	} {
		if _, err := Parse("x", text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", text, err, want)
		}
	}
}

func TestNumber(t *testing.T) {
	for v, want := range map[string]int{"22.05": 0x160500, "25.11.7": 0x190b00, "26.05": 0x1a0500, "x": -1} {
		if got := Number(v); got != want {
			t.Errorf("Number(%q) = %#x, want %#x", v, got, want)
		}
	}
	if !(Release{Version: "25.11"}).AtLeast("23.11") || (Release{Version: "24.05"}).AtLeast("24.11") {
		t.Error("AtLeast")
	}
}

// TestListAndSelect reads the repository's packaging/slurm-releases.
func TestListAndSelect(t *testing.T) {
	rs, err := List()
	if err != nil {
		t.Fatal(err)
	}
	var vs []string
	for _, r := range rs {
		vs = append(vs, r.Version)
	}
	if got := strings.Join(vs, " "); got != "22.05 23.02 23.11 24.05 24.11 25.05 25.11 26.05" {
		t.Errorf("releases %s", got)
	}
	for sel, want := range map[string]Selection{
		"":                 {Name: "22.05"},
		"25.11+slice":      {Name: "25.11+slice", Slice: TestSlice},
		"26.05+jobidpaths": {Name: "26.05+jobidpaths", JobIDPaths: true},
		"23.11+pcluster":   {Name: "23.11+pcluster", PCluster: true},
		"25.11+pcluster+multislurmd": {Name: "25.11+pcluster+multislurmd", PCluster: true,
			Release: Release{MultiSlurmd: true}},
	} {
		got, err := Select(sel)
		if err != nil || got.Name != want.Name || got.Slice != want.Slice || got.JobIDPaths != want.JobIDPaths || got.PCluster != want.PCluster ||
			got.Release.MultiSlurmd != want.Release.MultiSlurmd {
			t.Errorf("Select(%q) = %+v, %v", sel, got, err)
		}
	}
	for sel, want := range map[string]string{
		"24.05+slice":       "CgroupSlice exists from Slurm 25.11",
		"25.11+jobidpaths":  "CgroupJobIdPaths exists from Slurm 26.05",
		"25.11+x":           "unknown variant",
		"22.05+multislurmd": "built with multiple-slurmd already",
		"21.08":             "not in packaging/slurm-releases",
	} {
		if _, err := Select(sel); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Select(%q) = %v, want %q", sel, err, want)
		}
	}
	if s, _ := Select("26.05"); !s.SLUIDJobDirs() {
		t.Error("26.05 names job cgroups by SLUID")
	}
	if s, _ := Select("26.05+jobidpaths"); s.SLUIDJobDirs() {
		t.Error("26.05+jobidpaths names them job_<id>")
	}
}
