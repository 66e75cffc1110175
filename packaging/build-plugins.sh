#!/bin/sh
# build-plugins.sh OUTDIR INCLUDE_DIR... - the SPANK plugin's C entry
# (spank/plugin/*.c) compiled against each Slurm header set, into
# OUTDIR/slurm-X.Y/spank_gpufence.so. X.Y comes from that include dir's
# slurm/slurm_version.h (SLURM_VERSION_NUMBER), the number Slurm compares
# with its own major.minor before it loads a plugin. Each built .so is checked
# to carry that plugin_version. When two dirs have the same major.minor the
# first wins. An INCLUDE_DIR that is an unmatched glob (no fetched headers) is
# skipped.
#
# Run from the repository root. env: CC (default cc), SPANK_CFLAGS (the
# Makefile's), STRIP (default strip; empty keeps debug info).
# SPDX-License-Identifier: Apache-2.0
set -eu

if [ $# -lt 2 ]; then
	sed -n '2,13p' "$0" >&2
	exit 2
fi
out=$1
shift
cc=${CC:-cc}
strip=${STRIP-strip}
log() { echo "build-plugins: $*" >&2; }

# slurm_version_number INCLUDE_DIR -> decimal SLURM_VERSION_NUMBER
slurm_version_number() {
	v=$(sed -n 's/^#[[:space:]]*define[[:space:]][[:space:]]*SLURM_VERSION_NUMBER[[:space:]][[:space:]]*\(0x[0-9a-fA-F]*\).*/\1/p' "$1/slurm/slurm_version.h" | head -1)
	[ -n "$v" ] || return 1
	printf '%d\n' "$v"
}

# plugin_version SO -> the value of the plugin_version symbol in SO, read from
# the file: the symbol's address, through its section's address and file
# offset, to the 4 bytes Slurm's loader reads.
plugin_version() {
	sym=$(readelf -W --dyn-syms "$1" | awk '$NF == "plugin_version" {print $2, $7; exit}')
	[ -n "$sym" ] || return 1
	addr=$((0x${sym% *}))
	ndx=${sym#* }
	sec=$(readelf -W -S "$1" | sed 's/^ *\[ *\([0-9]*\)\]/\1/' | awk -v n="$ndx" '$1 == n {print $4, $5; exit}')
	[ -n "$sec" ] || return 1
	off=$((addr - 0x${sec% *} + 0x${sec#* }))
	od -An -t u4 -j "$off" -N 4 "$1" | tr -d ' '
}

mkdir -p "$out"
chmod 0755 "$out" # it becomes /usr/lib/gpufence
built=""
for inc in "$@"; do
	case $inc in
	*'*'*)
		log "skipping $inc (no headers fetched)"
		continue
		;;
	esac
	[ -f "$inc/slurm/spank.h" ] || {
		log "$inc has no slurm/spank.h"
		exit 1
	}
	num=$(slurm_version_number "$inc") || {
		log "$inc/slurm/slurm_version.h has no SLURM_VERSION_NUMBER"
		exit 1
	}
	mm=$(printf '%d.%02d' $((num >> 16)) $(((num >> 8) & 255)))
	full=$mm.$((num & 255))
	case " $built " in
	*" $mm "*)
		log "slurm-$mm already built; skipping $inc (Slurm $full)"
		continue
		;;
	esac
	dest=$out/slurm-$mm
	mkdir -p "$dest"
	# shellcheck disable=SC2086 # SPANK_CFLAGS is a list of flags
	"$cc" ${SPANK_CFLAGS:-} -I"$inc" -Wl,--version-script=spank/plugin/exports.map \
		-o "$dest/spank_gpufence.so" spank/plugin/*.c
	[ -z "$strip" ] || "$strip" --strip-unneeded "$dest/spank_gpufence.so"
	# Installed as is (a shared object is not executed); umask-independent.
	chmod 0755 "$dest"
	chmod 0644 "$dest/spank_gpufence.so"
	got=$(plugin_version "$dest/spank_gpufence.so") || {
		log "$dest/spank_gpufence.so has no plugin_version symbol"
		exit 1
	}
	# Slurm compares major.minor only.
	if [ $((got >> 8)) -ne $((num >> 8)) ]; then
		log "$dest/spank_gpufence.so: plugin_version $got, want $num (Slurm $full from $inc)"
		exit 1
	fi
	log "slurm-$mm/spank_gpufence.so: plugin_version $(printf '0x%06x' "$got") (Slurm $full, $inc)"
	built="$built $mm"
done
[ -n "$built" ] || {
	log "no Slurm headers given"
	exit 1
}
