#!/bin/sh
# release-repo.sh DIST PACKAGE... - the release folder of `make release`:
# the packages (.deb and .rpm of every arch) copied into DIST, SHA256SUMS
# over them, and DIST made both a flat apt repository (Packages,
# Packages.gz, Release; apt-ftparchive from apt-utils) and a yum/dnf
# repository (repodata/; createrepo_c). docs/packaging.md "Releases" shows
# the sources line and .repo file for it.
#
# env: RELEASE_GPG_KEY  a key id in gpg's keyring (GNUPGHOME): signs
#                       SHA256SUMS (SHA256SUMS.asc), Release (InRelease and
#                       Release.gpg) and repodata/repomd.xml (repomd.xml.asc),
#                       and exports the public key as gpufence-release.asc.
#                       Empty: nothing is signed.
#      SOURCE_DATE_EPOCH the yum metadata's revision and timestamps.
# SPDX-License-Identifier: Apache-2.0
set -eu

if [ $# -lt 2 ]; then
	sed -n '2,14p' "$0" >&2
	exit 2
fi
dist=$1
shift
key=${RELEASE_GPG_KEY:-}
log() { echo "release-repo: $*" >&2; }
die() {
	log "$*"
	exit 1
}
for tool in apt-ftparchive createrepo_c sha256sum gzip; do
	command -v "$tool" >/dev/null || die "$tool is not installed (tests/deps.sh installs apt-utils and createrepo-c)"
done
[ -z "$key" ] || command -v gpg >/dev/null || die "RELEASE_GPG_KEY is set but gpg is not installed"

mkdir -p "$dist"
for p in "$@"; do
	[ -f "$p" ] || die "$p: no such package"
	case $p in
	*.deb | *.rpm) ;;
	*) die "$p is neither a .deb nor a .rpm" ;;
	esac
	b=$(basename "$p")
	[ ! -e "$dist/$b" ] || die "$b given twice"
	cp "$p" "$dist/$b"
done

cd "$dist"
ls ./*.deb >/dev/null 2>&1 || die "no .deb among the packages"
ls ./*.rpm >/dev/null 2>&1 || die "no .rpm among the packages"
sha256sum -- *.deb *.rpm >SHA256SUMS

# apt: a flat repository (deb [signed-by=...] URL ./), Filename relative
# to this folder.
apt-ftparchive packages . >Packages 2>apt-ftparchive.log || die "apt-ftparchive packages: $(cat apt-ftparchive.log)"
rm -f apt-ftparchive.log
gzip -9n <Packages >Packages.gz
archs=$(sed -n 's/^Architecture: //p' Packages | sort -u | tr '\n' ' ')
apt-ftparchive \
	-o APT::FTPArchive::Release::Origin=gpufence \
	-o APT::FTPArchive::Release::Label=gpufence \
	-o APT::FTPArchive::Release::Suite=stable \
	-o APT::FTPArchive::Release::Codename=stable \
	-o "APT::FTPArchive::Release::Architectures=${archs% }" \
	-o APT::FTPArchive::Release::Description="gpufence release packages" \
	release . >Release.new
mv Release.new Release

# yum/dnf: repodata/ over the rpms of this folder.
epoch=${SOURCE_DATE_EPOCH:-0}
createrepo_c --quiet --no-database --revision "$epoch" --set-timestamp-to-revision . >/dev/null ||
	die "createrepo_c failed"

if [ -n "$key" ]; then
	g() { gpg --batch --yes --pinentry-mode loopback --passphrase '' --local-user "$key" "$@"; }
	g --armor --detach-sign --output SHA256SUMS.asc SHA256SUMS
	g --clearsign --output InRelease Release
	g --armor --detach-sign --output Release.gpg Release
	g --armor --detach-sign --output repodata/repomd.xml.asc repodata/repomd.xml
	gpg --batch --armor --export "$key" >gpufence-release.asc
	[ -s gpufence-release.asc ] || die "RELEASE_GPG_KEY $key: no public key to export"
	log "signed with $key"
fi
log "$(ls -- *.deb *.rpm | tr '\n' ' ')in $dist"
