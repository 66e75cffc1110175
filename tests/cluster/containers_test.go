// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"strings"
	"testing"
)

// TestSetExtraPATH: the folders come before the usual PATH of the daemons,
// after a source build's own, and a relative folder is refused.
func TestSetExtraPATH(t *testing.T) {
	for _, tc := range []struct {
		name, kind, prefix, want string
	}{
		{"host", "host", "/usr", "PATH=/e/bin:/x:" + defaultPATH},
		{"source", "source", "/c/opt/slurm", "PATH=/c/opt/slurm/bin:/c/opt/slurm/sbin:/e/bin:/x:" + defaultPATH},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Cluster{st: state{Root: t.TempDir(), Kind: tc.kind, Prefix: tc.prefix}}
			if err := c.SetExtraPATH("/e/bin", "/x"); err != nil {
				t.Fatal(err)
			}
			if got := c.pathEnv(); got != tc.want {
				t.Errorf("pathEnv = %q, want %q", got, tc.want)
			}
			if err := c.SetExtraPATH(); err != nil {
				t.Fatal(err)
			}
			if got := c.pathEnv(); strings.Contains(got, "/e/bin") {
				t.Errorf("after SetExtraPATH(): %q", got)
			}
		})
	}
	c := &Cluster{st: state{Root: t.TempDir()}}
	if err := c.SetExtraPATH("enroot/bin"); err == nil || !strings.Contains(err.Error(), `"enroot/bin" is not absolute`) {
		t.Errorf("relative folder: %v", err)
	}
}
