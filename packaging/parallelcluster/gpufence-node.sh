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
# Options (anywhere after ROLE):
#   --cloudwatch        compute: the CloudWatch agent scrapes the gpufence agent,
#                       authenticated, and ships the audit log (docs/parallelcluster.md);
#                       head: the cluster's CloudWatch dashboard gpufence-CLUSTER
#   --sns-topic ARN     head, with --cloudwatch: also the idle-GPU alarm, notifying ARN
#
# Safe to run again: every step checks before it changes anything.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail

ROOT="${GPUFENCE_ROOT:-}" # tests only: a folder standing in for /
SLURM_ETC="$ROOT/opt/slurm/etc"
PLUG_LINE="required /usr/lib/gpufence/spank_gpufence.so"

log() { echo "gpufence-node: $*"; }
die() { echo "gpufence-node: error: $*" >&2; exit 1; }

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }

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

usage_error() {
	echo "gpufence-node: $*" >&2
	echo "Run '$0 --help' for usage." >&2
	exit 2
}

# valid KIND VALUE: VALUE goes into configuration files and AWS calls, so it
# must look like what AWS or ParallelCluster would give; anything else stops.
valid() {
	local re
	case "$1" in
	cluster) re='^[A-Za-z][A-Za-z0-9-]{0,59}$' ;;
	instance) re='^i-[0-9a-f]{8,17}$' ;;
	region) re='^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$' ;;
	sns) re='^arn:aws[a-z-]*:sns:[a-z]{2}(-[a-z]+)+-[0-9]{1,2}:[0-9]{12}:[A-Za-z0-9_-]{1,256}$' ;;
	esac
	[[ "$2" =~ $re ]] || die "not a valid $1 name: '$2'"
}

IMDS="${GPUFENCE_IMDS:-http://169.254.169.254}" # tests only: a stand-in endpoint
SHARE="$ROOT/usr/share/gpufence"
CW_CTL="$ROOT/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"

# imds PATH prints an instance metadata value, over IMDSv2 (a session token
# first), with short timeouts.
imds() {
	local token
	token="$(curl -fsS --max-time 2 -X PUT "$IMDS/latest/api/token" -H 'X-aws-ec2-metadata-token-ttl-seconds: 60')" ||
		die "no IMDSv2 token from $IMDS: is this an EC2 instance with instance metadata enabled?"
	curl -fsS --max-time 2 -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1" ||
		die "instance metadata $1 not readable from $IMDS"
}

# cluster_name prints the cluster's name from ParallelCluster's cfnconfig.
cluster_name() {
	local f="$ROOT/etc/parallelcluster/cfnconfig" name
	[ -r "$f" ] || die "$f not found: is this a ParallelCluster node?"
	name="$(sed -n 's/^cfn_cluster_name=["'"'"']\{0,1\}\([^"'"'"']*\)["'"'"']\{0,1\}[[:space:]]*$/\1/p' "$f" | tail -n1)"
	[ -n "$name" ] || die "$f has no cfn_cluster_name"
	valid cluster "$name"
	echo "$name"
}

# cloudwatch_node: the CloudWatch agent scrapes this node's gpufence agent
# with a password of this node's own (the per-job series are served only to
# an authenticated scraper) and ships the audit log. A password made on an
# earlier run is kept.
cloudwatch_node() {
	local etc="$ROOT/etc/gpufence" cluster iid pw hash changed=0
	[ -x "$CW_CTL" ] || die "the CloudWatch agent is not installed ($CW_CTL); ParallelCluster's AMIs have it"
	command -v htpasswd >/dev/null 2>&1 ||
		die "htpasswd not found (it makes the bcrypt hash): install httpd-tools (Amazon Linux, RHEL, Rocky) or apache2-utils (Ubuntu)"
	cluster="$(cluster_name)"
	iid="$(imds instance-id)"
	valid instance "$iid"
	install -d -m 0755 "$etc/cloudwatch"
	sed -e "s/__CLUSTER_NAME__/$cluster/g" -e "s/__INSTANCE_ID__/$iid/g" \
		"$SHARE/cloudwatch/prometheus.yaml" >"$etc/cloudwatch/prometheus.yaml.new"
	mv "$etc/cloudwatch/prometheus.yaml.new" "$etc/cloudwatch/prometheus.yaml"
	if [ -s "$etc/cloudwatch/metrics.password" ] && [ -s "$etc/metrics-web.yaml" ]; then
		log "the CloudWatch agent's metrics password exists already (kept)"
	else
		pw="$(head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')"
		hash="$(printf '%s' "$pw" | htpasswd -niBC 10 cloudwatch | cut -d: -f2)"
		[ -n "$hash" ] || die "htpasswd made no hash"
		(
			umask 077
			printf '%s' "$pw" >"$etc/cloudwatch/metrics.password"
			printf '# Written by gpufence-node.sh: the CloudWatch agent'"'"'s scrape (docs/parallelcluster.md).\nbasic_auth_users:\n  cloudwatch: %s\n' "$hash" >"$etc/metrics-web.yaml"
		)
		changed=1
		log "made the CloudWatch agent's metrics password and $etc/metrics-web.yaml"
	fi
	local conf="$etc/agent.yaml"
	if grep -Eq '^metrics:' "$conf" 2>/dev/null; then
		grep -Eq '^[[:space:]]+web_config:[[:space:]]*"?/etc/gpufence/metrics-web\.yaml"?[[:space:]]*$' "$conf" ||
			die "$conf has a metrics: section without web_config: /etc/gpufence/metrics-web.yaml; add that line to it (one metrics: key per file)"
	else
		printf '\n# Added by gpufence-node.sh: the CloudWatch agent scrapes with basic auth.\nmetrics:\n  web_config: /etc/gpufence/metrics-web.yaml\n' >>"$conf"
		changed=1
		log "set metrics.web_config in $conf"
	fi
	if [ "$changed" -eq 1 ] && [ -d /run/systemd/system ]; then
		systemctl restart gpufence
	fi
	# append-config keeps ParallelCluster's own CloudWatch configuration.
	"$CW_CTL" -a append-config -m ec2 -s -c "file:$SHARE/cloudwatch/amazon-cloudwatch-agent.json"
	log "the CloudWatch agent scrapes gpufence (cluster $cluster, instance $iid) and ships its audit log"
}

# cloudwatch_cluster [SNS_ARN]: the cluster's dashboard, and with an SNS topic
# the idle-GPU alarm. Both calls replace what has that name already.
cloudwatch_cluster() {
	local sns="${1:-}" cluster region tmp
	command -v aws >/dev/null 2>&1 || die "aws CLI not found; it creates the dashboard and alarm"
	cluster="$(cluster_name)"
	region="$(imds placement/region)"
	valid region "$region"
	tmp="$(mktemp -d /tmp/gpufence-cw.XXXXXX)"
	sed -e "s/__CLUSTER_NAME__/$cluster/g" -e "s/__REGION__/$region/g" \
		"$SHARE/cloudwatch/gpufence-dashboard.json" >"$tmp/dashboard.json"
	aws --region "$region" cloudwatch put-dashboard --dashboard-name "gpufence-$cluster" \
		--dashboard-body "file://$tmp/dashboard.json" >/dev/null || { rm -rf "$tmp"; die "put-dashboard failed"; }
	log "CloudWatch dashboard gpufence-$cluster in $region"
	if [ -n "$sns" ]; then
		sed -e "s/__CLUSTER_NAME__/$cluster/g" -e "s|__SNS_TOPIC_ARN__|$sns|g" \
			"$SHARE/cloudwatch/idle-gpu-alarm.json" >"$tmp/alarm.json"
		aws --region "$region" cloudwatch put-metric-alarm --cli-input-json "file://$tmp/alarm.json" ||
			{ rm -rf "$tmp"; die "put-metric-alarm failed"; }
		log "CloudWatch alarm gpufence-allocated-gpu-idle-1h-$cluster notifies $sns"
	else
		log "no --sns-topic: the idle-GPU alarm is not created"
	fi
	rm -rf "$tmp"
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
	local role="${1:-}" cloudwatch=0 sns="" pkgs=""
	case "$role" in
	-h | --help) usage; exit 0 ;;
	image | compute | login | head) shift ;;
	*) usage >&2; exit 2 ;;
	esac
	while [ $# -gt 0 ]; do
		case "$1" in
		--cloudwatch) cloudwatch=1 ;;
		--sns-topic)
			[ $# -ge 2 ] || usage_error "--sns-topic needs an SNS topic ARN"
			sns="$2"
			shift
			;;
		--sns-topic=*) sns="${1#--sns-topic=}" ;;
		-*) usage_error "unknown option $1" ;;
		*)
			[ -z "$pkgs" ] || usage_error "one PACKAGES source only (got $pkgs and $1)"
			pkgs="$1"
			;;
		esac
		shift
	done
	case "$role" in
	compute | head) ;;
	*) [ "$cloudwatch" -eq 0 ] || usage_error "--cloudwatch is for the compute and head roles" ;;
	esac
	if [ -n "$sns" ]; then
		[ "$role" = head ] && [ "$cloudwatch" -eq 1 ] || usage_error "--sns-topic goes with head --cloudwatch"
		valid sns "$sns"
	fi
	[ "$(id -u)" -eq 0 ] || die "run as root"
	case "$role" in
	image)
		install_package "$pkgs"
		units enable
		;;
	compute)
		install_package "$pkgs"
		units start
		if [ -d /run/systemd/system ] && systemctl is-active --quiet slurmd; then
			log "restarting slurmd once so that it runs gpufence's job prolog"
			systemctl restart slurmd
		fi
		[ "$cloudwatch" -eq 0 ] || cloudwatch_node
		gpufence doctor || log "gpufence doctor reported problems (above)"
		;;
	login)
		install_package "$pkgs"
		units disable
		;;
	head)
		install_package "$pkgs"
		units disable
		head_plugstack
		[ "$cloudwatch" -eq 0 ] || cloudwatch_cluster "$sns"
		;;
	esac
}

if [ "${GPUFENCE_NODE_LIB:-}" != 1 ]; then
	main "$@"
fi
