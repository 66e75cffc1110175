// SPDX-License-Identifier: Apache-2.0

// Package plugintest builds the C SPANK entry (spank/plugin, which has no Go
// files of its own) and tests it: its exported symbols, and its callbacks
// driven by a fake Slurm against a fake agent. Its parsers (GPU lists,
// renumbering, plugstack arguments) are tested and fuzzed one by one in
// spank/internal/cparse.
package plugintest
