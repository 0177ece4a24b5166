# kfpipe — see README.md. Every target works on a fresh machine: scripts/
# installs and starts what is missing.
SHELL := /usr/bin/env bash
GO    ?= go
BIN   ?= bin

.PHONY: all build test demo bench chaos soak up down vet fmt clean image package image-check config-docs

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

## test: start real Kafka/Redis/etcd on loopback, go vet, go test -race.
test:
	scripts/test.sh

## demo: the whole pipeline in one process against embedded Kafka and Redis.
demo:
	$(GO) run ./cmd/kfpipe-demo $(DEMO_ARGS)

## bench: pipeline benchmarks against the real single-node broker, single Redis
## and Redis Cluster (the state scenario's Cluster rows).
bench:
	scripts/bench.sh

## chaos: the full fault-injection suite.
chaos:
	scripts/chaos.sh

## soak: 30 minutes at 2k msg/s with failures and a bot, sampled and plotted (not in CI).
soak:
	scripts/soak.sh

## up/down: real local Kafka + Redis + etcd for running the daemons by hand.
up:
	scripts/services.sh up

down:
	scripts/services.sh down

## image: the container image (static binaries, CA certs, tzdata; non-root),
## tagged $(IMAGE):$(VERSION). See Containerfile and scripts/image.sh.
IMAGE   ?= kfpipe/kfpipe
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
image:
	IMAGE=$(IMAGE) VERSION=$(VERSION) scripts/image.sh

## package: the .deb for systemd hosts (binaries, units, config, kfpipe user) in $(BIN)/.
package:
	VERSION=$(VERSION) scripts/package.sh

## image-check: build both, run the daemons from the image against the test
## services, install and remove the .deb (make test runs it too).
image-check:
	scripts/image-check.sh

## config-docs: regenerate docs/config.md from internal/config's schema
## (a test fails when it is out of date).
config-docs:
	$(GO) test ./internal/config -run '^TestReferenceUpToDate$$' -count=1 -update

vet:
	$(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)
