#!/usr/bin/env bash
# Runs every test of gpufence as root on this machine: unit tests, privileged
# tests against the real kernel, and end-to-end tests against a real Slurm.
# Installs what it needs first (tests/deps.sh). This is what .ci/run runs.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/deps.sh
make check-generated
make test-all
make fuzz FUZZTIME=10s
