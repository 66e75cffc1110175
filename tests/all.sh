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
# The live upgrade and restart test in a throw-away systemd VM (emulated, so
# slow: tests/vm/README.md). GPUFENCE_VM_UPGRADE=ci: the .deb with 20-step
# bursts (about 7 min); full: deb and rpm with 100-step bursts (about 40 min);
# unset or off: not run.
case ${GPUFENCE_VM_UPGRADE:-off} in
ci) make vm-upgrade-ci ;;
full) make vm-upgrade-test ;;
off) ;;
*) echo "GPUFENCE_VM_UPGRADE=$GPUFENCE_VM_UPGRADE: want ci, full or off" >&2; exit 2 ;;
esac
