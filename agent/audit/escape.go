// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A job user chooses its process names (prctl(PR_SET_NAME)), the names and
// paths of its programs, its job name and its working directory. None of
// that may reach an administrator's terminal raw: an ESC sequence can
// rewrite the screen, hide a line or fake one. The functions below are the
// one place that decides what is printable.

// printableRune says whether r may be shown as it is: letters, marks,
// numbers, punctuation and symbols of any script, and the ASCII space.
// Controls (C0, DEL, C1), format characters (bidi overrides, zero-width
// joiners), other spaces and line or paragraph separators are not.
func printableRune(r rune) bool { return unicode.IsPrint(r) }

// Escape makes text from an untrusted source (a process name, a path) safe
// to store and to print without losing what it was: a backslash becomes
// `\\`, and each byte of a character that is not printable, or of invalid
// UTF-8, becomes `\xNN`. Printable text of any script is kept as it is.
// `\\` and `\xNN` are its only escapes, so a reader can reverse it
// (docs/audit.md). The result holds no control character.
func Escape(s string) string { return escape(s, true) }

// Printable makes text safe for a terminal: as Escape, but a backslash is
// kept, so that text Escape produced is shown unchanged. It is for display
// and for text that need not be reversible (messages, errors).
func Printable(s string) string { return escape(s, false) }

func escape(s string, reversible bool) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || (reversible && c == '\\') {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '\\' && reversible:
			b.WriteString(`\\`)
		case (r == utf8.RuneError && size == 1) || !printableRune(r):
			for _, c := range []byte(s[i : i+size]) {
				fmt.Fprintf(&b, `\x%02x`, c)
			}
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// TerminalSafeJSON rewrites a valid JSON document so that printing it
// cannot drive a terminal, without changing what it means: every character
// that is not printable is written as a \u escape. (encoding/json already
// escapes C0 controls inside strings, but neither DEL nor C1 controls nor
// bidi overrides; outside strings valid JSON holds only printable ASCII
// and white space.) Invalid UTF-8 becomes \ufffd, as a JSON reader would
// read it anyway.
func TerminalSafeJSON(doc []byte) []byte {
	clean := true
	for _, c := range doc {
		if c >= 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return doc
	}
	out := make([]byte, 0, len(doc)+16)
	for i := 0; i < len(doc); {
		r, size := utf8.DecodeRune(doc[i:])
		switch {
		case r < 0x7f:
			out = append(out, doc[i])
		case r == utf8.RuneError && size == 1:
			out = append(out, `\ufffd`...)
		case printableRune(r):
			out = append(out, doc[i:i+size]...)
		case r > 0xffff:
			r1, r2 := utf16Pair(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += size
	}
	return out
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}
