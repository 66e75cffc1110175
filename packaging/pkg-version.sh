#!/bin/sh
# pkg-version.sh VERSION EPOCH - the deb/rpm version for the Makefile's
# VERSION (git describe --tags --match 'v[0-9]*' --always --dirty). Release
# tags are semantic versions, vMAJOR.MINOR.PATCH[-PRERELEASE]; a tag that
# is not is an error (exit 1), so that no release goes out with a version
# the package managers order differently from what it means.
#   v1.2.3                 -> 1.2.3
#   v1.2.3-rc.1            -> 1.2.3~rc.1                (sorts below 1.2.3)
#   v1.2.3-4-gabc1234      -> 1.2.3+git4.abc1234        (after the tag: above it, below 1.2.4)
#   v1.2.3-rc.1-4-gabc1234 -> 1.2.3~rc.1+git4.abc1234   (above rc.1, below 1.2.3)
#   abc1234 (no tag)       -> 0.0.0~gitYYYYMMDD.abc1234 (EPOCH's date; sorts below any release)
#   dev (no git)           -> 0.0.0~dev
#   v1.2.3-dirty           -> 1.2.3+dirty
#   other ...-dirty        -> ... .dirty
# '~' sorts below the empty string in both dpkg and rpm (>= 4.10).
# SPDX-License-Identifier: Apache-2.0
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	sed -n '2,16p' "$0" >&2
	exit 2
fi
in=$1
v=$in
epoch=${2:-0}
dirty=
case $v in
*-dirty)
	v=${v%-dirty}
	dirty=.dirty
	;;
esac
if [ "$v" = dev ]; then
	echo "0.0.0~dev$dirty"
	exit 0
fi
if printf '%s\n' "$v" | grep -Eq '^[0-9a-f]{4,40}$'; then
	echo "0.0.0~git$(date -u -d "@$epoch" +%Y%m%d).$v$dirty"
	exit 0
fi
# git describe's "-N-gHASH": commits after the tag.
after=
if printf '%s\n' "$v" | grep -Eq -- '-[0-9]+-g[0-9a-f]{4,40}$'; then
	after=$(printf '%s\n' "$v" | sed -E 's/^.*-([0-9]+)-g([0-9a-f]+)$/+git\1.\2/')
	v=$(printf '%s\n' "$v" | sed -E 's/-[0-9]+-g[0-9a-f]+$//')
fi
tag=$v
num='(0|[1-9][0-9]*)'
if ! printf '%s\n' "$tag" | grep -Eq "^v$num\.$num\.$num(-[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?\$"; then
	echo "pkg-version: tag \"$tag\" (from VERSION \"$in\") is not a release tag vMAJOR.MINOR.PATCH[-PRERELEASE] (semantic versioning without leading zeros; pre-release identifiers [0-9A-Za-z] separated by dots, no '-' or '+' in them); delete it or tag the commit with one that is" >&2
	exit 1
fi
v=${tag#v}
case $v in
*-*) v=${v%%-*}~${v#*-} ;;
esac
# A dirty tree at the tag itself: above the tag, below its next commit.
[ -n "$after" ] || [ -z "$dirty" ] || dirty=+dirty
echo "$v$after$dirty"
