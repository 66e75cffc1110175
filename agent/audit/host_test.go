// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeIMDS stands in for EC2's metadata service at a local address: IMDSv2
// only (a GET without a token from its PUT is refused, as on an instance
// with HttpTokens=required).
func fakeIMDS(t *testing.T, id string, delay time.Duration) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	const token = "AQAEAFakeToken=="
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		time.Sleep(delay)
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			if r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
				http.Error(w, "missing ttl", http.StatusBadRequest)
				return
			}
			w.Write([]byte(token))
		case r.Method == http.MethodGet && r.URL.Path == "/latest/meta-data/instance-id":
			if r.Header.Get("X-aws-ec2-metadata-token") != token {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			w.Write([]byte(id))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func machineIDFile(t *testing.T, content string) string {
	f := filepath.Join(t.TempDir(), "machine-id")
	must(t, os.WriteFile(f, []byte(content), 0o644))
	return f
}

func TestHostIdentityIMDSv2(t *testing.T) {
	srv, calls := fakeIMDS(t, "i-0123456789abcdef0", 0)
	mid := machineIDFile(t, "4f6a0c0e3a9b4f2a8d5e6c7b8a9f0e1d\n")
	h, err := HostIdentity(HostOptions{MachineIDFile: mid, IMDS: IMDSOn, IMDSEndpoint: srv.URL})
	if h.EC2InstanceID != "i-0123456789abcdef0" || h.MachineID != "4f6a0c0e3a9b4f2a8d5e6c7b8a9f0e1d" || h.FQDN == "" {
		t.Fatalf("host %+v (err %v)", h, err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d requests to IMDS, want 2 (PUT token, GET instance-id)", n)
	}
	// Records carry it, and the schema accepts them.
	opts := testOptions(t)
	opts.Host = h
	p, err := New(opts, nil)
	must(t, err)
	p.Emit(sampleRecords()[0])
	must(t, p.Close())
	recs := readRecords(t, opts.File)
	if len(recs) != 1 || recs[0].Host == nil || *recs[0].Host != h {
		t.Fatalf("records %+v, want host %+v", recs, h)
	}
}

func TestHostIdentityBounded(t *testing.T) {
	// A metadata service that answers too late: given up within the
	// timeout, the rest still learnt.
	slow, _ := fakeIMDS(t, "i-0123456789abcdef0", 1500*time.Millisecond)
	mid := machineIDFile(t, "4f6a0c0e3a9b4f2a8d5e6c7b8a9f0e1d\n")
	start := time.Now()
	h, err := HostIdentity(HostOptions{MachineIDFile: mid, IMDS: IMDSOn, IMDSEndpoint: slow.URL, Timeout: 300 * time.Millisecond})
	if took := time.Since(start); took > time.Second {
		t.Errorf("took %s with a 300ms timeout", took)
	}
	if h.EC2InstanceID != "" || h.MachineID == "" || err == nil || !strings.Contains(err.Error(), "EC2 instance id from IMDSv2 at "+slow.URL) {
		t.Fatalf("slow IMDS: host %+v, err %v", h, err)
	}
	// Nothing listening.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := l.Addr().String()
	l.Close()
	if h, err := HostIdentity(HostOptions{MachineIDFile: mid, IMDS: IMDSOn, IMDSEndpoint: "http://" + addr}); h.EC2InstanceID != "" || err == nil {
		t.Fatalf("no IMDS: host %+v, err %v", h, err)
	}
	// An answer that is not an instance id is not taken.
	bad, _ := fakeIMDS(t, "i-0123\x1b[2J", 0)
	if h, err := HostIdentity(HostOptions{MachineIDFile: mid, IMDS: IMDSOn, IMDSEndpoint: bad.URL}); h.EC2InstanceID != "" || err == nil || !strings.Contains(err.Error(), "not i-<hex>") {
		t.Fatalf("bad id: host %+v, err %v", h, err)
	}
}

func TestHostIdentityOffAndAuto(t *testing.T) {
	srv, calls := fakeIMDS(t, "i-0123456789abcdef0", 0)
	mid := machineIDFile(t, "not a machine id\n")
	h, err := HostIdentity(HostOptions{MachineIDFile: mid, IMDS: IMDSOff, IMDSEndpoint: srv.URL})
	if h.EC2InstanceID != "" || h.MachineID != "" || err == nil || !strings.Contains(err.Error(), "not 32 hex digits") {
		t.Fatalf("off: host %+v, err %v", h, err)
	}
	// auto with firmware that is not EC2's.
	dmi := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dmi, "sys_vendor"), []byte("QEMU\n"), 0o644))
	HostIdentity(HostOptions{MachineIDFile: mid, IMDS: IMDSAuto, IMDSEndpoint: srv.URL, DMIDir: dmi})
	if n := calls.Load(); n != 0 && !onEC2(dmi) {
		t.Fatalf("IMDS asked %d times with ec2_instance_id off/auto off EC2", n)
	}
	must(t, os.WriteFile(filepath.Join(dmi, "sys_vendor"), []byte("Amazon EC2\n"), 0o644))
	if h, _ := HostIdentity(HostOptions{MachineIDFile: mid, IMDS: IMDSAuto, IMDSEndpoint: srv.URL, DMIDir: dmi}); h.EC2InstanceID != "i-0123456789abcdef0" {
		t.Fatalf("auto on EC2 firmware: host %+v", h)
	}
}
