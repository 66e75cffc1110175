#!/usr/bin/env bash
# Checks gpufence against a real NVIDIA GPU (see tests/gpu/README.md):
#  1. `gpufence inventory` matches nvidia-smi (index, minor, UUID, bus id, name);
#  2. a process in a cgroup whose device filter allows no GPU cannot open or
#     use GPU 0 (open, NVML, CUDA, nvidia-smi), and with GPU 0 allowed it can.
# Run as root from anywhere: tests/gpu/run.sh. Exit 0 passed, 1 failed,
# 77 skipped (no NVIDIA driver, or the kernel/cgroups cannot run the check).
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

SKIP=77
start=$SECONDS
skip() { echo "SKIP: $*"; exit "$SKIP"; }
die() { echo "FAIL: $*"; exit 1; }

[ -d /proc/driver/nvidia ] || skip "no NVIDIA driver (/proc/driver/nvidia absent)"
command -v nvidia-smi >/dev/null || skip "no NVIDIA driver (nvidia-smi not found)"
smi_list=$(nvidia-smi -L 2>&1) || die "the NVIDIA driver is there but nvidia-smi -L fails: $smi_list"
[ "$(id -u)" = 0 ] || die "run as root: the isolation check creates a cgroup and loads a BPF program"

work=$(mktemp -d /tmp/gpufence-gpu.XXXXXX)
trap 'rm -rf "$work"' EXIT
trap 'echo "interrupted"; exit 130' INT TERM

# A gpufence that can load NVML must be built with cgo, as `make build` and
# the packages build it; one built with CGO_ENABLED=0 reports "built without cgo".
nvml_capable() {
	local err
	err=$("$1" inventory 2>&1 >/dev/null) && return 0
	case $err in *"built without cgo"*) return 1 ;; esac
	return 0 # any other failure is for the check to report
}
build() { # build OUT PACKAGE
	command -v go >/dev/null || return 1
	echo "building $2 with cgo"
	CGO_ENABLED=1 go build -o "$1" "$2" 2>"$work/build.log" || { cat "$work/build.log"; die "go build $2 failed"; }
}

gpufence=${GPUFENCE:-}
if [ -z "$gpufence" ]; then
	if [ -x bin/gpufence ] && nvml_capable bin/gpufence; then
		gpufence=bin/gpufence
	elif build "$work/gpufence" ./agent/cmd/gpufence; then
		gpufence=$work/gpufence
	else
		die "bin/gpufence cannot load NVML (built with CGO_ENABLED=0) and there is no Go to build one: build on another machine with 'CGO_ENABLED=1 go build -o bin/gpufence ./agent/cmd/gpufence' and copy it here, or set GPUFENCE="
	fi
fi
gpucheck=${GPUCHECK:-}
if [ -z "$gpucheck" ]; then
	if [ -x bin/gpucheck ]; then
		gpucheck=bin/gpucheck
	elif build "$work/gpucheck" ./tests/gpu/gpucheck; then
		gpucheck=$work/gpucheck
	else
		die "no bin/gpucheck and no Go to build it: 'go build -o bin/gpucheck ./tests/gpu/gpucheck' elsewhere and copy it here, or set GPUCHECK="
	fi
fi

build_s=$((SECONDS - start))
start=$SECONDS
echo "machine: kernel $(uname -r), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1), $(printf '%s\n' "$smi_list" | grep -c '^GPU ') GPU(s)"
printf '%s\n' "$smi_list" | sed 's/^/  /'
echo "gpufence: $gpufence ($("$gpufence" version)); gpucheck: $gpucheck"

echo "== 1. inventory against nvidia-smi"
inv_rc=0
timeout 60 "$gpucheck" inventory "$gpufence" || inv_rc=$?

echo "== 2. isolation in a cgroup"
iso_rc=0
timeout 150 "$gpucheck" isolate || iso_rc=$?

echo "== checks took $((SECONDS - start))s (building ${build_s}s): inventory exit $inv_rc, isolation exit $iso_rc"
if [ "$inv_rc" != 0 ] && [ "$inv_rc" != "$SKIP" ]; then exit 1; fi
if [ "$iso_rc" != 0 ] && [ "$iso_rc" != "$SKIP" ]; then exit 1; fi
if [ "$inv_rc" = "$SKIP" ] || [ "$iso_rc" = "$SKIP" ]; then exit "$SKIP"; fi
echo "PASS"
