#!/usr/bin/env bash
# Starts a local single-node Slurm with 4 fake GPUs, the gpufence agent and
# plugin, and shows isolation and the audit log; then removes all of it.
# Installs what it needs first (tests/deps.sh). Run as root.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/deps.sh
make demo
