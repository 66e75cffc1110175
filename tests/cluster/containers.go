// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"fmt"
	"path/filepath"
)

// SetExtraPATH puts dirs (absolute) in the daemons' PATH after the
// release's own folders, as a node's package installs put commands in
// /usr/bin: pyxis runs "enroot" from slurmstepd's PATH. slurmd sees it
// from its next start (RestartSlurmd).
func (c *Cluster) SetExtraPATH(dirs ...string) error {
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			return fmt.Errorf("PATH folder %q is not absolute", d)
		}
	}
	c.st.ExtraPATH = dirs
	return c.saveState()
}
