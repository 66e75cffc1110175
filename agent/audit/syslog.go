// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"encoding/json"
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
// message per datagram; TCP uses octet counting (RFC 6587).
type syslogSink struct {
	network, addr string
	host          string
	conn          net.Conn
}

func openSyslog(target, node string) (*syslogSink, error) {
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
	default:
		return nil, fmt.Errorf("syslog %q: scheme must be unix, unixgram or tcp", target)
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
	c, err := net.DialTimeout(s.network, s.addr, 2*time.Second)
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
