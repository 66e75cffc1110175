// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
	"gopkg.in/yaml.v3"
)

// Timeouts of the endpoint. Short, because every local user can connect:
// a connection that sends no request, or keeps one idle, gives its place
// back within seconds (a scraper sends its request at once, and one that
// comes back later than IdleTimeout simply reconnects).
const (
	readHeaderTimeout = 3 * time.Second
	readTimeout       = 5 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 15 * time.Second
)

// Serve answers HTTP on ln with h until ctx ends, then shuts down, giving
// scrapes in flight up to five seconds. webConfig, when set, is an
// exporter-toolkit web configuration file (TLS, client certificates, basic
// auth with bcrypt hashes) that every request must pass; CheckWebConfig
// has vetted it.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, webConfig string, log *slog.Logger) error {
	log = log.With("component", "metrics")
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		// A header block is a few hundred bytes from a scraper.
		MaxHeaderBytes: 16 << 10,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() {
		if webConfig == "" {
			errc <- srv.Serve(ln)
			return
		}
		// Serve reads only the config file of the flags; the listener is ours.
		errc <- web.Serve(ln, srv, &web.FlagConfig{WebConfigFile: &webConfig}, log)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// CheckWebConfig vets a metrics.web_config file before the agent serves
// anything: exporter-toolkit's own validation (strict YAML, bcrypt hashes,
// certificates that load), and two rules of ours. The file must
// authenticate every scraper (basic_auth_users, or client certificates
// with client_auth_type RequireAndVerifyClientCert), since it is what
// unlocks the per-job series; TLS without either would hand them to
// anyone. And only root may change it (owned by root, not writable by
// group or others): whoever writes it chooses who reads those series.
func CheckWebConfig(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not root", path, st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by group or others (mode %#o)", path, fi.Mode().Perm())
	}
	if err := web.Validate(path); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var c struct {
		TLS struct {
			ClientAuth string `yaml:"client_auth_type"`
		} `yaml:"tls_server_config"`
		Users map[string]string `yaml:"basic_auth_users"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if len(c.Users) == 0 && c.TLS.ClientAuth != "RequireAndVerifyClientCert" {
		return fmt.Errorf("%s authenticates no scraper: set basic_auth_users, or tls_server_config with client_auth_type: RequireAndVerifyClientCert (per-job series are served to whoever passes it)", path)
	}
	return nil
}
