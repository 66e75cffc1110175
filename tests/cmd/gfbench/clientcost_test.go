// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

func TestParseClientCost(t *testing.T) {
	c, err := parseClientCost("1.8440 2.1750 1.5010\n")
	if err != nil || c.Median != 1.844 || c.P90 != 2.175 || c.CPU != 1.501 {
		t.Errorf("parseClientCost = %+v, %v", c, err)
	}
	for _, bad := range []string{"", "1 2", "1 2 x", "child failed: 256"} {
		if _, err := parseClientCost(bad); err == nil {
			t.Errorf("parseClientCost(%q) accepted", bad)
		}
	}
}

// The stand-in agent answers one framed request, sent in two pieces, with
// an empty message, and nothing before the whole request is in.
func TestStandInAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := standInAgent(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := append(protowire.AppendVarint(nil, 300), make([]byte, 300)...)
	if _, err := c.Write(msg[:100]); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	one := make([]byte, 8)
	if n, err := c.Read(one); err == nil {
		t.Fatalf("answered %d bytes before the request was complete", n)
	}
	if _, err := c.Write(msg[100:]); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(one)
	if err != nil || n != 1 || one[0] != 0 {
		t.Errorf("answer %x, %v; want one zero byte (an empty frame)", one[:n], err)
	}
}
