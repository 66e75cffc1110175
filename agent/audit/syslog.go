// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"
)

// facilityDaemon is syslog facility 3 (system daemons).
const facilityDaemon = 3

// syslogSink sends RFC 5424 messages: APP-NAME gpufence, MSGID the event,
// no structured data, and the JSON record as MSG. Datagram sockets carry one
// message per datagram; TCP uses octet counting (RFC 6587); TLS (RFC 5425)
// the same framing over a TLS connection whose server certificate is
// checked.
type syslogSink struct {
	network, addr string
	host          string
	conn          net.Conn
	tls           *tls.Config
}

// SyslogTLS configures a tls:// syslog target. The server's certificate is
// always checked: against CAFile (the system's roots when empty), for the
// target's host name (ServerName when set).
type SyslogTLS struct {
	CAFile, CertFile, KeyFile, ServerName string
}

func (o SyslogTLS) config(host string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	if o.ServerName != "" {
		c.ServerName = o.ServerName
	}
	if o.CAFile != "" {
		b, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("syslog TLS CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("syslog TLS CA: %s holds no PEM certificate", o.CAFile)
		}
		c.RootCAs = pool
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("syslog TLS: a client certificate needs both the certificate and the key file")
	}
	if o.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("syslog TLS client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

func openSyslog(target, node string, to SyslogTLS) (*syslogSink, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("syslog %q: %w", target, err)
	}
	s := &syslogSink{host: node}
	switch u.Scheme {
	case "unix", "unixgram":
		s.network, s.addr = "unixgram", u.Path
	case "tcp":
		s.network, s.addr = "tcp", u.Host
	case "tls":
		s.network, s.addr = "tcp", u.Host
		if s.addr != "" {
			if s.tls, err = to.config(u.Hostname()); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("syslog %q: scheme must be unix, unixgram, tcp or tls", target)
	}
	if s.addr == "" {
		return nil, fmt.Errorf("syslog %q: no address", target)
	}
	if s.host == "" {
		s.host, _ = os.Hostname()
	}
	// A collector that is down at start is not fatal: writes retry.
	_ = s.connect()
	return s, nil
}

func (s *syslogSink) connect() error {
	d := &net.Dialer{Timeout: 2 * time.Second}
	var c net.Conn
	var err error
	if s.tls != nil {
		c, err = tls.DialWithDialer(d, s.network, s.addr, s.tls)
	} else {
		c, err = d.Dial(s.network, s.addr)
	}
	if err != nil {
		return fmt.Errorf("connect to syslog %s %s: %w", s.network, s.addr, err)
	}
	s.conn = c
	return nil
}

func (s *syslogSink) Name() string { return "syslog" }

func (s *syslogSink) Write(r *Record) error {
	if s.conn == nil {
		if err := s.connect(); err != nil {
			return err
		}
	}
	msg, err := formatSyslog(r, s.host, os.Getpid())
	if err != nil {
		return err
	}
	if s.network == "tcp" {
		msg = append([]byte(fmt.Sprintf("%d ", len(msg))), msg...)
	}
	_ = s.conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := s.conn.Write(msg); err != nil {
		s.conn.Close()
		s.conn = nil
		return fmt.Errorf("send to syslog %s %s: %w", s.network, s.addr, err)
	}
	return nil
}

func (s *syslogSink) Close() error {
	if s.conn == nil {
		return nil
	}
	return s.conn.Close()
}

// formatSyslog renders one RFC 5424 message (without transport framing).
func formatSyslog(r *Record, host string, pid int) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode record %d: %w", r.Seq, err)
	}
	pri := facilityDaemon*8 + priority(r.Severity)
	ts := r.Time.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
	head := fmt.Sprintf("<%d>1 %s %s gpufence %d %s - ", pri, ts, header(host, 255), pid, header(string(r.Event), 32))
	return append([]byte(head), b...), nil
}

// header makes s a valid RFC 5424 header field: printable US-ASCII, no space.
func header(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if r < 33 || r > 126 {
			return '_'
		}
		return r
	}, s)
	if s == "" {
		return "-"
	}
	if len(s) > max {
		s = s[:max]
	}
	return s
}
