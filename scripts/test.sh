#!/usr/bin/env bash
# What `make test` runs: start the services (those not already running), run
# `go vet ./...`, staticcheck and the Go tests against them, stop what this
# script started.
#
#   scripts/test.sh                  go test -race -count=1 -timeout 15m ./...
#   scripts/test.sh ./internal/foo/  go test $GO_TEST_FLAGS ./internal/foo/
#   GO_TEST_FLAGS='-count=1 -run TestX' scripts/test.sh ./...
#   KFPIPE_SKIP_VET=1                skip go vet and staticcheck
#   KFPIPE_KEEP_SERVICES=1           leave the services running afterwards
#   KFPIPE_SKIP_IMAGE=1              skip the image and package check (scripts/image-check.sh)
#   KFPIPE_FUZZ=BUDGET               fuzz each target after the tests: Nx inputs or N s
#                                    (default 10000x; 0 = off; see scripts/fuzz.sh)
# Output is also written to .run/test.log.
set -euo pipefail
LOG_TAG=test
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$REPO_ROOT"
mkdir -p "$RUN_DIR"

use_services
log "KFPIPE_TEST_KAFKA=$KFPIPE_TEST_KAFKA KFPIPE_TEST_REDIS=$KFPIPE_TEST_REDIS KFPIPE_TEST_REDIS_CLUSTER=${KFPIPE_TEST_REDIS_CLUSTER:-} KFPIPE_TEST_ETCD=$KFPIPE_TEST_ETCD"

if [[ ${KFPIPE_SKIP_VET:-} != 1 ]]; then
  log "go vet ./..."
  go vet ./...
  # staticcheck is a tool of the module (go.mod's tool directive): the
  # version is pinned there and go.sum, and its cache makes a rerun quick.
  log "staticcheck ./..."
  go tool staticcheck ./...
  # go.mod and go.sum as `go mod tidy` would write them, in both modules:
  # a tool directive's new dependency otherwise leaves go.sum short unseen.
  log "go mod tidy -diff (root, examples/)"
  go mod tidy -diff
  (cd examples && go mod tidy -diff)
fi

# shellcheck disable=SC2206
flags=(${GO_TEST_FLAGS:--race -count=1 -timeout 15m})
(($#)) || set -- ./...
set +e
if [[ $* == ./... ]]; then
  # The chaos scenarios run after the other packages, not beside them: on
  # two cores the race-detector builds of the rest starved the broker into
  # consumer-group session timeouts the scenarios did not inject.
  mapfile -t pkgs < <(go list ./... | grep -v '/internal/chaos$')
  log "go test ${flags[*]} ./... (internal/chaos last, alone)"
  go test "${flags[@]}" "${pkgs[@]}" 2>&1 | tee "$RUN_DIR/test.log"
  status=${PIPESTATUS[0]}
  # The scenarios run one after another in one process: their own bound.
  go test "${flags[@]}" -timeout "${KFPIPE_CHAOS_TIMEOUT:-30m}" ./internal/chaos/ 2>&1 | tee -a "$RUN_DIR/test.log"
  chaos=${PIPESTATUS[0]}
  ((status != 0)) || status=$chaos
else
  log "go test ${flags[*]} $*"
  go test "${flags[@]}" "$@" 2>&1 | tee "$RUN_DIR/test.log"
  status=${PIPESTATUS[0]}
fi
set -e
# A few seconds of coverage-guided fuzzing per target (make chaos runs them
# longer). An execution budget, not a time one: see scripts/fuzz.sh.
fuzz=${KFPIPE_FUZZ:-10000x}
if ((status == 0)) && [[ $fuzz != 0 && $* == ./... ]]; then
  "$SCRIPTS_DIR/fuzz.sh" "$fuzz" || status=$?
fi
exit "$status"
