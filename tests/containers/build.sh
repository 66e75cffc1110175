#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# build.sh WHAT TARBALL CACHE_DIR [SPANK_INCLUDE]
# Builds one container runtime from its upstream release tarball (checked
# against the SHA256SUMS next to it) into CACHE_DIR/<key>/prefix, once per
# machine, as tests/slurmrel/build-source.sh does for Slurm:
#   enroot     make && make install (its C helpers statically against the
#              musl it builds from deps/), prefix and sysconfdir in <key>
#   pyxis      make with CPPFLAGS=-I SPANK_INCLUDE: a SPANK plugin is built
#              against the spank.h of the Slurm release that loads it, so
#              the key holds that header's checksum too
#   apptainer  mconfig --without-suid (unprivileged: user namespaces), make,
#              make install; Go modules from the Go module proxy
# The key is the release name, the tarball's SHA256, the recipe number below
# (bump it when the commands or flags change) and, for pyxis, spank.h's
# SHA256. A finished build is marked by <key>/.built (its build seconds);
# one that did not finish is removed and done again; concurrent callers wait
# for each other (flock). Prints <key>/prefix on stdout; the log is <key>.log.
set -euo pipefail
what=$1
tarball=$(realpath "$2")
cache=$3
include=${4:-}
sums=$(dirname "$tarball")/SHA256SUMS
base=$(basename "$tarball")
name=${base%.tar.*}
case "$what" in
enroot | pyxis | apptainer) ;;
*) echo "build: unknown runtime $what (enroot, pyxis, apptainer)" >&2; exit 2 ;;
esac
[[ $name == "$what"-* ]] || { echo "build: $base is not a $what tarball" >&2; exit 2; }
[ -f "$sums" ] || { echo "build: no SHA256SUMS next to $tarball" >&2; exit 1; }
line=$(awk -v f="$base" '$2 == f || $2 == "*" f' "$sums")
[ -n "$line" ] || { echo "build: $base is not listed in $sums" >&2; exit 1; }
(cd "$(dirname "$tarball")" && printf '%s\n' "$line" | sha256sum --quiet -c -) ||
	{ echo "build: $base does not match $sums" >&2; exit 1; }
sum=${line%% *}
recipe=r1
key=$name-${sum:0:16}-$recipe
if [ "$what" = pyxis ]; then
	[ -f "$include/slurm/spank.h" ] || { echo "build: pyxis needs the Slurm release's include folder (no $include/slurm/spank.h)" >&2; exit 2; }
	h=$(sha256sum "$include/slurm/spank.h")
	key=$key-spank-${h:0:12}
fi
mkdir -p "$cache"
dest=$cache/$key
prefix=$dest/prefix
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
echo "build: building $name into $prefix (log: $log)" >&2
start=$(date +%s)
{
	tar -xf "$tarball" -C "$src"
	cd "$src/$name"
	case "$what" in
	enroot)
		make -j"$(nproc)" prefix="$prefix" sysconfdir="$prefix/etc"
		make install prefix="$prefix" sysconfdir="$prefix/etc"
		;;
	pyxis)
		# In the environment: on the command line it would replace the
		# Makefile's own CPPFLAGS (-D_GNU_SOURCE, PYXIS_VERSION).
		CPPFLAGS="-I$include" make
		make install prefix="$prefix"
		;;
	apptainer)
		# git archive leaves no VERSION and no .git for scripts/get-version.
		echo "${name#apptainer-}" > VERSION
		./mconfig -b builddir -p "$prefix" --without-suid --without-libsubid --without-network
		make -C builddir -j"$(nproc)"
		make -C builddir install
		;;
	esac
} >"$log" 2>&1 || { echo "build: $name failed, see $log" >&2; tail -20 "$log" >&2; exit 1; }
rm -rf "$src"
echo $(( $(date +%s) - start )) > "$dest/.built"
echo "build: $name built in $(cat "$dest/.built") s" >&2
echo "$prefix"
