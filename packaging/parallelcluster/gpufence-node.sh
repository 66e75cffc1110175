#!/bin/bash
# Installs and sets up gpufence on an AWS ParallelCluster node.
#
#   gpufence-node.sh ROLE [PACKAGES]
#
# ROLE     image    while baking a custom AMI (pcluster build-image component):
#                   install the package and enable gpufence.socket, so the first job
#                   step starts the agent (slurm.conf only exists once the node has
#                   joined a cluster); start nothing.
#          compute  OnNodeConfigured of a compute queue: install unless baked in,
#                   start the agent, restart slurmd once so it runs the plugin's
#                   job prolog (a freshly configured node has no jobs yet).
#          login    a login node: install the package (srun/sbatch load the plugin);
#                   no agent runs there.
#          head     OnNodeConfigured of the head node: as login, then add the
#                   plugstack line to /opt/slurm/etc/plugstack.conf.d/ (NFS-shared
#                   with every node) and make plugstack.conf include that folder.
# PACKAGES where the gpufence .deb/.rpm are: a local file or folder, an s3:// prefix
#          (needs the aws CLI and the instance role's S3 read access) or an https://
#          URL of the package file. Not needed when the package is installed already.
#
# Safe to run again: every step checks before it changes anything.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail

ROOT="${GPUFENCE_ROOT:-}" # tests only: a folder standing in for /
SLURM_ETC="$ROOT/opt/slurm/etc"
PLUG_LINE="required /usr/lib/gpufence/spank_gpufence.so"

log() { echo "gpufence-node: $*"; }
die() { echo "gpufence-node: error: $*" >&2; exit 1; }

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }

installed() {
	if command -v dpkg-query >/dev/null 2>&1; then
		dpkg-query -W -f='${Status}' gpufence 2>/dev/null | grep -q "install ok installed"
	else
		rpm -q gpufence >/dev/null 2>&1
	fi
}

# fetch_package SOURCE: prints the path of a local package file for this
# distribution (deb where dpkg is the package manager, else rpm).
fetch_package() {
	local src="$1" ext tmp
	if command -v dpkg >/dev/null 2>&1; then ext=deb; else ext=rpm; fi
	tmp="$(mktemp -d /tmp/gpufence-pkg.XXXXXX)"
	case "$src" in
	s3://*)
		command -v aws >/dev/null 2>&1 || die "aws CLI not found; cannot read $src"
		if [[ "$src" == *."$ext" ]]; then
			aws s3 cp --quiet "$src" "$tmp/"
		else
			aws s3 cp --quiet --recursive --exclude '*' --include "gpufence*.$ext" "${src%/}/" "$tmp/"
		fi
		;;
	https://*)
		[[ "$src" == *."$ext" ]] || die "$src is not a .$ext; give the URL of the .$ext package"
		curl -fsSL --retry 3 -o "$tmp/${src##*/}" "$src"
		;;
	*)
		if [ -d "$src" ]; then
			cp "$src"/gpufence*."$ext" "$tmp/" 2>/dev/null || true
		elif [ -f "$src" ]; then
			[[ "$src" == *."$ext" ]] || die "$src is not a .$ext package"
			cp "$src" "$tmp/"
		else
			die "no such file or folder: $src"
		fi
		;;
	esac
	local found=("$tmp"/gpufence*."$ext")
	[ -f "${found[0]}" ] || die "no gpufence*.$ext found in $src"
	[ "${#found[@]}" -eq 1 ] || die "several gpufence*.$ext in $src: ${found[*]##*/}; keep one"
	echo "${found[0]}"
}

install_package() {
	if installed; then
		log "package gpufence already installed: $(gpufence version 2>/dev/null || echo unknown version)"
		return
	fi
	[ -n "${1:-}" ] || die "gpufence is not installed and no PACKAGES source was given"
	local pkg
	pkg="$(fetch_package "$1")"
	log "installing $pkg"
	if [[ "$pkg" == *.deb ]]; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y "$pkg"
	else
		dnf install -y "$pkg" 2>/dev/null || yum install -y "$pkg"
	fi
	rm -rf "$(dirname "$pkg")"
}

# head_plugstack makes the NFS-shared plugstack.conf include plugstack.conf.d
# and puts gpufence's line there. It never rewrites lines it did not write.
head_plugstack() {
	local conf="$SLURM_ETC/plugstack.conf" dir="$SLURM_ETC/plugstack.conf.d"
	[ -d "$SLURM_ETC" ] || die "$SLURM_ETC not found: is this a ParallelCluster head node?"
	mkdir -p "$dir"
	if [ ! -e "$conf" ]; then
		printf '# Written by gpufence-node.sh: one file per SPANK plugin in plugstack.conf.d/.\ninclude %s/*\n' "/opt/slurm/etc/plugstack.conf.d" >"$conf"
		chmod 0644 "$conf"
		log "created $conf including /opt/slurm/etc/plugstack.conf.d/*"
	elif ! grep -Eq '^[[:space:]]*include[[:space:]]+/opt/slurm/etc/plugstack\.conf\.d/\*' "$conf"; then
		# A glob include: Slurm skips it quietly where nothing matches.
		printf '\n# Added by gpufence-node.sh\ninclude /opt/slurm/etc/plugstack.conf.d/*\n' >>"$conf"
		log "added 'include /opt/slurm/etc/plugstack.conf.d/*' to $conf"
	fi
	if [ -e "$dir/gpufence.conf" ]; then
		log "$dir/gpufence.conf exists already (left as it is)"
		return
	fi
	local files=("$conf")
	shopt -s nullglob
	files+=("$dir"/*)
	shopt -u nullglob
	if grep -H 'spank_gpufence\.so' "${files[@]}"; then
		log "the spank_gpufence.so line above exists already (left as it is)"
		return
	fi
	printf '# gpufence: per-job GPU isolation. The .so lives on every node (package gpufence),\n# outside the NFS-shared /opt/slurm. Options: man 8 gpufence, docs/configuration.md.\n%s\n' "$PLUG_LINE" >"$dir/gpufence.conf"
	chmod 0644 "$dir/gpufence.conf"
	log "wrote $dir/gpufence.conf"
}

units() { # units enable|start|disable
	[ -d /run/systemd/system ] || { log "systemd is not running; skipping 'systemctl $1'"; return; }
	case "$1" in
	enable) systemctl enable gpufence.socket ;;
	start) systemctl enable --now gpufence.socket gpufence.service ;;
	disable) systemctl disable --now gpufence.socket gpufence.service ;;
	esac
}

main() {
	local role="${1:-}"
	case "$role" in
	-h | --help) usage; exit 0 ;;
	image | compute | login | head) ;;
	*) usage >&2; exit 2 ;;
	esac
	[ "$(id -u)" -eq 0 ] || die "run as root"
	case "$role" in
	image)
		install_package "${2:-}"
		units enable
		;;
	compute)
		install_package "${2:-}"
		units start
		if [ -d /run/systemd/system ] && systemctl is-active --quiet slurmd; then
			log "restarting slurmd once so that it runs gpufence's job prolog"
			systemctl restart slurmd
		fi
		gpufence doctor || log "gpufence doctor reported problems (above)"
		;;
	login)
		install_package "${2:-}"
		units disable
		;;
	head)
		install_package "${2:-}"
		units disable
		head_plugstack
		;;
	esac
}

if [ "${GPUFENCE_NODE_LIB:-}" != 1 ]; then
	main "$@"
fi
