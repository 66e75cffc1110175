// SPDX-License-Identifier: Apache-2.0

// Package pkgtest checks the gpufence .deb and .rpm that `make package`
// builds: lintian, rpmlint and systemd-analyze on the packages, their file
// lists against the agreed layout, the plugin built for each Slurm release,
// installs into a Debian 12 root (dpkg, and rpm --root) with their
// maintainer scripts, the man page against every command's flags, and the
// shipped configuration and link-plugin script. GPUFENCE_PACKAGE_DIR names
// a folder with ready packages; otherwise the tests run `make package` once.
package pkgtest
