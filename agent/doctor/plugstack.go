// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// PluginName is the file name of gpufence's SPANK plugin (the C entry).
const PluginName = "spank_gpufence.so"

// DefaultPluginDir is where packages install the plugin and its per-Slurm
// builds (slurm-<major.minor>/spank_gpufence.so).
const DefaultPluginDir = "/usr/lib/gpufence"

// plugLine is a required/optional line of plugstack.conf naming gpufence.
type plugLine struct {
	File string
	No   int
	// Kind is required or optional.
	Kind string
	// Path is the plugin path as written; Resolved the node path Slurm
	// loads ("" when it cannot be told: a relative path without PluginDir).
	Path, Resolved string
	Args           []string
}

// plugstackFacts is what plugstack.conf and its includes say.
type plugstackFacts struct {
	// Conf is the top plugstack.conf; Files every file read, in order.
	Conf  string
	Files []string
	Err   error
	// Lines are the lines that load gpufence's plugin.
	Lines []plugLine
	// Problems are lines Slurm would reject.
	Problems []string
	// Includes are the include patterns seen (node paths), IncludeDetail
	// each with what it matched.
	Includes      []string
	IncludeDetail []string
}

func readPlugstack(e *Env, s slurmFacts) plugstackFacts {
	var f plugstackFacts
	// Without a readable slurm.conf, Slurm's default beside it still tells
	// whether the plugin would load.
	dir := filepath.Dir(s.Conf)
	if v, ok := get(s.Lines, "PlugStackConfig"); ok {
		f.Conf = v
		if !filepath.IsAbs(v) {
			f.Conf = filepath.Join(dir, v)
		}
	} else {
		f.Conf = filepath.Join(dir, "plugstack.conf")
	}
	var pluginDirs []string
	if v, ok := get(s.Lines, "PluginDir"); ok {
		pluginDirs = strings.Split(v, ":")
	}
	f.Err = f.read(e, f.Conf, pluginDirs, 0)
	return f
}

// read parses one plugstack file as Slurm's spank.c does: "#" comments,
// "include GLOB" (relative to the file's folder), and
// "required|optional PATH [ARGS...]".
func (f *plugstackFacts) read(e *Env, file string, pluginDirs []string, depth int) error {
	if depth > 8 {
		return fmt.Errorf("%s: includes nested deeper than 8", file)
	}
	fh, err := os.Open(e.path(file))
	if err != nil {
		return err
	}
	defer fh.Close()
	f.Files = append(f.Files, file)
	sc := bufio.NewScanner(fh)
	no := 0
	for sc.Scan() {
		no++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		where := fmt.Sprintf("%s:%d", file, no)
		switch fields[0] {
		case "include":
			if len(fields) != 2 {
				f.Problems = append(f.Problems, where+": include needs exactly one pattern")
				continue
			}
			pat := fields[1]
			if !filepath.IsAbs(pat) {
				pat = filepath.Join(filepath.Dir(file), pat)
			}
			f.Includes = append(f.Includes, pat)
			matches, err := filepath.Glob(e.path(pat))
			if err != nil {
				f.Problems = append(f.Problems, fmt.Sprintf("%s: include %s: %v", where, pat, err))
				continue
			}
			f.IncludeDetail = append(f.IncludeDetail, fmt.Sprintf("%s: include %s (%d files)", where, pat, len(matches)))
			for _, m := range matches {
				node := m
				if e.Root != "" && e.Root != "/" {
					node = "/" + strings.TrimPrefix(strings.TrimPrefix(m, filepath.Clean(e.Root)), "/")
				}
				if err := f.read(e, node, pluginDirs, depth+1); err != nil {
					f.Problems = append(f.Problems, fmt.Sprintf("%s: include %s: %v", where, node, err))
				}
			}
		case "required", "optional":
			if len(fields) < 2 {
				f.Problems = append(f.Problems, where+": "+fields[0]+" without a plugin path")
				continue
			}
			base := filepath.Base(fields[1])
			if base != PluginName {
				continue
			}
			l := plugLine{File: file, No: no, Kind: fields[0], Path: fields[1], Args: fields[2:]}
			if filepath.IsAbs(l.Path) {
				l.Resolved = l.Path
			} else {
				for _, d := range pluginDirs {
					if p := filepath.Join(d, l.Path); e.exists(p) {
						l.Resolved = p
						break
					}
				}
			}
			f.Lines = append(f.Lines, l)
		default:
			f.Problems = append(f.Problems, fmt.Sprintf("%s: %q is neither include, required nor optional: Slurm rejects the whole plugin stack", where, fields[0]))
		}
	}
	return sc.Err()
}

// plugOptions are the plugin's arguments, parsed as spank/plugin/args.c
// parses them (strictly: an unknown or repeated key is an error).
type plugOptions struct {
	Socket, Failure, Spool, Timeout string
}

func parsePlugArgs(args []string) (plugOptions, error) {
	var o plugOptions
	seen := map[string]bool{}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		var dst *string
		switch {
		case ok && k == "golib":
			// The Go library of older versions: the plugin ignores it.
			continue
		case !ok:
		case k == "socket":
			dst = &o.Socket
		case k == "timeout":
			dst = &o.Timeout
		case k == "failure":
			dst = &o.Failure
		case k == "spool":
			dst = &o.Spool
		}
		if dst == nil {
			return o, fmt.Errorf("unknown option %q (known: socket, timeout, failure, spool)", a)
		}
		if seen[k] {
			return o, fmt.Errorf("option %q given twice", k)
		}
		seen[k] = true
		if (k == "socket" || k == "spool") && !filepath.IsAbs(v) {
			return o, fmt.Errorf("option %q: not an absolute path", a)
		}
		if k == "failure" && v != "open" && v != "closed" {
			return o, fmt.Errorf("option %q: want closed or open", a)
		}
		*dst = v
	}
	return o, nil
}

const pluginLine = "required " + DefaultPluginDir + "/" + PluginName

func (r *run) checkPlugstack() Check {
	c := newCheck("plugstack", "plugstack.conf loads gpufence")
	p := r.plug
	if r.slurm.Err != nil {
		c.add("slurm.conf unreadable: looking at Slurm's default %s", p.Conf)
	}
	if p.Err != nil {
		if errors.Is(p.Err, os.ErrNotExist) {
			c.fail(fmt.Sprintf("Create %s with the line %q and restart slurmd.", p.Conf, pluginLine),
				"no %s: Slurm loads no SPANK plugin, so gpufence isolates nothing", p.Conf)
		} else {
			c.fail("Make "+p.Conf+" readable.", "cannot read %s: %v", p.Conf, unwrapPath(p.Err, r.env))
		}
		return c
	}
	c.add("read %s", strings.Join(p.Files, ", "))
	for _, d := range p.IncludeDetail {
		c.add("%s", d)
	}
	for _, pr := range p.Problems {
		c.fail("Fix the plugstack line Slurm rejects.", "%s", unwrapPath(errors.New(pr), r.env))
	}
	switch len(p.Lines) {
	case 0:
		target := p.Conf
		for _, inc := range p.Includes {
			if strings.ContainsAny(filepath.Base(inc), "*?[") {
				name := "gpufence.conf"
				if m, _ := filepath.Match(filepath.Base(inc), name); !m {
					continue
				}
				target = filepath.Join(filepath.Dir(inc), name)
				break
			}
		}
		c.fail(fmt.Sprintf("Add %q to %s and restart slurmd.", pluginLine, target),
			"no line loads %s: Slurm runs jobs without gpufence", PluginName)
		return c
	case 1:
	default:
		var where []string
		for _, l := range p.Lines {
			where = append(where, fmt.Sprintf("%s:%d", l.File, l.No))
		}
		c.fail("Keep exactly one gpufence line in the plugin stack.", "%s is listed %d times (%s): Slurm would load it more than once", PluginName, len(p.Lines), strings.Join(where, ", "))
	}
	l := p.Lines[0]
	c.add("%s:%d: %s %s %s", l.File, l.No, l.Kind, l.Path, strings.Join(l.Args, " "))
	switch {
	case l.Resolved == "":
		c.warn("Write the plugin's absolute path ("+DefaultPluginDir+"/"+PluginName+") in the plugstack line.",
			"the plugin path %s is relative and PluginDir does not hold it: cannot check what Slurm loads", l.Path)
	default:
		if chain, err := r.env.resolve(l.Resolved); err != nil {
			c.fail("Install gpufence's plugin at "+chain[len(chain)-1]+" on every node (login nodes too), or fix the path.",
				"%s does not exist: srun and slurmd fail while a required plugin is missing", strings.Join(chain, " -> "))
		}
	}
	opts, err := parsePlugArgs(l.Args)
	if err != nil {
		c.fail("Fix the plugin's arguments (see docs/configuration.md): the plugin refuses to start with them.", "bad plugin arguments: %v", err)
	} else {
		sock := orDefault(opts.Socket, "/run/gpufence/agent.sock")
		if sock != r.env.Config.Socket {
			c.fail(fmt.Sprintf("Make socket= in the plugstack line and socket in the agent configuration the same path (the agent listens on %s).", r.env.Config.Socket),
				"the plugin connects to %s but the agent listens on %s", sock, r.env.Config.Socket)
		}
		if opts.Failure == "open" {
			c.add("failure=open: steps run without isolation when the agent is unreachable")
			spool := orDefault(opts.Spool, "/var/spool/gpufence/failopen.jsonl")
			if spool != r.env.Config.FailOpenSpool {
				c.warn("Make spool= and failopen_spool the same path.", "the plugin spools unfiltered steps to %s but the agent reads %s: they are never audited", spool, r.env.Config.FailOpenSpool)
			}
		}
	}
	if l.Kind == "optional" {
		c.warn("Write \"required\" instead of \"optional\" in "+l.File+" and restart slurmd.",
			"the line is optional: when the plugin fails to load, Slurm runs jobs without gpufence and says nothing to the user")
	}
	if c.Verdict == "" {
		c.ok("%s:%d loads %s (required)", l.File, l.No, l.Path)
	}
	c.add("slurmd calls job_prolog only for plugins listed when it started: restart slurmd after changing this line")
	return c
}
