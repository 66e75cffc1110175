#!/usr/bin/env bash
# Runs every test of gpufence as root on this machine: unit tests, privileged
# tests against the real kernel, and end-to-end tests against a real Slurm:
# the whole suite on Debian 12's 22.05 (`make test-all`), then the isolation
# core again on each release in GPUFENCE_CI_SLURM, on that release's own
# daemons (built from source once per machine: tests/slurmrel). Installs what
# it needs first (tests/deps.sh). This is what .ci/run runs.
#
# GPUFENCE_CI_SLURM: the releases (tests/slurmrel selections) run after
#   22.05; empty: 22.05 only. Default 25.11+pcluster: ParallelCluster 3.16's
#   release in ParallelCluster's layout (/opt/slurm, its gres.conf), a
#   source build of about 6 min on 2 cores, within CI's budget; the other
#   releases are `make e2e-matrix`'s (README.md, docs/parallelcluster.md).
# GPUFENCE_CI_SLURM_RUN: go test -run for those releases (default: the
#   isolation scenarios, both ConstrainDevices modes, the release's layout
#   and device program, agent down, and issue 18's attacks on the node
#   around the filter and shard/mps jobs; issue 19's multi-node cluster
#   (on the release's multislurmd build, prepared below), ConstrainDevices
#   differential suite and pyxis/enroot jobs); empty: the whole suite.
#   Apptainer and task_binding run on 22.05 only (make test-all).
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/deps.sh
# The Slurm release tarballs from the offline mirror beside the checkout
# (packaging/release-headers.sh would fetch them from GitHub otherwise):
# for `make package` in the VM upgrade test; the Go tests find it themselves.
if [ -z "${SLURM_SRC_DIR:-}" ] && [ -f ../shared/slurm-src/SHA256SUMS ]; then
	SLURM_SRC_DIR=$(cd ../shared/slurm-src && pwd)
	export SLURM_SRC_DIR
fi
releases=${GPUFENCE_CI_SLURM-25.11+pcluster}
run=${GPUFENCE_CI_SLURM_RUN-'^TestPrivileged(Isolation|ConstrainDevices|ReleaseLayout|SlurmDeviceProgramAttached|InteractiveStep|AgentDown|AttackMetricsExhaustion|PluginSocketSurvivesEMFILE|HealthzSocketActivated|AttackMetricsLeakAuthenticated|PlantedScopeE2E|AttackAdoptSlowSlurmctld|AttackExeSpoof|SbcastForeignGPU|SharedGPUs|MultiNode|ConstrainDevicesOracle|PyxisEnroot)$'}
t0=$SECONDS
if [ -n "$releases" ]; then
	# The source builds first, alone (a build uses every core), so that no
	# test runs next to one.
	# -multislurmd: the multi-node cluster runs several slurmd on one host,
	# which needs each source release's multiple-slurmd build too.
	go run ./tests/cmd/gfmatrix -prepare -multislurmd $releases
	echo "all: Slurm $releases ready in $((SECONDS - t0)) s" >&2
fi
# enroot and Apptainer from their release sources, once per machine
# (tests/containers; pyxis is built per release by the tests, in seconds).
t1=$SECONDS
go run ./tests/cmd/gfmatrix -prepare -containers 22.05
echo "all: container runtimes ready in $((SECONDS - t1)) s" >&2
make check-generated
t1=$SECONDS
make test-all
echo "all: test-all (unit, privileged, package, end-to-end on 22.05) took $((SECONDS - t1)) s" >&2
if [ -n "$releases" ]; then
	t1=$SECONDS
	go run ./tests/cmd/gfmatrix -out build/ci-matrix.json ${run:+-run "$run"} $releases
	echo "all: end-to-end on $releases took $((SECONDS - t1)) s" >&2
fi
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
echo "all: everything took $((SECONDS - t0)) s" >&2
