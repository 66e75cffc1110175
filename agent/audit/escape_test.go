// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// hasControl reports whether s holds a byte or character a terminal may act
// on: C0, DEL, or a C1 control (raw or UTF-8 encoded).
func hasControl(s string) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return true
		}
		if r == utf8.RuneError && size == 1 && s[i] <= 0x9f {
			// A lone C1 byte: invalid UTF-8 that an 8-bit terminal takes
			// for a control.
			return true
		}
		i += size
	}
	return false
}

func TestEscape(t *testing.T) {
	for _, tc := range []struct{ in, escape, printable string }{
		{"python3", "python3", "python3"},
		{"", "", ""},
		{"a b", "a b", "a b"},
		{`back\slash`, `back\\slash`, `back\slash`},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`, `\x1b[31mred\x1b[0m`},
		{"tab\there\nnl\r", `tab\x09here\x0anl\x0d`, `tab\x09here\x0anl\x0d`},
		{"del\x7f", `del\x7f`, `del\x7f`},
		// C1 CSI, UTF-8 encoded and as a lone byte.
		{"csi\u009b2J", `csi\xc2\x9b2J`, `csi\xc2\x9b2J`},
		{"lone\x9b2J", `lone\x9b2J`, `lone\x9b2J`},
		{"bad\xff\xfe", `bad\xff\xfe`, `bad\xff\xfe`},
		// Bidi override, zero-width space, line separator, no-break space.
		{"a\u202eb\u200bc\u2028d\u00a0e", `a\xe2\x80\xaeb\xe2\x80\x8bc\xe2\x80\xa8d\xc2\xa0e`, `a\xe2\x80\xaeb\xe2\x80\x8bc\xe2\x80\xa8d\xc2\xa0e`},
		// Other scripts and symbols stay.
		{"训练-ü-λ-✓", "训练-ü-λ-✓", "训练-ü-λ-✓"},
		{"\ufffd", "\ufffd", "\ufffd"},
	} {
		if got := Escape(tc.in); got != tc.escape {
			t.Errorf("Escape(%q) = %q, want %q", tc.in, got, tc.escape)
		}
		if got := Printable(tc.in); got != tc.printable {
			t.Errorf("Printable(%q) = %q, want %q", tc.in, got, tc.printable)
		}
		for _, out := range []string{Escape(tc.in), Printable(tc.in)} {
			if hasControl(out) {
				t.Errorf("escaped %q still holds a control: %q", tc.in, out)
			}
		}
		back, err := unescape(Escape(tc.in))
		if err != nil || back != tc.in {
			t.Errorf("unescape(Escape(%q)) = %q, %v", tc.in, back, err)
		}
		// What Escape produced is shown unchanged.
		if got := Printable(Escape(tc.in)); got != Escape(tc.in) {
			t.Errorf("Printable(Escape(%q)) = %q, want it unchanged", tc.in, got)
		}
	}
	for _, bad := range []string{`a\`, `\q`, `\x1`, `\xzz`} {
		if _, err := unescape(bad); err == nil {
			t.Errorf("unescape(%q) accepted it", bad)
		}
	}
}

func TestTerminalSafeJSON(t *testing.T) {
	in := map[string]string{"comm": "x\u009b2J\u202e\x7f\U000e0001ok", "plain": "训练"}
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	raw = append(raw[:len(raw)-1], []byte(",\"bad\":\"\x9b\xff\"}")...)
	if !hasControl(string(raw)) {
		t.Fatalf("test input %q has no control to remove", raw)
	}
	out := TerminalSafeJSON(raw)
	if hasControl(string(out)) {
		t.Errorf("TerminalSafeJSON(%q) = %q: still holds a control", raw, out)
	}
	var a, b map[string]string
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, &b); err != nil {
		t.Fatalf("TerminalSafeJSON output %q is not JSON: %v", out, err)
	}
	for k := range a {
		if a[k] != b[k] {
			t.Errorf("%s: %q after, %q before", k, b[k], a[k])
		}
	}
	if !strings.Contains(string(out), "训练") || !strings.Contains(string(out), `\u009b`) {
		t.Errorf("TerminalSafeJSON = %s: want printable text kept and C1 escaped", out)
	}
	if plain := []byte(`{"a":"b"}`); string(TerminalSafeJSON(plain)) != string(plain) {
		t.Error("TerminalSafeJSON changed a plain document")
	}
}

// unescape returns the text Escape was given.
func unescape(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		switch {
		case i+1 < len(s) && s[i+1] == '\\':
			b.WriteByte('\\')
			i++
		case i+3 < len(s) && s[i+1] == 'x':
			c, err := strconv.ParseUint(s[i+2:i+4], 16, 8)
			if err != nil {
				return "", fmt.Errorf("unescape %q: bad \\x escape at byte %d", s, i)
			}
			b.WriteByte(byte(c))
			i += 3
		default:
			return "", fmt.Errorf("unescape %q: lone backslash at byte %d", s, i)
		}
	}
	return b.String(), nil
}
