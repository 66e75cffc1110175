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
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: $(GPUFENCE) $(SPANK_C) $(SPANK_GO) ## build the agent/CLI and the SPANK plugin

$(GPUFENCE): FORCE
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(GO_LDFLAGS)' -o $@ ./agent/cmd/gpufence

$(SPANK_GO): FORCE
	CGO_ENABLED=1 $(GO) build -trimpath -buildmode=c-shared -ldflags '$(GO_LDFLAGS)' -o $@ ./spank/goclient
	@rm -f $(BIN)/spank_gpufence_go.h

$(SPANK_C): $(wildcard spank/plugin/*.c spank/plugin/*.h spank/plugin/*.map) spank/goclient/goclient.h
	@mkdir -p $(BIN)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -I$(SLURM_INCLUDE) \
		-Wl,--version-script=spank/plugin/exports.map -o $@ $(filter %.c,$^) -ldl

.PHONY: FORCE
FORCE:
