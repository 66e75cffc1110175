#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# build-source.sh TARBALL CACHE_DIR [plain|multislurmd]
# Builds one Slurm release from its source tarball (checked against the
# SHA256SUMS next to it) into CACHE_DIR/<key>/opt/slurm, the layout AWS
# ParallelCluster uses under /opt/slurm (bin, sbin, lib, include, etc). The
# key is the release name, the tarball's SHA256 and the recipe number below
# (bump it when the build commands change), so a changed tarball or recipe is
# a new build and a finished one is never built again. multislurmd builds
# with --enable-multiple-slurmd (several slurmd on one host, `slurmd -N`, for
# the multi-node test cluster; its scope is <node>_slurmstepd.scope) into a
# key of its own: the plain build stays SchedMD's default and
# ParallelCluster's (scope slurmstepd.scope). A finished build is marked by <key>/.built (its build seconds); one
# that did not finish is removed and done again. Concurrent callers wait for
# each other (flock). Prints the prefix on stdout; the log is <key>.log.
# Needs gcc, make and the -dev packages tests/deps.sh installs.
set -euo pipefail
tarball=$(realpath "$1")
cache=$2
flavour=${3:-plain}
case $flavour in
plain) configure_extra=() ;;
multislurmd) configure_extra=(--enable-multiple-slurmd) ;;
*) echo "build-source: flavour $flavour: want plain or multislurmd" >&2; exit 2 ;;
esac
sums=$(dirname "$tarball")/SHA256SUMS
base=$(basename "$tarball")
name=${base%.tar.*}
[ -f "$sums" ] || { echo "build-source: no SHA256SUMS next to $tarball" >&2; exit 1; }
line=$(awk -v f="$base" '$2 == f || $2 == "*" f' "$sums")
[ -n "$line" ] || { echo "build-source: $base is not listed in $sums" >&2; exit 1; }
(cd "$(dirname "$tarball")" && printf '%s\n' "$line" | sha256sum --quiet -c -) ||
	{ echo "build-source: $base does not match $sums" >&2; exit 1; }
sum=${line%% *}
recipe=r1
key=$name-${sum:0:16}-$recipe
[ "$flavour" = plain ] || key=$key-$flavour
mkdir -p "$cache"
dest=$cache/$key
prefix=$dest/opt/slurm
exec 9>"$cache/$key.lock"
flock 9
if [ -f "$dest/.built" ]; then
	echo "$prefix"
	exit 0
fi
log=$cache/$key.log
src=$cache/$key.src
rm -rf "$dest" "$src"
mkdir -p "$src"
echo "build-source: building $name into $prefix (log: $log)" >&2
start=$(date +%s)
{
	tar -xf "$tarball" -C "$src"
	cd "$src/$name"
	# No static libraries: libtool would compile every file twice.
	./configure --prefix="$prefix" --sysconfdir="$prefix/etc" --disable-debug --disable-static ${configure_extra[@]+"${configure_extra[@]}"}
	make -j"$(nproc)"
	make install
} >"$log" 2>&1 || { echo "build-source: $name failed, see $log" >&2; tail -20 "$log" >&2; exit 1; }
rm -rf "$src"
echo $(( $(date +%s) - start )) > "$dest/.built"
echo "build-source: $name built in $(cat "$dest/.built") s" >&2
echo "$prefix"
