#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# release-headers.sh CACHE - the Slurm header folder of every release in
# packaging/slurm-releases, fetched or unpacked once into CACHE, printed on
# stdout one per line in the file's order (build-plugins.sh takes them as
# they are). A release whose headers cannot be had is an error, never skipped:
# the packages must hold every listed build.
#
# env: SLURM_RELEASES  the major.minor releases to give (default: every line)
#      SLURM_SRC_DIR   an offline mirror: the folder of the src: release
#                      tarballs, each checked against its pin in
#                      packaging/slurm-sources. Unset: each is fetched from
#                      its pinned URL into CACHE/download and checked
#                      (packaging/slurm-src-headers.sh --fetch).
#      SLURM_INCLUDE   this machine's headers (default /usr/include): used
#                      for a release of the same major.minor, nothing fetched
#      SLURM_RELEASES_FILE (default packaging/slurm-releases)
# Debian suites go through packaging/slurm-headers.sh (its env applies).
set -eu

if [ $# -ne 1 ]; then
	sed -n '2,19p' "$0" >&2
	exit 2
fi
cache=$1
here=$(cd "$(dirname "$0")" && pwd)
list=${SLURM_RELEASES_FILE:-$here/slurm-releases}
host_inc=${SLURM_INCLUDE:-/usr/include}
log() { echo "release-headers: $*" >&2; }
die() {
	log "$*"
	exit 1
}

# mm_of INCLUDE_DIR -> major.minor of its slurm/slurm_version.h
mm_of() {
	v=$(sed -n 's/^#[[:space:]]*define[[:space:]][[:space:]]*SLURM_VERSION_NUMBER[[:space:]][[:space:]]*\(0x[0-9a-fA-F]*\).*/\1/p' "$1/slurm/slurm_version.h" 2>/dev/null | head -n1)
	[ -n "$v" ] || return 1
	v=$(printf '%d' "$v")
	printf '%d.%02d\n' $((v >> 16)) $(((v >> 8) & 255))
}

[ -f "$list" ] || die "no release list $list"
known=$(awk '!/^[[:space:]]*(#|$)/ {print $1}' "$list" | tr '\n' ' ')
want=${SLURM_RELEASES:-$known}
for r in $want; do
	case " $known " in
	*" $r "*) ;;
	*) die "SLURM_RELEASES names $r, which $list does not list (it lists: $known)" ;;
	esac
done
host_mm=$(mm_of "$host_inc" || true)

awk '!/^[[:space:]]*(#|$)/ {print $1, $2}' "$list" | while read -r mm source; do
	case " $want " in
	*" $mm "*) ;;
	*) continue ;;
	esac
	if [ "$mm" = "$host_mm" ]; then
		log "$mm: this machine's headers in $host_inc"
		echo "$host_inc"
		continue
	fi
	case $source in
	debian:*)
		suite=${source#debian:}
		"$here/slurm-headers.sh" "$cache" "$suite"
		inc=$cache/$(cat "$cache/$suite.version")/include
		;;
	src:*)
		tarball=${source#src:}
		if [ -n "${SLURM_SRC_DIR:-}" ]; then
			[ -f "$SLURM_SRC_DIR/$tarball" ] ||
				die "$mm: $tarball not found in SLURM_SRC_DIR=$SLURM_SRC_DIR; put it there, unset SLURM_SRC_DIR to fetch it, or set SLURM_RELEASES to the releases to build"
			inc=$("$here/slurm-src-headers.sh" "$cache" "$SLURM_SRC_DIR/$tarball")
		else
			inc=$("$here/slurm-src-headers.sh" --fetch "$cache" "$tarball")
		fi
		;;
	*) die "$list: $mm has source \"$source\", not debian:SUITE or src:TARBALL" ;;
	esac
	got=$(mm_of "$inc") || die "$mm: $inc/slurm/slurm_version.h has no SLURM_VERSION_NUMBER"
	[ "$got" = "$mm" ] || die "$mm: $source gave Slurm $got headers, not $mm; update $list"
	echo "$inc"
done
