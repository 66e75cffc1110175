# gpufence — see README.md. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
CC ?= gcc
CLANG ?= clang
# Release tags are vMAJOR.MINOR.PATCH[-PRERELEASE] (packaging/pkg-version.sh
# turns this into the package version and rejects other v* tags).
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' --always --dirty 2>/dev/null || echo dev)
# The Slurm headers the SPANK entry is compiled against; its plugin_version
# (major.minor) must match the slurmd that loads it.
SLURM_INCLUDE ?= /usr/include
GO_LDFLAGS := -X github.com/gpufence/gpufence/agent/version.Version=$(VERSION)

BIN := bin
GPUFENCE := $(BIN)/gpufence
SPANK_C := $(BIN)/spank_gpufence.so

.PHONY: help
help: ## list targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_-]+:.*## /{printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: $(GPUFENCE) $(SPANK_C) ## build the agent/CLI and the SPANK plugin

# cgo: NVML (go-nvml calls libnvidia-ml.so.1, loaded at run time) and user
# names from NSS (LDAP, SSSD) need libc. glibc >= 2.34, as for the plugin.
# nvml.h marks functions gpufence never calls as deprecated; go-nvml wraps
# them all, and the warnings would bury the build log.
GPUFENCE_CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations
$(GPUFENCE): FORCE
	CGO_CFLAGS='$(GPUFENCE_CGO_CFLAGS)' CGO_ENABLED=1 $(GO) build -buildmode=pie -trimpath -buildvcs=false -ldflags '$(GO_LDFLAGS)' -o $@ ./agent/cmd/gpufence

# Also used by packaging/build-plugins.sh for the per-Slurm-version builds.
SPANK_CFLAGS := -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -shared

$(SPANK_C): $(wildcard spank/plugin/*.c spank/plugin/*.h spank/plugin/*.map)
	@mkdir -p $(BIN)
	$(CC) $(SPANK_CFLAGS) -I$(SLURM_INCLUDE) \
		-Wl,--version-script=spank/plugin/exports.map -o $@ $(filter %.c,$^)

GENERATED := '*.pb.go' '*_bpfel.go' '*_bpfel.o'

.PHONY: generate
generate: ## regenerate protobuf and bpf2go code (needs protoc, clang, llvm-strip)
	$(GO) generate ./proto/... ./bpf/...

.PHONY: check-generated
check-generated: generate ## fail when committed generated code is stale
	@git diff --exit-code --stat -- $(GENERATED) || { echo "generated code is stale: run make generate and commit" >&2; exit 1; }
	@test -z "$$(git status --porcelain --untracked-files=all -- $(GENERATED))" || { git status --short -- $(GENERATED); echo "generate left untracked files" >&2; exit 1; }

# The pinned part of the OCSF schema the OCSF output is validated against
# (tests/ocsf/schema/SOURCE names the release): from a clone
# of https://github.com/ocsf/ocsf-schema, e.g.
# make ocsf-schema OCSF_SCHEMA_REPO=../ocsf-schema OCSF_SCHEMA_TAG=1.8.0
OCSF_SCHEMA_REPO ?= ../ocsf-schema
OCSF_SCHEMA_TAG ?= 1.8.0

.PHONY: ocsf-schema
ocsf-schema: ## re-create the pinned OCSF schema copy from a clone (OCSF_SCHEMA_REPO, OCSF_SCHEMA_TAG)
	tests/ocsf/refresh-schema.sh $(OCSF_SCHEMA_REPO) $(OCSF_SCHEMA_TAG)

.PHONY: lint
lint: ## gofmt and go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

.PHONY: test
test: ## unit tests (-short: no Slurm cluster); as root the kernel tests run too, else they skip with the reason
	$(GO) test -short ./...

.PHONY: man-check
man-check: ## every gpufence command and flag has its place in packaging/man/gpufence.8 (also part of test)
	$(GO) test -count=1 -run 'TestManPage' ./agent/cmd/gpufence

.PHONY: test-privileged
test-privileged: ## tests against the real kernel: BPF filter, cgroups, socket credentials (root)
	$(GO) test -count=1 -run Privileged ./agent/... ./bpf/... ./proto/... ./spank/...

# The Slurm release the end-to-end tests run against (tests/slurmrel): empty
# is this machine's Debian 22.05; 25.11, 26.05+jobidpaths, 25.11+slice,
# 23.11+pcluster, ... run that release's own daemons (a source build, once
# per machine, or a Debian root). The tests read it as GPUFENCE_SLURM.
SLURM ?=
# What `make e2e-matrix` runs.
MATRIX ?= 22.05 23.11 24.05 24.11 25.11 25.11+slice 26.05 26.05+jobidpaths 23.11+pcluster 24.05+pcluster 25.11+pcluster

.PHONY: e2e
e2e: build ## end-to-end tests against a real Slurm on this machine, 22.05 or SLURM=25.11 (root; installs/builds Slurm when missing)
	GPUFENCE_SLURM='$(SLURM)' $(GO) test -count=1 -timeout 40m $(if $(SLURM),./tests/cluster ./tests/e2e,./tests/...)

.PHONY: e2e-matrix
e2e-matrix: build ## the e2e suite on every release in MATRIX; prints release x scenario, writes build/e2e-matrix.json (root; an hour)
	$(GO) run ./tests/cmd/gfmatrix -out build/e2e-matrix.json $(MATRIX)

# Fuzzing: every `func FuzzXxx(f *testing.F)` in the module's tests is found
# and run for FUZZTIME (Go's -fuzztime: 30s, or 10000x executions); FUZZ
# picks targets by whole name, an extended regular expression such as
# 'FuzzRead|FuzzCtld.*' (no $ needed; make would eat it). Packages with cgo (the C
# parsers' harness) run under AddressSanitizer. Each target's last
# execution count is printed; a crash, hang or failed property fails the
# target, saves the input under its testdata/fuzz/, and make fails after
# the rest have run. FUZZMINIMIZETIME bounds the shrinking of each new
# input (Go's default of 60s would spend a short run shrinking, not fuzzing).
FUZZTIME ?= 10s
FUZZ ?= Fuzz.*
FUZZMINIMIZETIME ?= 1s

.PHONY: fuzz
fuzz: ## run every Fuzz target in the tree for FUZZTIME each (default 10s; FUZZ='FuzzA|FuzzB.*' picks targets)
	@set -uo pipefail; failed=0; n=0; \
	cgo=" $$($(GO) list -f '{{if .CgoFiles}}{{.Dir}}{{end}}' ./... | tr '\n' ' ') "; \
	while read -r dir files; do \
		for name in $$(cd "$$dir" && sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*\*testing\.F).*/\1/p' $$files); do \
			echo "$$name" | grep -Eqx -- '($(FUZZ))' || continue; \
			flags=; case "$$cgo" in *" $$dir "*) flags=-asan;; esac; \
			pkg=./$${dir#$(CURDIR)/}; n=$$((n+1)); \
			log=$$(mktemp); note=; \
			fuzz1() { $(GO) test $$flags -run '^$$' -fuzz "^$$name\$$" -fuzztime "$$1" -fuzzminimizetime '$(FUZZMINIMIZETIME)' "$$pkg" >"$$log" 2>&1; }; \
			fuzz1 '$(FUZZTIME)'; rc=$$?; \
			if [ $$rc -ne 0 ] && grep -q 'context deadline exceeded' "$$log" && ! grep -Eq 'Failing input written|panic:|_test.go:[0-9]+:' "$$log"; then \
				execs=$$(grep -o 'execs: [0-9]*' "$$log" | tail -1 | tr -dc 0-9); [ "$${execs:-0}" -ge 1000 ] || execs=1000; \
				note=" (retried once as $${execs}x: Go's fuzz coordinator reported its own -fuzztime deadline, golang/go#75804, fixed in Go 1.27; a count has no deadline to race; no failing input)"; \
				fuzz1 "$${execs}x"; rc=$$?; \
			fi; \
			if [ $$rc -eq 0 ]; then \
				printf '%-28s %-22s %s%s\n' "$$pkg" "$$name" "$$(grep -o 'execs: [0-9]*' "$$log" | tail -1)" "$$note"; \
			else \
				cat "$$log"; echo "FAIL $$pkg $$name" >&2; failed=$$((failed+1)); \
			fi; \
			rm -f "$$log"; \
		done; \
	done < <($(GO) list -f '{{.Dir}}{{range .TestGoFiles}} {{.}}{{end}}{{range .XTestGoFiles}} {{.}}{{end}}' ./... | awk 'NF > 1'); \
	[ $$n -gt 0 ] || { echo "no Fuzz target matches FUZZ=$(FUZZ)" >&2; exit 1; }; \
	[ $$failed -eq 0 ] || { echo "$$failed of $$n fuzz targets failed" >&2; exit 1; }; \
	echo "$$n fuzz targets passed, $(FUZZTIME) each"

.PHONY: test-all
test-all: lint build test-nonroot ## every test: unit, privileged and end-to-end (root)
	$(GO) test -count=1 -timeout 45m ./...

.PHONY: test-nonroot
test-nonroot: ## the request stages' tests as uid 65534, each package >= MIN_COVER (70) % covered (run as root; it drops)
	./tests/nonroot.sh

.PHONY: vm-test
vm-test: build ## production-like node in a throw-away VM: systemd, pure cgroup v2, kernel 6.1 (root; minutes; not in CI)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gf-open ./tests/cmd/gf-open
	tests/vm/run-in-vm.sh tests/vm/node-systemd.sh $(BIN)/gpufence $(BIN)/spank_gpufence.so $(BIN)/gf-open

.PHONY: vm-slurmd-boot-test
vm-slurmd-boot-test: build ## the shipped units' boot order (agent before slurmd) on an AutoDetect node: the table comes from slurmd once it runs, in a throw-away VM (root; ~2 min; not in CI)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gf-open ./tests/cmd/gf-open
	tests/vm/run-in-vm.sh tests/vm/slurmd-boot.sh $(BIN)/gpufence $(BIN)/spank_gpufence.so $(BIN)/gf-open \
		packaging/systemd/gpufence.service packaging/systemd/gpufence.socket

.PHONY: vm-package-test
vm-package-test: package ## install the .deb in a throw-away systemd VM and check units, enforcement, doctor, removal (root; ~80 s; not in CI)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gf-open ./tests/cmd/gf-open
	tests/vm/run-in-vm.sh tests/package/vm-deb.sh $(DIST)/gpufence_*.deb $(BIN)/gf-open

# Two packages of this tree that differ only in their version (the older one
# is VERSION-vmold, PKG_VERSION~vmold, which sorts below), so that the upgrade
# runs the maintainer scripts as a real one does.
VM_UPGRADE := build/vm-upgrade

.PHONY: vm-upgrade-test
vm-upgrade-test: ## apt install ./newer.deb, rpm -U and systemctl restart under a probing job and 100-step bursts, in a throw-away systemd VM (root; ~25 min a format on 2 cores)
	rm -rf $(VM_UPGRADE)/old $(VM_UPGRADE)/new
	$(MAKE) package DIST=$(VM_UPGRADE)/old VERSION='$(VERSION)-vmold' PKG_VERSION='$(PKG_VERSION)~vmold'
	$(MAKE) package DIST=$(VM_UPGRADE)/new VERSION='$(VERSION)' PKG_VERSION='$(PKG_VERSION)'
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gf-open ./tests/cmd/gf-open
	CGO_ENABLED=0 $(GO) build -o $(BIN)/upgradecheck ./tests/vm/upgradecheck
	tests/vm/upgrade.sh $(VM_UPGRADE)/old $(VM_UPGRADE)/new $(BIN)/gf-open $(BIN)/upgradecheck

# What tests/all.sh runs with GPUFENCE_VM_UPGRADE=ci: the .deb only, bursts
# of 20 steps.
.PHONY: vm-upgrade-ci
vm-upgrade-ci: ## the VM upgrade test sized for CI: deb, 20-step bursts (root)
	UPGRADE_MODES=deb BURST_N=20 BURST_PAR=10 $(MAKE) vm-upgrade-test

.PHONY: gpu-test
gpu-test: build ## on a machine with an NVIDIA GPU: inventory vs nvidia-smi, a process without the GPU cannot use it (root; exit 77 = no driver)
	CGO_ENABLED=1 $(GO) build -o $(BIN)/gpucheck ./tests/gpu/gpucheck
	tests/gpu/run.sh

.PHONY: demo
demo: build ## local Slurm with 4 fake GPUs showing isolation and the denial log (root)
	$(GO) run ./tests/cmd/gfcluster demo -bin $(BIN)

# make bench: none / ConstrainDevices=yes / gpufence side by side in one run
# (tests/cmd/gfbench; docs/architecture.md "Step launch cost" tells how to
# read it): new job, step in an allocation, settle times, a burst of 50
# concurrent steps, and the agent's own latency per request type. The table
# goes to stdout, everything (samples, summary, targets) to BENCH_OUT.
# About 10 minutes; BENCH_FLAGS=-quick checks that it works in about 2.
# BENCH_FLAGS: flags of tests/cmd/gfbench, e.g. BENCH_FLAGS=-noop adds a
# SPANK plugin that does nothing as a fourth variant (what Slurm spends on
# any prolog/epilog plugin), BENCH_FLAGS='-rounds 12 -runs 6'
# (go run ./tests/cmd/gfbench -h lists them).
BENCH_FLAGS ?=
BENCH_OUT ?= build/bench.json

.PHONY: bench
bench: build ## launch cost of none / ConstrainDevices=yes / gpufence side by side; table, and JSON in BENCH_OUT=build/bench.json (root; real Slurm; ~10 min, BENCH_FLAGS=-quick ~2)
	$(GO) run ./tests/cmd/gfbench -bin $(BIN) -out $(BENCH_OUT) $(BENCH_FLAGS)

# Packages (docs/packaging.md). The SPANK entry is built once per Slurm
# release listed in packaging/slurm-releases (one line each), against that
# release's own headers: Debian's libslurm-dev where Debian has the release,
# else the release's source tarball in SLURM_SRC_DIR (checked against its
# SHA256SUMS), fetched or unpacked once into SLURM_HEADER_CACHE.
# SLURM_RELEASES='22.05 24.11' builds some only; SLURM_HEADER_DIRS replaces
# the list with header folders of your own; SLURM_EXTRA_HEADER_DIRS adds
# some, e.g. ParallelCluster's:
#   make package SLURM_EXTRA_HEADER_DIRS=/opt/slurm/include
# CGO_ENABLED=0 where it runs: nfpm needs no cgo, and CC may be a cross
# compiler for the packages' arch.
NFPM ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
DIST ?= dist
PKG_BUILD := build/pkg
SLURM_HEADER_CACHE ?= build/slurm-headers
SLURM_HEADER_DIRS ?=
SLURM_EXTRA_HEADER_DIRS ?=
export SLURM_RELEASES SLURM_SRC_DIR
# Reproducible builds: file times in the packages are the last commit's.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
# Empty when VERSION's tag is not a release tag: the package recipes then
# run pkg-version.sh again for its error.
PKG_VERSION ?= $(shell packaging/pkg-version.sh '$(VERSION)' '$(SOURCE_DATE_EPOCH)' 2>/dev/null)
CHECK_PKG_VERSION = @test -n '$(PKG_VERSION)' || { packaging/pkg-version.sh '$(VERSION)' '$(SOURCE_DATE_EPOCH)' >/dev/null; exit 1; }
# The Go and Debian name of the architecture (nfpm writes rpm's names:
# amd64 -> x86_64, arm64 -> aarch64). Another one than this machine's
# needs CC (and STRIP) of a cross compiler: `make release` passes them.
PKG_ARCH ?= $(shell $(GO) env GOARCH)
STRIP ?= strip
PKG_MAINTAINER ?= gpufence maintainers <gpufence@users.noreply.github.com>
# Same output wherever the tree is checked out.
PKG_CFLAGS := $(SPANK_CFLAGS) -ffile-prefix-map=$(CURDIR)=.
PKG_GO_LDFLAGS := -s -w $(GO_LDFLAGS)

.PHONY: slurm-headers
slurm-headers: ## fetch or unpack the headers of every release in packaging/slurm-releases into build/slurm-headers, once, checked
	SLURM_INCLUDE='$(SLURM_INCLUDE)' packaging/release-headers.sh $(SLURM_HEADER_CACHE) >/dev/null

.PHONY: plugins
plugins: ## the SPANK entry for every release in packaging/slurm-releases: build/pkg/lib/slurm-X.Y/
	rm -rf $(PKG_BUILD)/lib
	dirs='$(SLURM_HEADER_DIRS)'; \
	[ -n "$$dirs" ] || dirs=$$(SLURM_INCLUDE='$(SLURM_INCLUDE)' packaging/release-headers.sh $(SLURM_HEADER_CACHE)) || exit 1; \
	CC='$(CC)' STRIP='$(STRIP)' SPANK_CFLAGS='$(PKG_CFLAGS)' packaging/build-plugins.sh $(PKG_BUILD)/lib $$dirs $(SLURM_EXTRA_HEADER_DIRS)

PLUGIN_DIR ?= build/plugins

.PHONY: plugin
plugin: ## one SPANK entry from SLURM_INCLUDE (e.g. /opt/slurm/include): build/plugins/slurm-X.Y/spank_gpufence.so
	CC='$(CC)' SPANK_CFLAGS='$(PKG_CFLAGS)' packaging/build-plugins.sh $(PLUGIN_DIR) $(SLURM_INCLUDE)

.PHONY: package
package: check-pkg-version plugins ## .deb and .rpm in dist/ with nfpm (docs/packaging.md)
	CGO_CFLAGS='$(GPUFENCE_CGO_CFLAGS)' CGO_ENABLED=1 CC='$(CC)' GOARCH='$(PKG_ARCH)' $(GO) build -buildmode=pie -trimpath -buildvcs=false -ldflags '$(PKG_GO_LDFLAGS)' -o $(PKG_BUILD)/gpufence ./agent/cmd/gpufence
	gzip -9n < packaging/man/gpufence.8 > $(PKG_BUILD)/gpufence.8.gz
	packaging/changelog.sh '$(PKG_VERSION)' '$(VERSION)' '$(SOURCE_DATE_EPOCH)' '$(PKG_MAINTAINER)' > $(PKG_BUILD)/changelog.yml
	packaging/nfpm-config.sh > $(PKG_BUILD)/nfpm.yaml
	mkdir -p $(DIST)
	rm -f $(DIST)/gpufence_*.deb $(DIST)/gpufence-*.rpm
	for p in deb rpm; do \
		SOURCE_DATE_EPOCH='$(SOURCE_DATE_EPOCH)' PKG_VERSION='$(PKG_VERSION)' PKG_ARCH='$(PKG_ARCH)' \
		PKG_MAINTAINER='$(PKG_MAINTAINER)' \
		CGO_ENABLED=0 $(NFPM) package --config $(PKG_BUILD)/nfpm.yaml --packager $$p --target $(DIST)/ || exit 1; \
	done
	@cd $(DIST) && sha256sum gpufence_*.deb gpufence-*.rpm

# `make release` (docs/packaging.md "Releases"): what a tag v* publishes.
# The packages of every arch in RELEASE_ARCHES (each `make package` with
# that arch's cross compiler), SHA256SUMS, and the folder made an apt (flat)
# and a yum repository, all in RELEASE_DIST. With RELEASE_GPG_KEY (a key id
# of GNUPGHOME's keyring, no passphrase, or gpg-agent holding it) the rpms,
# SHA256SUMS, Release/InRelease and repomd.xml are signed and the public key
# is exported as gpufence-release.asc.
RELEASE_DIST ?= dist/release
RELEASE_BUILD := build/release
RELEASE_ARCHES ?= amd64 arm64
RELEASE_GPG_KEY ?=
RELEASE_CC_amd64 ?= x86_64-linux-gnu-gcc
RELEASE_CC_arm64 ?= aarch64-linux-gnu-gcc
RELEASE_STRIP_amd64 ?= x86_64-linux-gnu-strip
RELEASE_STRIP_arm64 ?= aarch64-linux-gnu-strip
RELEASE_KEY_FILE := $(RELEASE_BUILD)/signing-key.asc
RELEASE_KEY_EXPORT = (umask 077; gpg --batch --pinentry-mode loopback --passphrase '' --armor \
	--export-secret-keys '$(RELEASE_GPG_KEY)' > $(RELEASE_KEY_FILE)) && test -s $(RELEASE_KEY_FILE) || \
	{ echo "RELEASE_GPG_KEY=$(RELEASE_GPG_KEY): no secret key in gpg's keyring (GNUPGHOME)" >&2; exit 1; }

.PHONY: check-pkg-version
check-pkg-version:
	$(CHECK_PKG_VERSION)

.PHONY: release
release: check-pkg-version ## deb and rpm for amd64 and arm64, SHA256SUMS, apt and yum repository in dist/release; signed with RELEASE_GPG_KEY=<keyid> (docs/packaging.md)
	rm -rf $(RELEASE_DIST) $(RELEASE_BUILD)
	mkdir -p $(RELEASE_BUILD)
	@# The secret key nfpm signs the rpms with lives only as long as the builds.
	trap 'rm -f $(RELEASE_KEY_FILE)' EXIT; \
	$(if $(RELEASE_GPG_KEY),$(RELEASE_KEY_EXPORT);) \
	$(foreach a,$(RELEASE_ARCHES),$(MAKE) --no-print-directory package PKG_ARCH=$(a) \
		CC='$(RELEASE_CC_$(a))' STRIP='$(RELEASE_STRIP_$(a))' DIST=$(RELEASE_BUILD)/$(a) \
		VERSION='$(VERSION)' PKG_VERSION='$(PKG_VERSION)' SOURCE_DATE_EPOCH='$(SOURCE_DATE_EPOCH)' \
		$(if $(RELEASE_GPG_KEY),GPUFENCE_RPM_SIGNING_KEY=$(RELEASE_KEY_FILE)) && ) true
	SOURCE_DATE_EPOCH='$(SOURCE_DATE_EPOCH)' RELEASE_GPG_KEY='$(RELEASE_GPG_KEY)' \
		packaging/release-repo.sh $(RELEASE_DIST) $(foreach a,$(RELEASE_ARCHES),$(RELEASE_BUILD)/$(a)/gpufence_* $(RELEASE_BUILD)/$(a)/gpufence-*)

.PHONY: FORCE
FORCE:
