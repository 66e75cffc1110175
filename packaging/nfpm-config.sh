#!/bin/sh
# nfpm-config.sh - packaging/nfpm.yaml plus one rpm %doc entry per docs/*
# file: nfpm expands globs only for plain files, and rpmlint wants every file
# under /usr/share/doc marked %doc. Run from the repository root; `contents:`
# is the last key of nfpm.yaml, so the entries extend it.
# SPDX-License-Identifier: Apache-2.0
set -eu
cat packaging/nfpm.yaml
for f in docs/*; do
	[ -f "$f" ] || continue
	printf '  - src: %s\n    dst: /usr/share/doc/gpufence/%s\n    type: doc\n    packager: rpm\n    file_info: {mode: 0644}\n' "$f" "$f"
done
