// SPDX-License-Identifier: Apache-2.0

// Package version holds the build's version, stamped by the Makefile from git.
package version

// Version is set with -ldflags "-X github.com/gpufence/gpufence/agent/version.Version=...".
var Version = "dev"
