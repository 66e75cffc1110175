#!/bin/sh
# pkg-version.sh VERSION EPOCH - the deb/rpm version for the Makefile's
# VERSION (git describe --tags --always --dirty), which packages cannot take
# as it is: it may start with "v", be a bare commit, or carry "-" that both
# formats reserve for the release.
#   v1.2.3                 -> 1.2.3
#   v1.2.3-4-gabc1234      -> 1.2.3+git4.abc1234        (after the tag: sorts above it)
#   abc1234 (no tag)       -> 0.0.0~gitYYYYMMDD.abc1234 (EPOCH's date; sorts below any release)
#   ...-dirty              -> ... .dirty
# SPDX-License-Identifier: Apache-2.0
set -eu
v=${1#v}
epoch=${2:-0}
dirty=
case $v in
*-dirty)
	v=${v%-dirty}
	dirty=.dirty
	;;
esac
if printf '%s\n' "$v" | grep -Eq '^[0-9]+(\.[0-9]+)*$'; then
	echo "$v$dirty"
elif printf '%s\n' "$v" | grep -Eq '^[0-9]+(\.[0-9]+)*-[0-9]+-g[0-9a-f]+$'; then
	echo "$v$dirty" | sed -E 's/^([^-]+)-([0-9]+)-g([0-9a-f]+)/\1+git\2.\3/'
elif printf '%s\n' "$v" | grep -Eq '^[0-9a-f]{4,40}$'; then
	echo "0.0.0~git$(date -u -d "@$epoch" +%Y%m%d).$v$dirty"
else
	# Anything else (a tag like "1.0-rc1"): keep what both formats accept.
	echo "0.0.0~$(printf '%s' "$v$dirty" | tr -c 'A-Za-z0-9.+~' '.')"
fi
