#!/usr/bin/env bash
# Installs what building and testing gpufence needs on a fresh Debian 12 machine
# (as root): Debian packages and, when the machine has no Go new enough for
# go.mod, the Go toolchain from the Go module proxy. Sourced by tests/all.sh and
# tests/demo.sh; it changes PATH for the caller.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail

pkgs=(make gcc libc6-dev git curl unzip ca-certificates
      libslurm-dev slurmctld slurmd slurm-client munge
      clang llvm protobuf-compiler bpftool prometheus
      lintian rpmlint rpm cpio debootstrap gpgv debian-archive-keyring xz-utils
      python3-botocore rsyslog rsyslog-gnutls apache2-utils
      libmunge-dev libdbus-1-dev libhwloc-dev libjson-c-dev libyaml-dev pkg-config
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross apt-utils createrepo-c gpg gpg-agent rpm2cpio)
# python3-botocore: the CloudWatch API's service model, which
# agent/metrics/cloudwatch_api_test.go checks the shipped alarm and dashboard
# against; rsyslog, rsyslog-gnutls: the collector of the syslog-over-TLS
# test (agent/audit runs an rsyslogd of its own); apache2-utils: htpasswd,
# which gpufence-node.sh --cloudwatch uses (tests/pcluster). The last line: what building Slurm from a release tarball needs
# (tests/slurmrel/build-source.sh, for the e2e suite on other releases).
# The line after it: `make release` (tests/release): the arm64 cross
# compiler for the agent's cgo and the SPANK plugin, apt-ftparchive and
# createrepo_c for the repository metadata, gpg to sign.
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
want=$(awk '/^go /{print $2; exit}' "$here/go.mod")
have_go() {
	command -v go >/dev/null || return 1
	local v; v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
	[ "$(printf '%s\n%s\n' "$want" "$v" | sort -V | head -1)" = "$want" ]
}
[ -x /usr/local/go/bin/go ] && export PATH=/usr/local/go/bin:$PATH
if ! have_go; then
	# Go's own toolchain distribution, from the module proxy (as
	# GOTOOLCHAIN=auto would fetch it), unpacked once.
	ver=go${want}
	[ "$(echo "$want" | tr -cd . | wc -c)" -ge 2 ] || ver=${ver}.0
	dest=/usr/local/lib/gpufence-go/$ver
	if [ ! -x "$dest/go/bin/go" ]; then
		proxy=${GOPROXY:-https://proxy.golang.org}; proxy=${proxy%%,*}
		echo "deps: fetching $ver from $proxy" >&2
		tmp=$(mktemp -d)
		curl -fsSL -o "$tmp/go.zip" "$proxy/golang.org/toolchain/@v/v0.0.1-$ver.linux-amd64.zip"
		mkdir -p "$dest"
		unzip -q "$tmp/go.zip" -d "$tmp/x"
		mv "$tmp/x/golang.org/toolchain@v0.0.1-$ver.linux-amd64" "$dest/go"
		rm -rf "$tmp"
	fi
	export PATH=$dest/go/bin:$PATH
	have_go || { echo "deps: no Go >= $want available" >&2; exit 1; }
fi
export GOTOOLCHAIN=local
echo "deps: $(go version)" >&2
