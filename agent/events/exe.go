// SPDX-License-Identifier: Apache-2.0

package events

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpufence/gpufence/agent/audit"
	"github.com/gpufence/gpufence/bpf/devfilter"
)

// exeCheck is what the agent can say of the program of an access.
type exeCheck struct {
	// exe is set when verified; now when /proc shows a path that is not
	// (or could not be shown to be) the program of the access.
	exe, now, status string
}

// userHZ is the unit of the start time in /proc/<pid>/stat (USER_HZ, 100
// on every Linux architecture gpufence runs on).
const userHZ = 100

// checkExe reads /proc/<tgid>/exe, which comes after the access, and says
// whether it is still the program the kernel saw at the access: the same
// process (start time) running the same file (inode, superblock device).
// The path is read before and after the file is compared, so an exec in
// between is not taken for the program of the access.
func checkExe(proc string, ev devfilter.Event) exeCheck {
	dir := filepath.Join(proc, strconv.FormatUint(uint64(ev.TGID), 10))
	start, ok := procStart(dir)
	if !ok || (ev.Start != 0 && start != uint64(ev.Start/(time.Second/userHZ))) {
		// Gone, or the pid is another process's now.
		return exeCheck{status: audit.ExeExited}
	}
	path, err := os.Readlink(filepath.Join(dir, "exe"))
	if err != nil {
		if _, serr := os.Stat(dir); serr != nil {
			return exeCheck{status: audit.ExeExited}
		}
		// A kernel thread, or a process whose exe cannot be read.
		return exeCheck{status: audit.ExeUnverified}
	}
	same, err := devfilter.SameExe(filepath.Join(dir, "exe"), filepath.Join(dir, "mountinfo"), ev.Exe)
	again, err2 := os.Readlink(filepath.Join(dir, "exe"))
	if now, ok := procStart(dir); !ok || now != start || err2 != nil {
		return exeCheck{status: audit.ExeExited}
	}
	switch {
	case err != nil || again != path:
		return exeCheck{now: again, status: audit.ExeUnverified}
	case !same:
		return exeCheck{now: path, status: audit.ExeChanged}
	}
	return exeCheck{exe: path, status: audit.ExeVerified}
}

// procStart is field 22 of <dir>/stat, the process's start in clock ticks
// since boot.
func procStart(dir string) (uint64, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return 0, false
	}
	// comm may hold spaces and parentheses: the fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return 0, false
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 20 {
		return 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	return v, err == nil
}
