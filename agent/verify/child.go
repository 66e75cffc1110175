// SPDX-License-Identifier: Apache-2.0

package verify

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpufence/gpufence/proto/agentclient"
	pb "github.com/gpufence/gpufence/proto/gpufence/v1"
)

// childResult is what a child reports on stdout, one JSON object.
type childResult struct {
	// Unreachable: the agent could not be asked; Error its reason, or the
	// agent's refusal.
	Unreachable bool       `json:"unreachable,omitempty"`
	Error       string     `json:"error,omitempty"`
	Info        *childInfo `json:"info,omitempty"`
	Opens       []opened   `json:"opens"`
}

// childInfo is the agent's VerifyInfo.
type childInfo struct {
	Mode, PolicyMode, Scope, FilterProblem, Cgroup string
	CgroupID                                       uint64
	GPU                                            int
	GPUs                                           []tableGPU
}

type tableGPU struct {
	Index int
	Files []string
}

// opened is one open(2) of a device file and its errno name ("OK").
type opened struct {
	Path  string `json:"path"`
	Errno string `json:"errno"`
}

// ChildMain is the process verify starts inside its cgroup: with
// --register it asks the agent for its GPU from there and then opens every
// device file of the agent's GPU table; with --open it opens the files
// given. It prints a childResult and exits 0, or 2 on bad arguments.
func ChildMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(ChildCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "agent socket")
	timeout := fs.Duration("timeout", 10*time.Second, "request timeout")
	register := fs.Bool("register", false, "ask the agent for a GPU")
	gpu := fs.Int("gpu", -1, "GPU index to ask for")
	openOnly := fs.Bool("open", false, "open the files given as arguments")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	res := childResult{Opens: []opened{}}
	var files []string
	switch {
	case *register:
		m := &pb.VerifyStart{}
		if *gpu >= 0 {
			g := uint32(*gpu)
			m.Gpu = &g
		}
		resp, err := agentclient.Call(*socket, &pb.Request{Msg: &pb.Request_VerifyStart{VerifyStart: m}}, *timeout)
		switch {
		case errors.Is(err, agentclient.ErrAgent):
			res.Error = resp.GetError()
		case err != nil:
			res.Unreachable, res.Error = true, err.Error()
		default:
			v := resp.GetVerify()
			res.Info = &childInfo{Mode: v.GetMode(), PolicyMode: v.GetPolicyMode(), Scope: v.GetScope(), FilterProblem: v.GetFilterProblem(),
				Cgroup: v.GetCgroup(), CgroupID: v.GetCgroupId(), GPU: int(v.GetGpu())}
			for _, g := range v.GetGpus() {
				res.Info.GPUs = append(res.Info.GPUs, tableGPU{Index: int(g.GetIndex()), Files: g.GetFiles()})
			}
			files = allFiles(res.Info)
		}
	case *openOnly:
		files = fs.Args()
	default:
		fs.Usage()
		return 2
	}
	for _, f := range files {
		res.Opens = append(res.Opens, opened{Path: f, Errno: openErrno(f)})
	}
	if err := json.NewEncoder(stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// openErrno opens path as a job would and closes it at once.
func openErrno(path string) string {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
		return "OK"
	}
	var e unix.Errno
	if errors.As(err, &e) {
		if n := unix.ErrnoName(e); n != "" {
			return n
		}
	}
	return err.Error()
}
