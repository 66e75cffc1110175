// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Host names the machine a record comes from beyond the Slurm node name,
// which ParallelCluster gives to each new EC2 instance of a slot again.
type Host struct {
	// MachineID is /etc/machine-id (32 hex digits).
	MachineID string `json:"machine_id,omitempty"`
	// FQDN is the host's canonical DNS name (the host name when DNS has
	// none).
	FQDN string `json:"fqdn,omitempty"`
	// EC2InstanceID is the EC2 instance id, from IMDSv2.
	EC2InstanceID string `json:"ec2_instance_id,omitempty"`
}

func (h Host) zero() bool { return h == Host{} }

// IMDS modes of HostOptions.IMDS.
const (
	IMDSAuto = "auto" // ask IMDS only where the firmware says EC2
	IMDSOn   = "on"   // always ask (still at most Timeout)
	IMDSOff  = "off"  // never ask
)

// DefaultIMDSEndpoint is EC2's instance metadata service.
const DefaultIMDSEndpoint = "http://169.254.169.254"

// HostOptions says where HostIdentity looks.
type HostOptions struct {
	// MachineIDFile defaults to /etc/machine-id.
	MachineIDFile string
	// IMDS is IMDSAuto (default), IMDSOn or IMDSOff.
	IMDS string
	// IMDSEndpoint defaults to DefaultIMDSEndpoint.
	IMDSEndpoint string
	// Timeout bounds the whole look-up, DNS and IMDS together (default 1s).
	Timeout time.Duration
	// DMIDir is where the firmware's vendor strings are (default
	// /sys/class/dmi/id), for IMDSAuto.
	DMIDir string
}

var (
	machineIDRe  = regexp.MustCompile(`^[0-9a-f]{32}$`)
	instanceIDRe = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)
)

// HostIdentity reads the machine id, the FQDN and, on EC2, the instance id
// (IMDSv2: a PUT for a token, then a GET), all within o.Timeout; what it
// could not learn is left empty and explained in the returned error.
func HostIdentity(o HostOptions) (Host, error) {
	if o.MachineIDFile == "" {
		o.MachineIDFile = "/etc/machine-id"
	}
	if o.IMDS == "" {
		o.IMDS = IMDSAuto
	}
	if o.IMDSEndpoint == "" {
		o.IMDSEndpoint = DefaultIMDSEndpoint
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.DMIDir == "" {
		o.DMIDir = "/sys/class/dmi/id"
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	var h Host
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	if b, err := os.ReadFile(o.MachineIDFile); err != nil {
		fail(fmt.Errorf("machine id: %w", err))
	} else if id := strings.TrimSpace(string(b)); !machineIDRe.MatchString(id) {
		fail(fmt.Errorf("machine id: %s holds %q, not 32 hex digits", o.MachineIDFile, Printable(id)))
	} else {
		h.MachineID = id
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		fqdn, err := lookupFQDN(ctx)
		if err != nil {
			fail(fmt.Errorf("fqdn: %w", err))
		}
		mu.Lock()
		h.FQDN = fqdn
		mu.Unlock()
	}()
	if o.IMDS == IMDSOn || (o.IMDS == IMDSAuto && onEC2(o.DMIDir)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := imdsInstanceID(ctx, o.IMDSEndpoint)
			if err != nil {
				fail(fmt.Errorf("EC2 instance id from IMDSv2 at %s: %w", o.IMDSEndpoint, err))
				return
			}
			mu.Lock()
			h.EC2InstanceID = id
			mu.Unlock()
		}()
	}
	wg.Wait()
	return h, errors.Join(errs...)
}

// lookupFQDN is what hostname -f prints: the canonical name of the host
// name, or the host name when DNS has none.
func lookupFQDN(ctx context.Context) (string, error) {
	name, err := os.Hostname()
	if err != nil {
		return "", err
	}
	name = Printable(name)
	cname, err := net.DefaultResolver.LookupCNAME(ctx, name)
	if err != nil {
		return name, fmt.Errorf("canonical name of %s: %w (the host name is used)", name, err)
	}
	if c := Printable(strings.TrimSuffix(cname, ".")); c != "" {
		return c, nil
	}
	return name, nil
}

// onEC2 says whether the firmware names Amazon EC2 (Nitro and Xen).
func onEC2(dmi string) bool {
	for _, f := range []string{"sys_vendor", "board_vendor", "bios_vendor"} {
		if b, err := os.ReadFile(dmi + "/" + f); err == nil && strings.Contains(string(b), "Amazon EC2") {
			return true
		}
	}
	if b, err := os.ReadFile("/sys/hypervisor/uuid"); err == nil && strings.HasPrefix(strings.ToLower(string(b)), "ec2") {
		return true
	}
	return false
}

func imdsInstanceID(ctx context.Context, endpoint string) (string, error) {
	// No proxy: the metadata service is link-local, and a proxy from the
	// environment must not see the token.
	c := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer c.CloseIdleConnections()
	do := func(method, path string, hdr map[string]string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(endpoint, "/")+path, nil)
		if err != nil {
			return "", err
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s %s: %s", method, path, resp.Status)
		}
		return strings.TrimSpace(string(b)), nil
	}
	token, err := do(http.MethodPut, "/latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60"})
	if err != nil {
		return "", err
	}
	id, err := do(http.MethodGet, "/latest/meta-data/instance-id", map[string]string{"X-aws-ec2-metadata-token": token})
	if err != nil {
		return "", err
	}
	if !instanceIDRe.MatchString(id) {
		return "", fmt.Errorf("instance id %q is not i-<hex>", Printable(id))
	}
	return id, nil
}
