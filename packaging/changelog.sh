#!/bin/sh
# changelog.sh PKG_VERSION VERSION EPOCH MAINTAINER - the one-entry changelog
# (nfpm's chglog YAML) of a package build: Debian wants changelog.Debian.gz to
# name the package's version, RPM a %changelog. Deterministic for one commit.
# SPDX-License-Identifier: Apache-2.0
set -eu
date=$(date -u -d "@$3" +%Y-%m-%dT%H:%M:%SZ)
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
cat <<YAML
- semver: "$1-1"
  date: $date
  packager: "$4"
  deb:
    urgency: medium
    distributions: [unstable]
  changes:
    - commit: $commit
      note: "Build of gpufence $2."
YAML
