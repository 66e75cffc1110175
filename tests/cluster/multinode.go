// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpufence/gpufence/agent/jobcgroup"
)

// A multi-node cluster (Options.Nodes > 1) runs one slurmd per node on this
// host, as Slurm's multiple-slurmd support allows (`slurmd -N <node>`; the
// source builds are configured with --enable-multiple-slurmd, Debian's
// packages have it). Each node has its own NodeName, SlurmdPort, spool, pid
// file and log (%n in slurm.conf), its own scope <node>_slurmstepd.scope,
// and GPU device minors of its own: node k's GPU 0 is minor k*GPUs, so a
// device list applied on the wrong node opens the wrong files.
//
// Each node gets its own gpufence agent, as on a real cluster. The plugin
// finds the agent by the socket= path of the one plugstack.conf every node
// reads; so each slurmd runs in a mount namespace of its own in which
// AgentSocketDir is that node's NodeSocketDir (a bind mount, propagation
// private). slurmstepd and the job prolog inherit slurmd's namespace, so
// they reach their node's agent and no other. The mounts go with the
// namespaces, when the node's slurmd and slurmstepds have exited: nothing
// is mounted on the host.

// NodeState is one node of a multi-node cluster, kept in state.json.
type NodeState struct {
	Name       string   `json:"name"`
	Port       int      `json:"port"`
	FirstMinor int      `json:"first_minor"`
	Slurmd     *Process `json:"slurmd"`
	Scope      string   `json:"scope,omitempty"` // known once its slurmd started
}

// nodeName is the name of node i (0-based) of a multi-node cluster.
func nodeName(i int) string { return fmt.Sprintf("n%d", i+1) }

// checkNodes refuses a multi-node cluster in a layout it is not written for.
func checkNodes(o Options, kind string) error {
	switch {
	case o.Nodes <= 1:
		return nil
	case o.Nodes > 8:
		return fmt.Errorf("Nodes=%d: at most 8", o.Nodes)
	case o.MIG:
		return errors.New("a multi-node cluster has the plain or ParallelCluster gres.conf, not the MIG layout")
	case o.GPUs*o.Nodes > 64:
		return fmt.Errorf("Nodes=%d with GPUs=%d: at most 64 fake GPUs in all", o.Nodes, o.GPUs)
	case kind != "" && kind != "host" && kind != "source":
		// gfroot's namespaces would have to carry each node's bind mount.
		return fmt.Errorf("a multi-node cluster runs this host's packages or a source build, not a %s release", kind)
	}
	return nil
}

// initNodes names the nodes, gives each its range of device minors and
// makes its spool and socket folders (ports come with nodePorts).
func (c *Cluster) initNodes(n int) error {
	if n <= 1 {
		return nil
	}
	for i := range n {
		c.st.Nodes = append(c.st.Nodes, &NodeState{Name: nodeName(i), FirstMinor: i * c.st.GPUs})
		for _, d := range []string{"state/d/" + nodeName(i), "run/nodes/" + nodeName(i)} {
			if err := os.MkdirAll(c.path(d), 0o755); err != nil {
				return err
			}
		}
	}
	return os.MkdirAll(c.AgentSocketDir(), 0o755)
}

func (c *Cluster) confNodes() []confNode {
	var out []confNode
	for _, n := range c.st.Nodes {
		out = append(out, confNode{Name: n.Name, Port: n.Port, FirstMinor: n.FirstMinor})
	}
	return out
}

// renderNodesGres is gres.conf of a multi-node cluster: one line per node
// with its own device files (typ is " Type=…" or "").
func renderNodesGres(p confParams, typ string) string {
	var b strings.Builder
	for _, n := range p.Nodes {
		fmt.Fprintf(&b, "NodeName=%s Name=gpu%s File=%s/dev/nvidia[%d-%d]\n", n.Name, typ, p.Root, n.FirstMinor, n.FirstMinor+p.GPUs-1)
	}
	return b.String()
}

// multiNode reports whether the cluster runs several slurmd.
func (c *Cluster) multiNode() bool { return len(c.st.Nodes) > 0 }

// Nodes are the node names: the host's name on a single-node cluster.
func (c *Cluster) Nodes() []string {
	if !c.multiNode() {
		return []string{c.st.Host}
	}
	var out []string
	for _, n := range c.st.Nodes {
		out = append(out, n.Name)
	}
	return out
}

func (c *Cluster) node(name string) (*NodeState, error) {
	for _, n := range c.st.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no node %q in this cluster (nodes: %v)", name, c.Nodes())
}

// AgentSocketDir is the folder that, in each node's slurmd mount
// namespace, is that node's NodeSocketDir: the folder of the plugstack
// line's socket= path on a multi-node cluster. On the host it stays empty.
func (c *Cluster) AgentSocketDir() string { return c.path("run/agent") }

// NodeSocketDir is the folder where node's agent puts its socket; node's
// slurmd and slurmstepds see it at AgentSocketDir.
func (c *Cluster) NodeSocketDir(node string) string { return c.path("run/nodes/" + node) }

// NodeDevPath is the fake device node of node's GPU i (minor FirstMinor+i).
func (c *Cluster) NodeDevPath(node string, i int) (string, error) {
	n, err := c.node(node)
	if err != nil {
		return "", err
	}
	if i < 0 || i >= c.st.GPUs {
		return "", fmt.Errorf("node %s has GPUs 0-%d, not %d", node, c.st.GPUs-1, i)
	}
	return c.DevPath(n.FirstMinor + i), nil
}

// AllDevPaths are the fake GPU device nodes of every node, by minor.
func (c *Cluster) AllDevPaths() []string {
	var p []string
	for i := 0; i < c.st.GPUs*max(1, len(c.st.Nodes)); i++ {
		p = append(p, c.DevPath(i))
	}
	return p
}

// NodeScopeDir is the cgroup2 folder of node's scope (slurmd and its jobs).
func (c *Cluster) NodeScopeDir(node string) (string, error) {
	n, err := c.node(node)
	if err != nil {
		return "", err
	}
	if n.Scope == "" {
		return filepath.Join(c.st.CgroupMount, c.slice(), n.Name+"_slurmstepd.scope"), nil
	}
	return n.Scope, nil
}

// NodeSlurmd is node's slurmd process.
func (c *Cluster) NodeSlurmd(node string) (*Process, error) {
	n, err := c.node(node)
	if err != nil {
		return nil, err
	}
	return n.Slurmd, nil
}

// startNodes (re)starts every node's slurmd and waits until all are idle.
func (c *Cluster) startNodes(ctx context.Context) error {
	for _, n := range c.st.Nodes {
		if err := n.Slurmd.Stop(); err != nil {
			return fmt.Errorf("stop slurmd of %s: %w", n.Name, err)
		}
	}
	since := time.Now()
	for _, n := range c.st.Nodes {
		if err := c.startNode(n); err != nil {
			return err
		}
	}
	if err := c.waitNodes(ctx, 60*time.Second, since, c.Nodes(), "idle"); err != nil {
		return err
	}
	for _, n := range c.st.Nodes {
		if err := c.discoverNodeScope(n); err != nil {
			return err
		}
	}
	return c.saveState()
}

// startNode starts node n's slurmd in a new mount namespace (private
// propagation) in which AgentSocketDir is n's NodeSocketDir. The shell
// execs slurmd, so the recorded PID is slurmd's.
func (c *Cluster) startNode(n *NodeState) error {
	env := c.baseEnv()
	if c.st.Hybrid {
		env = append(env, "LD_PRELOAD="+c.shimPath())
	}
	argv := append([]string{"unshare", "--mount", "--propagation", "private", "--",
		"/bin/sh", "-c", `mount --bind "$1" "$2" && shift 2 && exec "$@"`, "gf-node-" + n.Name,
		c.NodeSocketDir(n.Name), c.AgentSocketDir()},
		c.daemonArgv("slurmd", "-D", "-N", n.Name, "-f", c.path("etc/slurm.conf"))...)
	p, err := startProcess("slurmd-"+n.Name, c.path("logs/slurmd-"+n.Name+".out"), env, nil, c.st.Root, argv...)
	if err != nil {
		return err
	}
	n.Slurmd = p
	return nil
}

// waitNodes waits until every node is in one of the states (sinfo's %t)
// and each of started has registered a slurmd started since then (a node
// stays idle in slurmctld while its slurmd restarts).
func (c *Cluster) waitNodes(ctx context.Context, timeout time.Duration, since time.Time, started []string, states ...string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last Result
	for {
		for _, p := range []*Process{c.st.Munged, c.st.Slurmctld} {
			if !p.Alive() {
				return fmt.Errorf("%s exited while waiting for the nodes\n%s", p.Name, c.diag())
			}
		}
		for _, n := range c.st.Nodes {
			if !n.Slurmd.Alive() {
				return fmt.Errorf("slurmd of %s exited while waiting for it\n%s", n.Name, c.diag())
			}
		}
		last = c.Run(ctx, "", "sinfo", "-h", "-N", "-o", "%N %t")
		if last.Code == 0 && nodesIn(last.Stdout, c.Nodes(), states) {
			show := c.Run(ctx, "", "scontrol", "-o", "show", "node")
			if show.Code == 0 && registeredSince(show.Stdout, started, since) {
				return nil
			}
			last = show
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nodes %v not %v after %s: %w\nlast: %s\n%s", c.Nodes(), states, timeout, ctx.Err(), last, c.diag())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// nodesIn reports whether sinfo -N -o "%N %t" shows every one of names in
// one of states.
func nodesIn(sinfo string, names, states []string) bool {
	got := map[string]string{}
	for _, l := range strings.Split(sinfo, "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			got[f[0]] = f[1]
		}
	}
	for _, n := range names {
		ok := false
		for _, s := range states {
			ok = ok || got[n] == s
		}
		if !ok {
			return false
		}
	}
	return true
}

// discoverNodeScope finds the scope node n's slurmd put itself in, which
// must be named for the node: a Slurm built without multiple-slurmd would
// put every node's jobs in one slurmstepd.scope.
func (c *Cluster) discoverNodeScope(n *NodeState) error {
	p, err := jobcgroup.PathOf(n.Slurmd.PID)
	if err != nil {
		return err
	}
	dir := filepath.Join(c.st.CgroupMount, p)
	want := filepath.Join(c.st.CgroupMount, c.slice(), n.Name+"_slurmstepd.scope", "slurmd")
	if dir != want {
		return fmt.Errorf("slurmd of %s (pid %d) is in cgroup %s, not %s: is Slurm %s built with multiple-slurmd support?", n.Name, n.Slurmd.PID, dir, want, c.st.Full)
	}
	n.Scope = filepath.Dir(dir)
	return nil
}

// KillSlurmd kills node's slurmd with SIGKILL, as a crash would: its
// slurmstepds and their tasks keep running.
func (c *Cluster) KillSlurmd(node string) error {
	n, err := c.node(node)
	if err != nil {
		return err
	}
	if !n.Slurmd.Alive() {
		return fmt.Errorf("slurmd of %s is not running", node)
	}
	if err := syscall.Kill(n.Slurmd.PID, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill slurmd of %s (pid %d): %w", node, n.Slurmd.PID, err)
	}
	if !n.Slurmd.wait(5 * time.Second) {
		return fmt.Errorf("slurmd of %s (pid %d) survived SIGKILL", node, n.Slurmd.PID)
	}
	return nil
}

// StartSlurmd starts node's slurmd again after KillSlurmd (jobs may run:
// it recovers their steps) and waits until slurmctld has it back.
func (c *Cluster) StartSlurmd(ctx context.Context, node string) error {
	n, err := c.node(node)
	if err != nil {
		return err
	}
	if n.Slurmd.Alive() {
		return fmt.Errorf("slurmd of %s still runs (pid %d)", node, n.Slurmd.PID)
	}
	since := time.Now()
	if err := c.startNode(n); err != nil {
		return err
	}
	if err := c.saveState(); err != nil {
		return err
	}
	return c.waitNodes(ctx, 60*time.Second, since, []string{node}, "idle", "mix", "alloc")
}

// StartNodeAgent is StartAgent for node's agent, logging to
// <Root>/logs/<base name of bin>-<node>.log.
func (c *Cluster) StartNodeAgent(ctx context.Context, node, bin string, args ...string) (*Process, error) {
	if _, err := c.node(node); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	name := filepath.Base(bin) + "-" + node
	env := append(c.baseEnv(), "PATH="+c.ToolPATH())
	p, err := startProcess(name, c.path("logs/"+name+".log"), env, nil, c.st.Root, append([]string{bin}, args...)...)
	if err != nil {
		return nil, err
	}
	c.st.Agents = append(c.st.Agents, p)
	return p, c.saveState()
}

// nodeSlurmds are the slurmd processes of a multi-node cluster.
func (c *Cluster) nodeSlurmds() []*Process {
	var ps []*Process
	for _, n := range c.st.Nodes {
		if n.Slurmd != nil {
			ps = append(ps, n.Slurmd)
		}
	}
	return ps
}

// nodePorts gives each node its SlurmdPort: the first node the cluster's,
// the others free ones.
func (c *Cluster) nodePorts() error {
	taken := []int{c.st.CtldPort, c.st.SlurmdPort}
	for i, n := range c.st.Nodes {
		if i == 0 {
			n.Port = c.st.SlurmdPort
			continue
		}
		p, err := freePort(c.st.SlurmdPort+i, taken)
		if err != nil {
			return err
		}
		n.Port = p
		taken = append(taken, p)
	}
	return nil
}

// registeredSince reports whether scontrol -o show node shows every one of
// names with a SlurmdStartTime at or after since (to the second, as
// slurmctld has it, in local time).
func registeredSince(show string, names []string, since time.Time) bool {
	start := map[string]time.Time{}
	for _, l := range strings.Split(show, "\n") {
		var name string
		var at time.Time
		for _, f := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(f, "NodeName="); ok {
				name = v
			}
			if v, ok := strings.CutPrefix(f, "SlurmdStartTime="); ok {
				at, _ = time.ParseInLocation("2006-01-02T15:04:05", v, time.Local)
			}
		}
		if name != "" {
			start[name] = at
		}
	}
	for _, n := range names {
		if start[n].Before(since.Truncate(time.Second)) {
			return false
		}
	}
	return true
}
