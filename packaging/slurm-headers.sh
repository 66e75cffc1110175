#!/bin/sh
# slurm-headers.sh CACHE SUITE... - Slurm's C headers of other Slurm releases,
#   so that one build can make the SPANK plugin for each of them.
# slurm-headers.sh --pin CACHE SUITE... - the packaging/slurm-sources line
#   of each SUITE's current libslurm-dev, for updating a pin.
#
# For each Debian SUITE (e.g. trixie, sid) it downloads the libslurm-dev .deb
# pinned for it in packaging/slurm-sources (pool file and SHA256) from the
# mirror's pool, checks it against the pin, and unpacks only
# usr/include/slurm into CACHE/<upstream version>/include/slurm, then writes
# CACHE/<suite>.version. A suite already in CACHE from the pinned .deb is not
# fetched again (SLURM_HEADERS_REFRESH=1 does).
# --pin finds the suite's current .deb instead: the suite's InRelease is
# checked with gpgv against the Debian archive keyring (when installed; else
# HTTPS alone), the Packages index against InRelease's SHA256, and the .deb
# against the index's SHA256; the line is printed on stdout.
#
# env: DEBIAN_MIRROR (default: the Debian mirror apt uses here, else
#        https://deb.debian.org/debian)
#      DEBIAN_KEYRING (default /usr/share/keyrings/debian-archive-keyring.gpg)
#      SLURM_HEADERS_ARCH (default amd64; the headers are the same on every arch)
#      SLURM_SOURCES_FILE (default packaging/slurm-sources)
# SPDX-License-Identifier: Apache-2.0
set -eu

pinmode=
if [ "${1:-}" = --pin ]; then
	pinmode=1
	shift
fi
if [ $# -lt 1 ]; then
	sed -n '2,23p' "$0" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
pins=${SLURM_SOURCES_FILE:-$here/slurm-sources}
cache=$1
shift
[ $# -gt 0 ] || exit 0

# The mirror apt is set up with works where the Internet does not (a proxy,
# a local mirror); gpgv below makes plain HTTP safe.
apt_mirror() {
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		sed -n 's|^URIs:[[:space:]]*\([^[:space:]]*/debian\)/\{0,1\}[[:space:]]*$|\1|p' "$f" | head -n1
	done | head -n1
}
mirror=${DEBIAN_MIRROR:-$(apt_mirror)}
mirror=${mirror:-https://deb.debian.org/debian}
keyring=${DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
arch=${SLURM_HEADERS_ARCH:-amd64}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

log() { echo "slurm-headers: $*" >&2; }
die() {
	log "$*"
	exit 1
}
sha_ok() { # FILE SHA256
	[ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# current: the suite's libslurm-dev now (version, file, sha; the .deb in
# $w/dev.deb), through the signed InRelease and its Packages index.
current() {
	log "$suite: from $mirror"
	index=main/binary-$arch/Packages.xz
	curl -fsSL --retry 3 -o "$w/InRelease" "$mirror/dists/$suite/InRelease" ||
		die "$suite: cannot download $mirror/dists/$suite/InRelease"
	if [ -f "$keyring" ] && command -v gpgv >/dev/null; then
		gpgv --quiet --keyring "$keyring" --output "$w/Release" "$w/InRelease" 2>"$w/gpgv.log" ||
			die "$suite: InRelease signature does not verify against $keyring: $(cat "$w/gpgv.log")"
	else
		case $mirror in
		https://*) ;;
		*) die "$suite: no $keyring or gpgv, and $mirror is not HTTPS: nothing to check InRelease with (install gpgv and debian-archive-keyring)" ;;
		esac
		log "$suite: no $keyring or gpgv: trusting HTTPS for InRelease"
		sed -n '/^-----BEGIN PGP SIGNATURE/q;p' "$w/InRelease" >"$w/Release"
	fi
	isha=$(awk -v f="$index" '/^SHA256:/{s=1; next} /^[^ ]/{s=0} s && $3==f {print $1; exit}' "$w/Release")
	[ -n "$isha" ] || die "$suite: $index is not listed in Release"

	curl -fsSL --retry 3 -o "$w/Packages.xz" "$mirror/dists/$suite/$index" ||
		die "$suite: cannot download $index"
	sha_ok "$w/Packages.xz" "$isha" || die "$suite: $index does not match the SHA256 in Release"

	xz -dc "$w/Packages.xz" | awk '
		/^Package: /{p = ($2 == "libslurm-dev")}
		p && /^(Version|Filename|SHA256): /{print $1, $2}
		p && /^$/{exit}' >"$w/entry"
	version=$(sed -n 's/^Version: //p' "$w/entry")
	file=$(sed -n 's/^Filename: //p' "$w/entry")
	sha=$(sed -n 's/^SHA256: //p' "$w/entry")
	if [ -z "$version" ] || [ -z "$file" ] || [ -z "$sha" ]; then
		die "$suite: no libslurm-dev in $index"
	fi
	curl -fsSL --retry 3 -o "$w/dev.deb" "$mirror/$file" || die "$suite: cannot download $file"
	sha_ok "$w/dev.deb" "$sha" || die "$suite: $file does not match the SHA256 in $index"
}

for suite in "$@"; do
	stamp=$cache/$suite.version
	w=$tmp/$suite
	mkdir -p "$w"
	if [ -n "$pinmode" ]; then
		current
		echo "deb $suite $file $sha"
		continue
	fi
	[ -f "$pins" ] || die "no pin file $pins"
	file=$(awk -v s="$suite" '$1 == "deb" && $2 == s {print $3; exit}' "$pins")
	sha=$(awk -v s="$suite" '$1 == "deb" && $2 == s {print $4; exit}' "$pins")
	[ -n "$file" ] && [ -n "$sha" ] || die "$suite: no \"deb $suite POOL-FILE SHA256\" pin in $pins"
	if [ -z "${SLURM_HEADERS_REFRESH:-}" ] && [ -s "$stamp" ] &&
		[ -f "$cache/$(cat "$stamp")/include/slurm/spank.h" ] &&
		grep -qx "sha256: $sha" "$cache/$(cat "$stamp")/SOURCE" 2>/dev/null; then
		log "$suite: Slurm $(cat "$stamp") (cached)"
		continue
	fi
	log "$suite: $file from $mirror"
	curl -fsSL --retry 3 -o "$w/dev.deb" "$mirror/$file" ||
		die "$suite: cannot download the pinned $mirror/$file (Debian may have replaced it: packaging/slurm-headers.sh --pin CACHE $suite prints the current one for $pins)"
	got=$(sha256sum "$w/dev.deb" | cut -d' ' -f1)
	[ "$got" = "$sha" ] || die "$suite: $file: SHA256 $got does not match the pin in $pins: expected $sha"
	version=$(dpkg-deb -f "$w/dev.deb" Version) || die "$suite: $file is not a .deb"
	# 24.11.5-4+deb13u1 -> 24.11.5 (an epoch would be dropped as well)
	upstream=$(echo "$version" | sed 's/^[0-9]*://; s/-[^-]*$//')
	dpkg-deb -x "$w/dev.deb" "$w/x" || die "$suite: cannot unpack $file"
	[ -f "$w/x/usr/include/slurm/spank.h" ] || die "$suite: $file has no usr/include/slurm/spank.h"

	dest=$cache/$upstream
	rm -rf "$dest.new"
	mkdir -p "$dest.new/include"
	cp -R "$w/x/usr/include/slurm" "$dest.new/include/slurm"
	printf 'suite: %s\npackage: %s\nsha256: %s\n' "$suite" "$file" "$sha" >"$dest.new/SOURCE"
	rm -rf "$dest"
	mv "$dest.new" "$dest"
	echo "$upstream" >"$stamp"
	log "$suite: Slurm $upstream from $file (SHA256 checked)"
done
