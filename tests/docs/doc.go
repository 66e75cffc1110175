// SPDX-License-Identifier: Apache-2.0

// Package docs checks that the documentation names what the code has:
// docs/architecture.md's component map against the packages `go list`
// finds.
package docs
