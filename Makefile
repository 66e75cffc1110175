# gpufence — see README.md. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
CC ?= gcc
CLANG ?= clang
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The Slurm headers the SPANK entry is compiled against; its plugin_version
# (major.minor) must match the slurmd that loads it.
SLURM_INCLUDE ?= /usr/include
GO_LDFLAGS := -X github.com/gpufence/gpufence/agent/version.Version=$(VERSION)

BIN := bin
GPUFENCE := $(BIN)/gpufence
SPANK_C := $(BIN)/spank_gpufence.so
SPANK_GO := $(BIN)/spank_gpufence_go.so

.PHONY: help
help: ## list targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_-]+:.*## /{printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: $(GPUFENCE) $(SPANK_C) $(SPANK_GO) ## build the agent/CLI and the SPANK plugin

$(GPUFENCE): FORCE
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '$(GO_LDFLAGS)' -o $@ ./agent/cmd/gpufence

$(SPANK_GO): FORCE
	CGO_ENABLED=1 $(GO) build -trimpath -buildvcs=false -buildmode=c-shared -ldflags '$(GO_LDFLAGS)' -o $@ ./spank/goclient
	@rm -f $(BIN)/spank_gpufence_go.h

$(SPANK_C): $(wildcard spank/plugin/*.c spank/plugin/*.h spank/plugin/*.map) spank/goclient/goclient.h
	@mkdir -p $(BIN)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -I$(SLURM_INCLUDE) \
		-Wl,--version-script=spank/plugin/exports.map -o $@ $(filter %.c,$^) -ldl

GENERATED := '*.pb.go' '*_bpfel.go' '*_bpfel.o'

.PHONY: generate
generate: ## regenerate protobuf and bpf2go code (needs protoc, clang, llvm-strip)
	$(GO) generate ./proto/... ./bpf/...

.PHONY: check-generated
check-generated: generate ## fail when committed generated code is stale
	@git diff --exit-code --stat -- $(GENERATED) || { echo "generated code is stale: run make generate and commit" >&2; exit 1; }
	@test -z "$$(git status --porcelain --untracked-files=all -- $(GENERATED))" || { git status --short -- $(GENERATED); echo "generate left untracked files" >&2; exit 1; }

.PHONY: lint
lint: ## gofmt and go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

.PHONY: test
test: ## unit tests (-short: no Slurm cluster); as root the kernel tests run too, else they skip with the reason
	$(GO) test -short ./...

.PHONY: test-privileged
test-privileged: ## tests against the real kernel: BPF filter, cgroups, socket credentials (root)
	$(GO) test -count=1 -run Privileged ./agent/... ./bpf/... ./proto/... ./spank/...

.PHONY: e2e
e2e: build ## end-to-end tests against a real Slurm 22.05 on this machine (root; installs Slurm when missing)
	$(GO) test -count=1 -timeout 25m ./tests/...

.PHONY: test-all
test-all: lint build ## every test: unit, privileged and end-to-end (root)
	$(GO) test -count=1 -timeout 30m ./...

.PHONY: vm-test
vm-test: build ## production-like node in a throw-away VM: systemd, pure cgroup v2, kernel 6.1 (root; minutes; not in CI)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gf-open ./tests/cmd/gf-open
	tests/vm/run-in-vm.sh tests/vm/node-systemd.sh $(BIN)/gpufence $(BIN)/spank_gpufence.so $(BIN)/spank_gpufence_go.so $(BIN)/gf-open

.PHONY: demo
demo: build ## local Slurm with 4 fake GPUs showing isolation and the denial log (root)
	$(GO) run ./tests/cmd/gfcluster demo -bin $(BIN)

# BENCH_FLAGS: flags of tests/cmd/gfbench, e.g. BENCH_FLAGS=-quick or
# BENCH_FLAGS='-rounds 6 -runs 8 -out /tmp/b.json'.
BENCH_FLAGS ?=

.PHONY: bench
bench: build ## srun latency with/without gpufence, new job and step in an allocation (root; real Slurm)
	$(GO) run ./tests/cmd/gfbench -bin $(BIN) $(BENCH_FLAGS)

.PHONY: FORCE
FORCE:
