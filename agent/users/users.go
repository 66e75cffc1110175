// SPDX-License-Identifier: Apache-2.0

// Package users names uids for audit records and logs, from NSS (files,
// LDAP, SSSD), with a cache: a lookup can take as long as a directory
// takes to answer, so it is never made on a path that holds a lock a step
// waits for, and a failed lookup is remembered only briefly so that a
// directory that was down is asked again.
package users

import (
	"os/user"
	"strconv"
	"sync"
	"time"
)

// TTLs of a cached name.
const (
	FoundTTL  = time.Hour
	FailedTTL = 30 * time.Second
)

// Cache maps uids to names.
type Cache struct {
	mu    sync.Mutex
	names map[uint32]entry
	// Lookup is user.LookupId's name; tests replace it.
	Lookup func(uid uint32) (string, error)
	now    func() time.Time
}

type entry struct {
	name    string
	expires time.Time
}

func (c *Cache) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// Name returns uid's name, asking NSS when it is not cached or its entry
// expired; "" when NSS does not know it.
func (c *Cache) Name(uid uint32) string {
	if n, ok := c.lookupCache(uid); ok {
		return n
	}
	lookup := c.Lookup
	if lookup == nil {
		lookup = func(uid uint32) (string, error) {
			u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
			if err != nil {
				return "", err
			}
			return u.Username, nil
		}
	}
	name, err := lookup(uid)
	ttl := FoundTTL
	if err != nil {
		name, ttl = "", FailedTTL
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.names == nil {
		c.names = map[uint32]entry{}
	}
	c.names[uid] = entry{name: name, expires: c.clock().Add(ttl)}
	return name
}

// Cached returns uid's name only if it is cached, never asking NSS.
func (c *Cache) Cached(uid uint32) string {
	n, _ := c.lookupCache(uid)
	return n
}

func (c *Cache) lookupCache(uid uint32) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.names[uid]
	if !ok || c.clock().After(e.expires) {
		return e.name, false
	}
	return e.name, true
}

// Expire drops uid's cached name, so the next Name asks NSS.
func (c *Cache) Expire(uid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.names, uid)
}
