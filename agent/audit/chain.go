// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// The file sink chains the records of each agent run: a record's
// prev_hash is the hash of the record the sink wrote before it in the same
// run (the first record of a run links to RunStartHash(run_id)), and its
// hash is the SHA-256, in lower-case hex, of the line exactly as written
// without its final `,"hash":"..."` member. Removing, editing or moving a
// record breaks the chain at the record that follows it; gpufence audit
// verify names the first such record.

// hashPrefix starts how every chained line ends: `,"hash":"<64 hex>"}`.
const (
	hashPrefix = `,"hash":"`
	hashLen    = 64
)

// RunStartHash is the prev_hash of a run's first record.
func RunStartHash(runID string) string { return hashOf([]byte("gpufence audit run " + runID)) }

func validRunID(s string) bool { return len(s) == 32 && isHex(s) }

// chainLine encodes r with prev_hash set and returns the line (with its
// newline) and its hash. r is left unchanged.
func chainLine(r *Record, prev string) ([]byte, string, error) {
	c := *r
	c.PrevHash, c.Hash = prev, ""
	b, err := json.Marshal(c)
	if err != nil {
		return nil, "", err
	}
	h := hashOf(b)
	line := make([]byte, 0, len(b)+len(hashPrefix)+hashLen+3)
	line = append(line, b[:len(b)-1]...)
	line = append(line, hashPrefix...)
	line = append(line, h...)
	line = append(line, '"', '}', '\n')
	return line, h, nil
}

// splitHash takes a line (without newline) apart into the bytes the hash
// covers and the hash it names; ok is false when the line does not end in
// a hash member.
func splitHash(line []byte) (body []byte, hash string, ok bool) {
	n := len(line) - len(hashPrefix) - hashLen - 2
	if n < 1 || !bytes.HasSuffix(line, []byte(`"}`)) || !bytes.Equal(line[n:n+len(hashPrefix)], []byte(hashPrefix)) {
		return nil, "", false
	}
	hash = string(line[n+len(hashPrefix) : len(line)-2])
	if !isHex(hash) {
		return nil, "", false
	}
	body = make([]byte, 0, n+1)
	body = append(body, line[:n]...)
	body = append(body, '}')
	return body, hash, true
}

func isHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return s != ""
}

func hashOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// chainState is the file sink's position in its run's chain.
type chainState struct {
	run, last string
}

func (c *chainState) prev(runID string) string {
	if c.run != runID || c.last == "" {
		return RunStartHash(runID)
	}
	return c.last
}

func (c *chainState) advance(runID, hash string) {
	c.run, c.last = runID, hash
}
