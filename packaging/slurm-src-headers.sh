#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# slurm-src-headers.sh CACHE TARBALL... - Slurm's C headers from release
#   source tarballs, for the Slurm releases Debian does not package.
# slurm-src-headers.sh --fetch CACHE FILE... - the same, each release
#   fetched from the URL its pin names instead of read from a mirror.
#
# Each TARBALL (slurm-X.Y.Z.tar.xz, a `git archive` of SchedMD's release tag)
# must be pinned in packaging/slurm-sources and match the SHA256 there. With
# --fetch, FILE is such a pinned name: its URL (GitHub's archive of the tag)
# is downloaded into CACHE/download/ and must be the pinned commit's archive
# holding exactly the pinned git tree (checked with git). Only slurm/ and
# META are unpacked. The one generated header, slurm_version.h, is made
# from slurm_version.h.in the way configure makes it: its
# `#undef SLURM_VERSION_NUMBER` becomes `#define SLURM_VERSION_NUMBER
# 0xMMmmuu` from META's Major, Minor and Micro (auxdir/slurm.m4); it holds
# nothing of the build machine, so the headers serve every architecture.
# No configure, no build. Result: CACHE/src-X.Y.Z/include/slurm/*.h and
# CACHE/src-X.Y.Z/SOURCE; the include folder is printed on stdout, one line
# per TARBALL. A release unpacked before from the same checked source is not
# unpacked again. env: SLURM_SOURCES_FILE (default packaging/slurm-sources).
set -eu

fetch=
if [ "${1:-}" = --fetch ]; then
	fetch=1
	shift
fi
if [ $# -lt 2 ]; then
	sed -n '2,23p' "$0" >&2
	exit 2
fi
cache=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
pins=${SLURM_SOURCES_FILE:-$here/slurm-sources}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
log() { echo "slurm-src-headers: $*" >&2; }
die() {
	log "$*"
	exit 1
}
[ -f "$pins" ] || die "no pin file $pins"
# pin FILE -> "SHA256 COMMIT TREE URL" of its src line
pin() {
	awk -v f="$1" '$1 == "src" && $2 == f {print $3, $4, $5, $6; exit}' "$pins"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# tree_of ARCHIVE PREFIX -> the git tree id of the files under PREFIX
tree_of() {
	t=$tmp/tree
	rm -rf "$t"
	mkdir -p "$t"
	tar -xf "$1" -C "$t" || return 1
	(cd "$t/$2" && git init -q && git add -A -f && git write-tree)
	rm -rf "$t"
}

for arg in "$@"; do
	if [ -n "$fetch" ]; then
		base=$arg
		p=$(pin "$base")
		[ -n "$p" ] || die "$base is not listed in $pins"
		set -- $p
		commit=$2 tree=$3 url=$4
		command -v git >/dev/null || die "$base: git is needed to check $url against the pinned tree"
		dl=$cache/download
		mkdir -p "$dl"
		tarball=$dl/$(basename "$url")
		ok=$tarball.checked
		if [ -f "$tarball" ] && [ -s "$ok" ] && [ "$(sha256sum "$tarball" | cut -d' ' -f1)" = "$(cat "$ok")" ]; then
			log "$base: $url (downloaded and checked before)"
		else
			rm -f "$tarball" "$ok"
			log "$base: downloading $url"
			curl -fsSL --retry 3 -o "$tarball.part" "$url" || die "$base: cannot download $url"
			gotc=$(gzip -dc "$tarball.part" | git get-tar-commit-id) || gotc=none
			[ "$gotc" = "$commit" ] ||
				die "$base: $url is the archive of commit $gotc, expected $commit (pinned in $pins)"
			top=$(tar -tzf "$tarball.part" | head -n1)
			top=${top%%/*}
			gott=$(tree_of "$tarball.part" "$top") || die "$base: cannot unpack $url"
			[ "$gott" = "$tree" ] ||
				die "$base: $url holds git tree $gott, expected $tree (pinned in $pins)"
			mv "$tarball.part" "$tarball"
			sha256sum "$tarball" | cut -d' ' -f1 >"$ok"
		fi
		got=tree-$tree
	else
		tarball=$arg
		[ -f "$tarball" ] || die "$tarball: no such file"
		base=$(basename "$tarball")
		p=$(pin "$base")
		[ -n "$p" ] || die "$base is not listed in $pins"
		want=${p%% *}
		got=$(sha256sum "$tarball" | cut -d' ' -f1)
		[ "$got" = "$want" ] || die "$tarball: SHA256 $got does not match the pin in $pins: expected $want"
	fi

	stamp=$cache/src-$got.version
	if [ -s "$stamp" ] && [ -f "$cache/src-$(cat "$stamp")/include/slurm/slurm_version.h" ]; then
		log "$base: Slurm $(cat "$stamp") (cached)"
		echo "$cache/src-$(cat "$stamp")/include"
		continue
	fi
	name=$(tar -tf "$tarball" | head -n1)
	name=${name%%/*}
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
	printf 'tarball: %s\nchecked: %s\nslurm_version_number: %s\n' "$base" "$got" "$number" >"$dest.new/SOURCE"
	rm -rf "$dest"
	mv "$dest.new" "$dest"
	echo "$version" >"$stamp"
	log "$base: Slurm $version headers (checked against its pin, SLURM_VERSION_NUMBER $number)"
	echo "$dest/include"
done
