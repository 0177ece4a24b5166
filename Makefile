# kfpipe — see README.md. Every target works on a fresh machine: scripts/
# installs and starts what is missing.
SHELL := /usr/bin/env bash
GO    ?= go
BIN   ?= bin

.PHONY: all build test demo bench chaos soak up down vet fmt clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

## test: start real Kafka/Redis/etcd on loopback, go vet, go test -race.
test:
	scripts/test.sh

## demo: the whole pipeline in one process against embedded Kafka and Redis.
demo:
	$(GO) run ./cmd/kfpipe-demo $(DEMO_ARGS)

## bench: pipeline benchmarks against the real single-node broker.
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

vet:
	$(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)
