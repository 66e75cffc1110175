// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bufio"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

var rfc5424 = regexp.MustCompile(`^<(\d{1,3})>1 (\S+) (\S+) (\S+) (\S+) (\S+) (-|\[.*\]) (.*)$`)

// checkSyslog parses one RFC 5424 message and checks it carries rec.
func checkSyslog(t *testing.T, msg string, want Record) {
	t.Helper()
	m := rfc5424.FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("not an RFC 5424 message: %q", msg)
	}
	pri, _ := strconv.Atoi(m[1])
	if pri != facilityDaemon*8+priority(want.Severity) {
		t.Errorf("PRI %d for severity %s", pri, want.Severity)
	}
	if _, err := time.Parse(time.RFC3339Nano, m[2]); err != nil {
		t.Errorf("TIMESTAMP %q: %v", m[2], err)
	}
	if m[3] != "gpu-node-1" || m[4] != "gpufence" || m[6] != string(want.Event) || m[7] != "-" {
		t.Errorf("header: host %q app %q msgid %q sd %q", m[3], m[4], m[6], m[7])
	}
	if _, err := strconv.Atoi(m[5]); err != nil {
		t.Errorf("PROCID %q", m[5])
	}
	if err := validateLine(t, []byte(m[8])); err != nil {
		t.Errorf("MSG is not a valid record: %v", err)
	}
	if !strings.Contains(m[8], `"message":"`+want.Message+`"`) {
		t.Errorf("MSG does not carry the record: %s", m[8])
	}
}

func TestSyslogUnixgram(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.sock")
	srv, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	opts := testOptions(t)
	opts.File = ""
	opts.Syslog = "unixgram://" + path
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := sampleRecords()[3]
	p.Emit(want)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65536)
	srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := srv.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	checkSyslog(t, string(buf[:n]), want)
}

func TestSyslogTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		rd := bufio.NewReader(c)
		var msgs []string
		for {
			// RFC 6587 octet counting: "LEN SP MSG".
			l, err := rd.ReadString(' ')
			if err != nil {
				break
			}
			n, err := strconv.Atoi(strings.TrimSpace(l))
			if err != nil {
				msgs = append(msgs, "bad frame length "+l)
				break
			}
			b := make([]byte, n)
			if _, err := io.ReadFull(rd, b); err != nil {
				break
			}
			msgs = append(msgs, string(b))
		}
		got <- msgs
	}()
	opts := testOptions(t)
	opts.File = ""
	opts.Syslog = "tcp://" + ln.Addr().String()
	p, err := New(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	recs := sampleRecords()
	for _, r := range recs {
		p.Emit(r)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	msgs := <-got
	if len(msgs) != len(recs) {
		t.Fatalf("got %d messages, want %d: %q", len(msgs), len(recs), msgs)
	}
	for i, m := range msgs {
		r := recs[i]
		if r.Severity == "" {
			r.Severity = SeverityInfo
		}
		checkSyslog(t, m, r)
	}
}
