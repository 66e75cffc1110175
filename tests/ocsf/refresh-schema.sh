#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# refresh-schema.sh CHECKOUT_OR_GITDIR TAG
#
# Re-creates tests/ocsf/schema, the pinned part of the OCSF
# schema that the OCSF output's tests validate against, from a clone of
# https://github.com/ocsf/ocsf-schema (a work tree or a bare repository):
# the files of TAG exactly as committed (git archive), never the work tree.
set -eu
if [ $# -ne 2 ]; then
	echo "usage: $0 CHECKOUT_OR_GITDIR TAG" >&2
	exit 2
fi
src=$1 tag=$2
out=tests/ocsf/schema
classes="events/system/file_activity.json events/application/application_lifecycle.json events/application/application_error.json"
cd "$(dirname "$0")/../.."
commit=$(git -C "$src" rev-parse --verify "$tag^{commit}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$src" archive "$commit" | tar -x -C "$tmp"
# shellcheck disable=SC2086 # one argument per class file
go run ./tests/ocsf/schemacopy -src "$tmp" -out "$out" -tag "$tag" -commit "$commit" $classes
echo "$out: OCSF $tag ($commit)"
