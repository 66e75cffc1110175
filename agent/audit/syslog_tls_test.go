// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA makes a throw-away CA and a server certificate it signs for
// names, written as PEM files in dir; it returns the CA's file and the
// server's certificate and key files.
func testCA(t *testing.T, dir, prefix string, names ...string) (ca, cert, key string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: prefix + " test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	must(t, err)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			srvTmpl.IPAddresses = append(srvTmpl.IPAddresses, ip)
		} else {
			srvTmpl.DNSNames = append(srvTmpl.DNSNames, n)
		}
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	must(t, err)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	must(t, err)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, prefix+"-"+name)
		must(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}

// startRsyslog runs a throw-away rsyslogd (Debian's, with rsyslog-gnutls)
// that takes RFC 5425 syslog over TLS on a free local port and writes each
// message's raw text to out. It is stopped by its PID.
func startRsyslog(t *testing.T, dir, cert, key, ca string) (port int, out string) {
	t.Helper()
	bin, err := exec.LookPath("rsyslogd")
	if err != nil {
		t.Skip("no rsyslogd (apt-get install rsyslog rsyslog-gnutls)")
	}
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/rsyslog/lmnsd_gtls.so"); err != nil {
		if m, _ := filepath.Glob("/usr/lib/*/rsyslog/lmnsd_gtls.so"); len(m) == 0 {
			t.Skip("no rsyslog-gnutls (lmnsd_gtls.so)")
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	out = filepath.Join(dir, "received.log")
	conf := filepath.Join(dir, "rsyslog.conf")
	must(t, os.WriteFile(conf, []byte(fmt.Sprintf(`global(workDirectory=%q
  DefaultNetstreamDriver="gtls"
  DefaultNetstreamDriverCAFile=%q
  DefaultNetstreamDriverCertFile=%q
  DefaultNetstreamDriverKeyFile=%q)
module(load="imtcp" StreamDriver.Name="gtls" StreamDriver.Mode="1" StreamDriver.AuthMode="anon")
input(type="imtcp" address="127.0.0.1" port="%d")
template(name="raw" type="string" string="%%rawmsg%%\n")
action(type="omfile" file=%q template="raw" flushOnTXEnd="on" asyncWriting="off")
`, dir, ca, cert, key, port, out)), 0o600))
	cmd := exec.Command(bin, "-n", "-f", conf, "-i", filepath.Join(dir, "rsyslogd.pid"))
	var logb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logb, &logb
	must(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("rsyslogd output:\n%s", logb.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rsyslogd does not listen on %d: %v\n%s", port, err, logb.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return port, out
}

func TestSyslogTLSToRsyslog(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := testCA(t, dir, "good", "localhost", "127.0.0.1")
	port, out := startRsyslog(t, dir, cert, key, ca)
	otherCA, _, _ := testCA(t, dir, "other", "localhost")

	send := func(target string, tlsOpts SyslogTLS, msg string) SinkStats {
		t.Helper()
		opts := testOptions(t)
		opts.File = ""
		opts.Syslog = target
		opts.SyslogTLS = tlsOpts
		p, err := New(opts, nil)
		must(t, err)
		r := sampleRecords()[0]
		r.Message = msg
		p.Emit(r)
		must(t, p.Close())
		return p.Stats().Sinks["syslog"]
	}
	// A CA that did not sign the server's certificate: nothing is sent.
	if st := send(fmt.Sprintf("tls://127.0.0.1:%d", port), SyslogTLS{CAFile: otherCA}, "to an unknown CA"); st.Written != 0 || st.Failed == 0 {
		t.Fatalf("server certificate of another CA accepted: %+v", st)
	}
	// A name the certificate does not carry.
	if st := send(fmt.Sprintf("tls://127.0.0.1:%d", port), SyslogTLS{CAFile: ca, ServerName: "collector.example.org"}, "to the wrong name"); st.Written != 0 || st.Failed == 0 {
		t.Fatalf("server certificate for another name accepted: %+v", st)
	}
	// The right CA, by name and by address.
	for _, target := range []string{fmt.Sprintf("tls://localhost:%d", port), fmt.Sprintf("tls://127.0.0.1:%d", port)} {
		if st := send(target, SyslogTLS{CAFile: ca}, "over TLS to "+target); st.Written != 1 {
			t.Fatalf("%s: %+v", target, st)
		}
	}
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(out)
		got = strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(got) >= 2 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(got) != 2 {
		t.Fatalf("rsyslog received %d messages, want 2: %q", len(got), got)
	}
	for i, target := range []string{fmt.Sprintf("tls://localhost:%d", port), fmt.Sprintf("tls://127.0.0.1:%d", port)} {
		want := sampleRecords()[0]
		want.Message = "over TLS to " + target
		checkSyslog(t, got[i], want)
	}
}

func TestSyslogTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	must(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	for _, tc := range []struct {
		o    SyslogTLS
		want string
	}{
		{SyslogTLS{CAFile: filepath.Join(dir, "none.pem")}, "syslog TLS CA: open"},
		{SyslogTLS{CAFile: notPEM}, "holds no PEM certificate"},
		{SyslogTLS{CertFile: notPEM}, "needs both the certificate and the key"},
	} {
		opts := testOptions(t)
		opts.File, opts.Syslog, opts.SyslogTLS = "", "tls://127.0.0.1:6514", tc.o
		if _, err := New(opts, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}
