// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	sddaemon "github.com/coreos/go-systemd/v22/daemon"

	"github.com/gpufence/gpufence/agent/config"
	"github.com/gpufence/gpufence/agent/server"
)

// listen returns the socket handed over by systemd (socket activation:
// step launches during an agent restart queue in the socket's backlog
// instead of failing), or creates cfg.Socket itself.
func listen(cfg config.Config, log *slog.Logger) (ln *net.UnixListener, activated bool, err error) {
	lns, err := activation.Listeners()
	if err != nil {
		return nil, false, fmt.Errorf("socket activation: %w", err)
	}
	switch len(lns) {
	case 0:
		ln, err := server.Listen(cfg.Socket)
		return ln, false, err
	case 1:
		uln, ok := lns[0].(*net.UnixListener)
		if !ok {
			lns[0].Close()
			return nil, false, fmt.Errorf("socket activation: got a %s listener, want a unix stream socket", lns[0].Addr().Network())
		}
		addr := uln.Addr().String()
		if fi, err := os.Stat(addr); err == nil && fi.Mode().Perm()&0o077 != 0 {
			// SO_PEERCRED still refuses non-root peers; say it anyway.
			log.Warn("activated socket is accessible to other users; set SocketMode=0600", "socket", addr, "mode", fi.Mode().Perm())
		}
		if addr != cfg.Socket {
			log.Warn("activated socket differs from the configured one; the plugin's socket= must name it", "activated", addr, "configured", cfg.Socket)
		}
		uln.SetUnlinkOnClose(false) // systemd owns the socket file
		return uln, true, nil
	default:
		for _, l := range lns {
			l.Close()
		}
		return nil, false, fmt.Errorf("socket activation: got %d sockets, want one", len(lns))
	}
}

// notify tells systemd (Type=notify) about the agent's state; without
// NOTIFY_SOCKET it does nothing.
func notify(log *slog.Logger, state string) {
	if _, err := sddaemon.SdNotify(false, state); err != nil {
		log.Warn("sd_notify", "state", state, "err", err)
	}
}

// agentHealth is the agent's real state, for /healthz and the watchdog:
// the plugin's socket answers an exchange (server.Probe, on the address
// the agent serves, which is systemd's under socket activation), and the
// daemon's state can be taken (healthy returns: daemon.Healthy). Both
// within ctx.
func agentHealth(socket string, healthy func()) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		timeout := 2 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			timeout = time.Until(dl)
		}
		if err := server.Probe(socket, timeout); err != nil {
			return fmt.Errorf("the plugin socket does not serve: %w", err)
		}
		done := make(chan struct{})
		go func() { healthy(); close(done) }()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("the agent's state stayed locked: %w", ctx.Err())
		}
	}
}

// watchdog pings systemd's watchdog only while health passes, so an agent
// whose socket does not serve, or whose state is wedged, stops pinging and
// systemd restarts it.
func watchdog(ctx context.Context, health func(context.Context) error, log *slog.Logger) {
	interval, err := sddaemon.SdWatchdogEnabled(false)
	if err != nil || interval <= 0 {
		return
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			hctx, cancel := context.WithTimeout(ctx, interval/4)
			err := health(hctx)
			cancel()
			if err != nil {
				log.Error("watchdog not pinged: the agent cannot serve", "err", err)
				continue
			}
			notify(log, sddaemon.SdNotifyWatchdog)
		}
	}
}
