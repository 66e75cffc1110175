// Package plugintest builds the C SPANK entry (spank/plugin, which has no Go
// files of its own) and tests it: its renumbering logic, its exported
// symbols, and its callbacks driven by a fake Slurm against a fake agent.
package plugintest
