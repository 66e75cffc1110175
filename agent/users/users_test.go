// SPDX-License-Identifier: Apache-2.0

package users

import (
	"errors"
	"testing"
	"time"
)

func TestCache(t *testing.T) {
	now := time.Unix(1e9, 0)
	fail := true
	calls := 0
	c := &Cache{now: func() time.Time { return now }, Lookup: func(uid uint32) (string, error) {
		calls++
		if fail {
			return "", errors.New("LDAP down")
		}
		return "alice", nil
	}}
	if n := c.Name(1000); n != "" || calls != 1 {
		t.Fatalf("failing lookup: %q after %d calls", n, calls)
	}
	c.Name(1000)
	if calls != 1 {
		t.Errorf("a failure was asked again within %v: %d calls", FailedTTL, calls)
	}
	fail = false
	now = now.Add(FailedTTL + time.Second)
	if n := c.Name(1000); n != "alice" || calls != 2 {
		t.Errorf("after the failure expired: %q, %d calls", n, calls)
	}
	now = now.Add(FoundTTL - time.Minute)
	if n := c.Name(1000); n != "alice" || calls != 2 {
		t.Errorf("a found name was asked again within %v: %d calls", FoundTTL, calls)
	}
	if n := c.Cached(1001); n != "" || calls != 2 {
		t.Errorf("Cached asked NSS: %q, %d calls", n, calls)
	}
	if n := c.Cached(1000); n != "alice" {
		t.Errorf("Cached(1000) = %q", n)
	}
}

func TestRealLookup(t *testing.T) {
	var c Cache
	if n := c.Name(0); n != "root" {
		t.Errorf("uid 0 = %q, want root", n)
	}
}
