// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

// writeWebConfig writes a throw-away exporter-toolkit web configuration
// with one basic-auth user and returns its path.
func writeWebConfig(t *testing.T, user, password string) string {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "web.yaml")
	if err := os.WriteFile(p, []byte("basic_auth_users:\n  "+user+": "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The leak, closed: without a web configuration /metrics names no job and
// no user; with one, a scraper without the password or with a wrong one
// gets 401 and no series, and the one with the right password gets the
// per-job series.
func TestServeWebConfig(t *testing.T) {
	e := populated(t)
	web := writeWebConfig(t, "prometheus", "s3cret-for-this-test")
	if err := CheckWebConfig(web); err != nil {
		t.Fatalf("CheckWebConfig: %v", err)
	}
	serve := func(webConfig string) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- Serve(ctx, ln, e.Handler(nil, webConfig != ""), webConfig, slog.New(slog.NewTextHandler(io.Discard, nil)))
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
		return "http://" + ln.Addr().String() + "/metrics"
	}
	scrape := func(url, user, password string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const jobSeries = populatedJobSeries

	open := serve("")
	code, body := scrape(open, "", "")
	if code != 200 || !strings.Contains(body, "gpufence_gpus_allocated 1") {
		t.Errorf("unauthenticated scrape without web_config: %d, no aggregates", code)
	}
	for _, leak := range []string{"job_id=", "user=", "\nprocess_open_fds"} {
		if strings.Contains(body, leak) {
			t.Errorf("unauthenticated scrape without web_config serves %q", leak)
		}
	}

	authed := serve(web)
	for _, tc := range []struct{ name, user, password string }{
		{"no credentials", "", ""},
		{"wrong password", "prometheus", "guess"},
		{"unknown user", "root", "s3cret-for-this-test"},
	} {
		code, body := scrape(authed, tc.user, tc.password)
		if code != http.StatusUnauthorized || strings.Contains(body, "gpufence_") {
			t.Errorf("%s: %d, want 401 and no series:\n%s", tc.name, code, body)
		}
	}
	code, body = scrape(authed, "prometheus", "s3cret-for-this-test")
	if code != 200 || !strings.Contains(body, jobSeries) || !strings.Contains(body, "\nprocess_open_fds") {
		t.Errorf("authenticated scrape: %d, no per-job series %q", code, jobSeries)
	}
}

func TestCheckWebConfig(t *testing.T) {
	good := writeWebConfig(t, "prometheus", "pw")
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	goodBody, _ := os.ReadFile(good)
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "none.yaml"), "no such file"},
		{"no authentication", write("tls-only.yaml", "http_server_config:\n  http2: false\n", 0o600), "authenticates no scraper"},
		{"empty user list", write("nousers.yaml", "basic_auth_users: {}\n", 0o600), "authenticates no scraper"},
		{"not a bcrypt hash", write("plain.yaml", "basic_auth_users:\n  prometheus: hunter2\n", 0o600), "plain.yaml"},
		{"unknown key", write("typo.yaml", "basic_auth_user:\n  prometheus: x\n", 0o600), "basic_auth_user"},
		{"writable by others", write("open.yaml", string(goodBody), 0o666), "writable by group or others"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckWebConfig(tc.path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CheckWebConfig: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
