#!/bin/bash
# upgrade.sh OLD_DIR NEW_DIR GF_OPEN UPGRADECHECK - the live upgrade test
# (`make vm-upgrade-test`): boots the throw-away VM of run-in-vm.sh once per
# package format and runs upgrade-node.sh there, which upgrades the older
# package (OLD_DIR: gpufence_*.deb and gpufence-*.rpm) to the newer one
# (NEW_DIR) under a probing job and a 100-step burst, then restarts the agent
# under another burst, and judges isolation, steps and audit books.
#
# The VM is Debian: the .deb run is the real thing (dpkg, apt, the Debian
# maintainer scripts, systemd). The .rpm run installs Debian's rpm tool in the
# guest and upgrades with `rpm -U --nodeps` over an rpm install: it runs the
# package's own %post/%preun/%postun under systemd, on the same kernel and
# Slurm, but not on an RPM distribution (no RHEL systemd, SELinux or presets).
#
# env: UPGRADE_MODES (default "deb rpm"), BURST_N (steps per burst, default
#      100), BURST_PAR (steps of a burst in flight at once, default 25),
#      PLUGIN_TIMEOUT (the plugin's timeout= in the emulated guest, default 60), VM_MEM (MiB, default 4096 here), VM_TIMEOUT (s, default 1800),
#      VM_CACHE as for run-in-vm.sh, UPGRADE_ARTIFACTS (where the guest's logs,
#      audit file, probe and step outputs go; default NEW_DIR/../artifacts).
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
if [ $# -ne 4 ]; then sed -n '2,8p' "$0" >&2; exit 2; fi
OLD=$1 NEW=$2 GFOPEN=$3 CHECK=$4
CACHE=${VM_CACHE:-/var/tmp/gpufence-vm-cache}
ARTIFACTS=${UPGRADE_ARTIFACTS:-$(dirname "$NEW")/artifacts}
export VM_MEM=${VM_MEM:-4096} VM_TIMEOUT=${VM_TIMEOUT:-1800}

one() { # one GLOB DIR: the single file DIR/GLOB
	local f
	f=$(compgen -G "$2/$1") || { echo "upgrade.sh: no $1 in $2" >&2; exit 2; }
	[ "$(wc -l <<<"$f")" = 1 ] || { echo "upgrade.sh: more than one $1 in $2" >&2; exit 2; }
	echo "$f"
}

# Debian's rpm tool and its libraries that the image lacks, from the apt
# mirror, once (the guest has no network).
RPMTOOLS=$CACHE/rpmtools
rpm_tools() {
	[ -e "$RPMTOOLS/.done" ] && return 0
	rm -rf "$RPMTOOLS"; mkdir -p "$RPMTOOLS"
	local pkgs="rpm rpm-common librpm9 librpmio9 libpopt0 liblua5.3-0 libsqlite3-0"
	(cd "$RPMTOOLS" && apt-get download $pkgs >/dev/null 2>&1) ||
		{ apt-get update -q >/dev/null && (cd "$RPMTOOLS" && apt-get download $pkgs >/dev/null); }
	touch "$RPMTOOLS/.done"
}

rc=0
for mode in ${UPGRADE_MODES:-deb rpm}; do
	stage=$(mktemp -d)
	trap 'rm -rf "$stage"' EXIT
	echo "$mode" > "$stage/upgrade-mode"
	case $mode in
	deb)
		cp "$(one 'gpufence_*.deb' "$OLD")" "$stage/old.deb"
		cp "$(one 'gpufence_*.deb' "$NEW")" "$stage/new.deb"
		files=("$stage/old.deb" "$stage/new.deb")
		;;
	rpm)
		rpm_tools
		cp "$(one 'gpufence-*.rpm' "$OLD")" "$stage/old.rpm"
		cp "$(one 'gpufence-*.rpm' "$NEW")" "$stage/new.rpm"
		mkdir "$stage/rpmtools"; cp "$RPMTOOLS"/*.deb "$stage/rpmtools/"
		files=("$stage/old.rpm" "$stage/new.rpm" "$stage/rpmtools")
		;;
	*) echo "upgrade.sh: unknown mode $mode (deb or rpm)" >&2; exit 2 ;;
	esac
	cp "$GFOPEN" "$stage/gf-open"; cp "$CHECK" "$stage/upgradecheck"
	script=$stage/upgrade-node.sh
	{
		echo '#!/bin/bash'
		for v in BURST_N BURST_PAR PLUGIN_TIMEOUT; do
			[ -z "${!v:-}" ] || echo "export $v=${!v}"
		done
		tail -n +2 "$HERE/upgrade-node.sh"
	} > "$script"
	mkdir "$stage/artifacts"
	echo "=== $mode: $(basename "$(one "*.$mode" "$OLD")") -> $(basename "$(one "*.$mode" "$NEW")")"
	# VM_KEEP: the guest leaves its logs in the share's artifacts/.
	if VM_KEEP=1 "$HERE/run-in-vm.sh" "$script" "${files[@]}" "$stage/upgrade-mode" "$stage/gf-open" \
		"$stage/upgradecheck" "$stage/artifacts" 2> >(tee "$stage/vm.err" >&2); then
		echo "=== $mode: PASS"
	else
		echo "=== $mode: FAIL"; rc=1
	fi
	sleep 0.5 # the tee above
	run=$(sed -n 's/.*run dir kept: \([^ ]*\) .*/\1/p' "$stage/vm.err" | tail -1)
	if [ -n "$run" ] && [ -d "$run/share/artifacts" ]; then
		rm -rf "$ARTIFACTS/$mode"; mkdir -p "$ARTIFACTS"
		mv "$run/share/artifacts" "$ARTIFACTS/$mode"
		echo "=== $mode: logs in $ARTIFACTS/$mode"
		rm -rf "$run"
	fi
	rm -rf "$stage"; trap - EXIT
done
exit $rc
