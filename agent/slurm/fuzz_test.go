// SPDX-License-Identifier: Apache-2.0

package slurm

import (
	"io"
	"io/fs"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// memFiles is a fileSystem of files held in memory, so that fuzzed
// includes never reach the machine's files.
type memFiles map[string]string

func (m memFiles) Open(name string) (io.ReadCloser, error) {
	body, ok := m[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return io.NopCloser(strings.NewReader(body)), nil
}

func (m memFiles) Glob(pattern string) ([]string, error) {
	if _, err := filepath.Match(pattern, ""); err != nil {
		return nil, err
	}
	var out []string
	for name := range m {
		if ok, _ := filepath.Match(pattern, name); ok {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}

func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// allocBound is what reading n bytes of configuration may allocate: the
// includes re-read within their bounds and the host lists expanded within
// theirs, but nothing that grows with what a line claims.
func allocBound(n int) uint64 { return 64<<20 + 4096*uint64(n) }

const (
	confDir  = "/etc/slurm"
	gresPath = confDir + "/gres.conf"
	incPath  = confDir + "/inc.conf"
)

func FuzzExpandHostlist(f *testing.F) {
	for _, s := range [][2]string{
		{"/dev/nvidia[0-3]", "/dev/nvidia2"},
		{"node[1,3-4]", "node3"},
		{"gpu[08-10]", "gpu09"},
		{"gpu[08-10]", "gpu9"},
		{"a,b[1-2],c", "c"},
		{"queue1-st-g5-[1-2]", "queue1-st-g5-2"},
		{"n[0-65535]", "n65535"},
		{"x[1]y[2]", "x1y2"},
		{"x[+1]", "x1"},
		{"n[00-10]", "n010"},
		{"n[7-12]", "n012"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, expr, name string) {
		before := heapAllocs()
		names, err := ExpandHostlist(expr)
		if a := heapAllocs() - before; a > allocBound(len(expr)) {
			t.Fatalf("ExpandHostlist(%.60q) allocated %d bytes", expr, a)
		}
		in, cerr := hostlistContains(expr, name)
		if (err == nil) != (cerr == nil) {
			t.Fatalf("%q: ExpandHostlist error %v, hostlistContains error %v", expr, err, cerr)
		}
		if err != nil {
			return
		}
		size := 0
		for _, n := range names {
			size += len(n)
		}
		if len(names) > maxHostlistNames || size > maxHostlistBytes {
			t.Fatalf("%.60q expanded to %d names, %d bytes", expr, len(names), size)
		}
		if want := slices.Contains(names, name); in != want {
			t.Fatalf("hostlistContains(%q, %q) = %v, expansion %v contains it: %v", expr, name, in, names, want)
		}
		for i := 0; i < len(names); i += 1 + len(names)/16 {
			if ok, _ := hostlistContains(expr, names[i]); !ok {
				t.Fatalf("hostlistContains(%q, %q) = false for its own member", expr, names[i])
			}
		}
	})
}

func FuzzReadGresGPUs(f *testing.F) {
	for _, s := range [][3]string{
		{"Name=gpu File=/dev/nvidia[0-3]\n", "", "n1"},
		{"AutoDetect=nvml\nName=gpu File=/dev/nvidia10\nName=gpu File=/dev/nvidia2\n", "", "n1"},
		{"NodeName=n[1-2] Name=gpu File=/dev/nvidia[0-1]\nNodeName=n3 Name=gpu File=/dev/nvidia[0-7]\n# comment\n", "", "n2"},
		{"include inc.conf\n", "NodeName=q1-st-g4dn-[1-5] Name=gpu Type=t4 File=/dev/nvidia[0-0]\n", "q1-st-g4dn-3"},
		{"Name=gpu File=/dev/nvidia0\nName=gpu Type=1g.10gb MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap[147-148]\n", "", "n1"},
		{"include inc.conf\ninclude inc.conf\n", "include inc.conf\ninclude inc.conf\nName=gpu File=/dev/nvidia0\n", "n1"},
		{"include *\n", "include /etc/slurm/*\n", "n1"},
		{"Name=gpu File=\"/dev/nvidia0\" # x\n", "", "n1"},
		{"Name=gpu MultipleFiles=/dev/nvidia0,/x[0-65535]\n", "", "n1"},
		{"Name=gpu File=/dev/nvidia[0-65535]\n", "", "n1"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, gres, inc, node string) {
		files := memFiles{gresPath: gres, incPath: inc}
		before := heapAllocs()
		gpus, err := readGresGPUs(files, gresPath, node)
		if a := heapAllocs() - before; a > allocBound(len(gres)+len(inc)) {
			t.Fatalf("readGresGPUs allocated %d bytes for %d bytes of input", a, len(gres)+len(inc))
		}
		if err != nil {
			if gpus != nil || err.Error() == "" {
				t.Fatalf("error %v with %d GPUs", err, len(gpus))
			}
			return
		}
		if len(gpus) == 0 || len(gpus) > maxGPUs {
			t.Fatalf("%d GPUs without an error", len(gpus))
		}
		whole := map[string]bool{}
		for i, g := range gpus {
			switch {
			case g.Index != i:
				t.Fatalf("GPU %d has index %d", i, g.Index)
			case len(g.Files) == 0 || g.Path != g.Files[0]:
				t.Fatalf("GPU %d: path %q, files %q", i, g.Path, g.Files)
			case g.MIG != (len(g.Files) > 1) || len(g.Files) > maxMIGFiles:
				t.Fatalf("GPU %d: MIG %v with %d files", i, g.MIG, len(g.Files))
			case g.Source == "":
				t.Fatalf("GPU %d has no source", i)
			case !g.MIG && whole[g.Path]:
				t.Fatalf("whole GPU %s listed twice", g.Path)
			}
			if !g.MIG {
				whole[g.Path] = true
			}
		}
		for _, g := range gpus {
			for _, f := range g.Files {
				if g.MIG && whole[f] {
					t.Fatalf("%s is a whole GPU and part of MIG slice %d", f, g.Index)
				}
			}
		}
	})
}

// FuzzReadSettings reads slurm.conf and cgroup.conf (each may include
// inc.conf) and checks the settings against the lines read on their own;
// lines without quotes or comments survive being written out and read again.
func FuzzReadSettings(f *testing.F) {
	for _, s := range [][3]string{
		{"ClusterName=c1\nTaskPlugin=task/affinity,task/cgroup\n", "ConstrainDevices=yes\n", ""},
		{"taskplugin=task/cgroup\n", "constraindevices=YES\n", ""},
		{"include inc.conf\n", "include inc.conf\n", "TaskPlugin=task/cgroup ConstrainDevices=yes\n"},
		{"NodeName=n[1-4] Gres=gpu:4 CPUs=8 # nodes\nPartitionName=p Nodes=ALL Default=YES\n", "\x00", ""},
		{"SlurmctldParameters=\"enable_configless, x\"\n", "", ""},
		{"include\n", "", ""},
		{"include a b\n", "", ""},
		{"include [\n", "", ""},
		{"TaskPlugin\n", "", ""},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, slurmConf, cgroupConf, inc string) {
		files := memFiles{confDir + "/slurm.conf": slurmConf, incPath: inc}
		if cgroupConf != "\x00" {
			files[confDir+"/cgroup.conf"] = cgroupConf
		}
		before := heapAllocs()
		st, err := readSettings(files, confDir+"/slurm.conf")
		if a := heapAllocs() - before; a > allocBound(len(slurmConf)+len(cgroupConf)+len(inc)) {
			t.Fatalf("readSettings allocated %d bytes", a)
		}
		sl, serr := readLines(files, confDir+"/slurm.conf")
		cl, cerr := readLines(files, confDir+"/cgroup.conf")
		if _, ok := files[confDir+"/cgroup.conf"]; !ok {
			cl, cerr = nil, nil
		}
		if (err == nil) != (serr == nil && cerr == nil) {
			t.Fatalf("readSettings: %v; slurm.conf: %v; cgroup.conf: %v", err, serr, cerr)
		}
		if err != nil {
			return
		}
		if want := last(sl, "TaskPlugin"); st.TaskPlugin != want {
			t.Fatalf("TaskPlugin %q, lines say %q", st.TaskPlugin, want)
		}
		if want := strings.EqualFold(last(cl, "ConstrainDevices"), "yes"); st.ConstrainDevices != want {
			t.Fatalf("ConstrainDevices %v, lines say %q", st.ConstrainDevices, last(cl, "ConstrainDevices"))
		}
		for _, lines := range [][]Line{sl, cl} {
			checkRoundTrip(t, lines)
		}
	})
}

func last(lines []Line, key string) string {
	v := ""
	for _, l := range lines {
		if x, ok := l.Get(key); ok {
			v = x
		}
	}
	return v
}

// checkRoundTrip writes lines out as key=value (quoted where a value has
// white space: a line is trimmed of any, though only blanks and tabs split
// it) and reads them back.
func checkRoundTrip(t *testing.T, lines []Line) {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		for i, p := range l.Pairs {
			if strings.ContainsAny(p[0]+p[1], "\"#\n\r") || strings.ContainsAny(p[0], " \t=") || (i == 0 && strings.EqualFold(p[0], "include")) {
				return
			}
			if i > 0 {
				b.WriteByte(' ')
			}
			v := p[1]
			if strings.IndexFunc(v, unicode.IsSpace) >= 0 {
				v = `"` + v + `"`
			}
			b.WriteString(p[0] + "=" + v)
		}
		b.WriteByte('\n')
	}
	back, err := readLines(memFiles{"/x.conf": b.String()}, "/x.conf")
	if err != nil {
		t.Fatalf("written out as %q: %v", b.String(), err)
	}
	if len(back) != len(lines) {
		t.Fatalf("%d lines written out as %q read back as %d", len(lines), b.String(), len(back))
	}
	for i := range back {
		if !slices.Equal(back[i].Pairs, lines[i].Pairs) {
			t.Fatalf("line %v written out as %q read back as %v", lines[i].Pairs, b.String(), back[i].Pairs)
		}
	}
}

func readGresGPUs(fsys fileSystem, path, node string) ([]GPU, error) {
	g, err := readGres(fsys, path, node)
	return g.GPUs, err
}
