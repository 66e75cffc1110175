// SPDX-License-Identifier: Apache-2.0

package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		check   func(t *testing.T, c Config)
		wantErr []string
	}{
		{name: "empty file keeps defaults", body: "", check: func(t *testing.T, c Config) {
			if c.Socket != "/run/gpufence/agent.sock" || c.RequestTimeout.Duration != 5*time.Second || c.Mode != ModeAuto {
				t.Errorf("defaults changed: %+v", c)
			}
		}},
		{name: "values", body: "socket: /tmp/x.sock\nmode: per-cgroup\nrequest_timeout: 2s\nexempt_cgroups: [system]\n", check: func(t *testing.T, c Config) {
			if c.Socket != "/tmp/x.sock" || c.Mode != ModePerCgroup || c.RequestTimeout.Duration != 2*time.Second || len(c.ExemptCgroups) != 1 {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "unknown key named", body: "sockett: /x\n", wantErr: []string{"sockett"}},
		{name: "bad mode named with file", body: "mode: magic\n", wantErr: []string{"mode", "magic", "agent.yaml"}},
		{name: "bad duration", body: "request_timeout: soon\n", wantErr: []string{"soon"}},
		{name: "relative socket", body: "socket: run/x.sock\n", wantErr: []string{"socket"}},
		{name: "exempt job dir refused", body: "exempt_cgroups: [job_1]\n", wantErr: []string{"exempt_cgroups"}},
		{name: "two errors at once", body: "log_level: loud\nlog_format: xml\n", wantErr: []string{"log_level", "log_format"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c, ok := loadYAML(t, tt.body, tt.wantErr); ok {
				tt.check(t, c)
			}
		})
	}
}

// loadYAML writes body as an agent.yaml and loads it. With wantErr, Load
// must fail with an error naming each string; ok is then false, as it is
// after any failed check.
func loadYAML(t *testing.T, body string, wantErr []string) (c Config, ok bool) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p, true)
	if len(wantErr) > 0 {
		if err == nil {
			t.Errorf("%q: no error", body)
			return c, false
		}
		for _, w := range wantErr {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q does not name %q", body, err, w)
			}
		}
		return c, false
	}
	if err != nil {
		t.Errorf("%q: %v", body, err)
		return c, false
	}
	return c, true
}

func TestLoadMissing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "none.yaml")
	if _, err := Load(p, false); err != nil {
		t.Errorf("missing default file: %v", err)
	}
	if _, err := Load(p, true); err == nil {
		t.Error("missing explicit file gave no error")
	}
}

func TestDefaultSlurmConf(t *testing.T) {
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc/slurm/slurm.conf")
	opt := filepath.Join(dir, "opt/slurm/etc/slurm.conf")
	if err := os.MkdirAll(filepath.Dir(opt), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(opt, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, env, want string
	}{
		{"SLURM_CONF wins", "/x/slurm.conf", "/x/slurm.conf"},
		{"only ParallelCluster's exists", "", opt},
	} {
		if got := defaultSlurmConf(tc.env, []string{etc, opt}); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
	if err := os.MkdirAll(filepath.Dir(etc), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(etc, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := defaultSlurmConf("", []string{etc, opt}); got != etc {
		t.Errorf("both exist: got %s, want %s", got, etc)
	}
	if got := defaultSlurmConf("", []string{filepath.Join(dir, "none"), filepath.Join(dir, "none2")}); got != filepath.Join(dir, "none") {
		t.Errorf("none exists: got %s", got)
	}
}
