#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# slurm-src-headers.sh CACHE TARBALL... - Slurm's C headers from release
# source tarballs, for the Slurm releases Debian does not package.
#
# Each TARBALL (slurm-X.Y.Z.tar.xz, a `git archive` of SchedMD's release tag)
# is first checked against the SHA256SUMS file next to it. Only its slurm/
# folder and META are unpacked. The one generated header, slurm_version.h, is
# made from slurm_version.h.in the way configure makes it: its
# `#undef SLURM_VERSION_NUMBER` becomes `#define SLURM_VERSION_NUMBER 0xMMmmuu`
# from META's Major, Minor and Micro (auxdir/slurm.m4). No configure, no build.
# Result: CACHE/src-X.Y.Z/include/slurm/*.h and CACHE/src-X.Y.Z/SOURCE; the
# include folder is printed on stdout, one line per TARBALL. A tarball whose
# checksum was unpacked before is not unpacked again.
set -eu

if [ $# -lt 2 ]; then
	sed -n '2,14p' "$0" >&2
	exit 2
fi
cache=$1
shift
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
log() { echo "slurm-src-headers: $*" >&2; }
die() {
	log "$*"
	exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for tarball in "$@"; do
	[ -f "$tarball" ] || die "$tarball: no such file"
	dir=$(cd "$(dirname "$tarball")" && pwd)
	base=$(basename "$tarball")
	[ -f "$dir/SHA256SUMS" ] || die "$base: no SHA256SUMS in $dir to check it against"
	want=$(awk -v f="$base" '$2 == f || $2 == "*" f {print $1; exit}' "$dir/SHA256SUMS")
	[ -n "$want" ] || die "$base is not listed in $dir/SHA256SUMS"
	got=$(sha256sum "$tarball" | cut -d' ' -f1)
	[ "$got" = "$want" ] || die "$base: SHA256 $got does not match $dir/SHA256SUMS ($want)"

	stamp=$cache/src-$got.version
	if [ -s "$stamp" ] && [ -f "$cache/src-$(cat "$stamp")/include/slurm/slurm_version.h" ]; then
		log "$base: Slurm $(cat "$stamp") (cached)"
		echo "$cache/src-$(cat "$stamp")/include"
		continue
	fi
	name=${base%.tar.*}
	w=$tmp/$got
	mkdir -p "$w"
	tar -xf "$tarball" -C "$w" "$name/META" "$name/slurm" ||
		die "$base: cannot unpack $name/META and $name/slurm/ (is it a slurm-X.Y.Z tree?)"
	meta() { sed -n "s/^[[:space:]]*$1:[[:space:]]*\([0-9][0-9]*\)[[:space:]]*$/\1/p" "$w/$name/META" | head -n1; }
	major=$(meta Major)
	minor=$(meta Minor)
	micro=$(meta Micro)
	[ -n "$major" ] && [ -n "$minor" ] && [ -n "$micro" ] || die "$base: META has no numeric Major, Minor and Micro"
	version=$major.$minor.$micro
	in=$w/$name/slurm/slurm_version.h.in
	[ -f "$in" ] || die "$base: no slurm/slurm_version.h.in"
	[ -f "$w/$name/slurm/spank.h" ] || die "$base: no slurm/spank.h"
	grep -q '^#undef SLURM_VERSION_NUMBER$' "$in" || die "$base: slurm_version.h.in has no '#undef SLURM_VERSION_NUMBER' line to fill in"
	number=$(printf '0x%02x%02x%02x' "$major" "$((minor + 0))" "$((micro + 0))")

	dest=$cache/src-$version
	rm -rf "$dest.new"
	mkdir -p "$dest.new/include/slurm"
	for h in "$w/$name"/slurm/*.h; do
		cp "$h" "$dest.new/include/slurm/"
	done
	{
		echo "/* slurm/slurm_version.h.  Generated from slurm_version.h.in by gpufence's packaging/slurm-src-headers.sh.  */"
		sed "s/^#undef SLURM_VERSION_NUMBER\$/#define SLURM_VERSION_NUMBER $number/" "$in"
	} >"$dest.new/include/slurm/slurm_version.h"
	printf 'tarball: %s\nsha256: %s\nslurm_version_number: %s\n' "$base" "$got" "$number" >"$dest.new/SOURCE"
	rm -rf "$dest"
	mv "$dest.new" "$dest"
	echo "$version" >"$stamp"
	log "$base: Slurm $version headers (SHA256 checked, SLURM_VERSION_NUMBER $number)"
	echo "$dest/include"
done
