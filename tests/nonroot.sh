#!/usr/bin/env bash
# Runs the request stages' tests as an ordinary user (issue 20): a copy of
# the working tree, vendored, built and tested as uid/gid 65534 with a cache
# of its own, so nothing of root's (the module cache under /root, the build
# cache, the kernel) can make them pass. Fails when one of them fails or
# covers less than MIN_COVER percent of its statements.
# Run as root (it drops to 65534 itself); `make test-nonroot`.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
cd "$(dirname "$0")/.."
min=${MIN_COVER:-70}
pkgs=(./agent/handler ./agent/registry ./agent/enforcer ./agent/reconcile ./agent/recovery)
[ "$(id -u)" = 0 ] || { echo "nonroot: run as root; it drops to uid 65534 itself" >&2; exit 2; }
go=$(command -v go)
tmp=$(mktemp -d /tmp/gpufence-nonroot.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src" "$tmp/home"
# The working tree as git sees it (tracked and untracked, not ignored).
git ls-files -z -co --exclude-standard | tar -c --null -T - | tar -x -C "$tmp/src"
(cd "$tmp/src" && GOFLAGS=-mod=mod "$go" mod vendor)
chown -R 65534:65534 "$tmp"
chmod 0755 "$tmp"
out=$(cd "$tmp/src" && setpriv --reuid=65534 --regid=65534 --clear-groups \
	env -i PATH="$(dirname "$go"):/usr/bin:/bin" HOME="$tmp/home" GOCACHE="$tmp/home/cache" \
	GOFLAGS=-mod=vendor GOTOOLCHAIN=local GOPROXY=off \
	sh -c 'id -u; go test -count=1 -cover "$@"' sh "${pkgs[@]}" 2>&1) || { echo "$out" >&2; echo "nonroot: tests failed as uid 65534" >&2; exit 1; }
echo "$out"
uid=$(echo "$out" | head -1)
[ "$uid" = 65534 ] || { echo "nonroot: ran as uid $uid, not 65534" >&2; exit 1; }
fail=0
for p in "${pkgs[@]}"; do
	name=github.com/gpufence/gpufence/${p#./}
	pct=$(echo "$out" | awk -v n="$name" '$1=="ok" && $2==n {for (i=3;i<=NF;i++) if ($i=="coverage:") {sub("%","",$(i+1)); print $(i+1)}}')
	if [ -z "$pct" ]; then
		echo "nonroot: no coverage figure for $p" >&2; fail=1
	elif awk -v p="$pct" -v m="$min" 'BEGIN{exit !(p < m)}'; then
		echo "nonroot: $p covers $pct% as uid 65534, under $min%" >&2; fail=1
	fi
done
[ $fail = 0 ] && echo "nonroot: ${#pkgs[@]} packages pass as uid 65534, each >= $min% covered"
exit $fail
