#!/usr/bin/env bash
# Run every Go fuzz target of the module, one after the other (go test can
# fuzz only one target per run).
#
#   scripts/fuzz.sh [SECONDS [REGEXP]]
#     SECONDS  fuzzing time per target (default 30)
#     REGEXP   only targets whose name matches (default: all)
#   scripts/fuzz.sh 5                   a smoke run, a few seconds each
#   scripts/fuzz.sh 300 Callback        the callback targets, 5 min each
#
# Targets are the `func FuzzXxx(` in *_test.go under internal/ and cmd/.
# Plain `go test` (make test) already replays every target's seeds (f.Add)
# and its corpus in <package>/testdata/fuzz/<Target>/; this script searches
# for new inputs. A failing input is written by go test to that corpus
# directory: commit it with the fix, and from then on every `go test` replays
# it. Targets that need Redis (FuzzAdminDecode) use KFPIPE_TEST_* when set,
# else the addresses `scripts/services.sh env` prints (start them with
# `make up`); without Redis they are skipped. Exits non-zero when any target
# failed, after running all of them.
set -euo pipefail
LOG_TAG=fuzz
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$REPO_ROOT"

secs=${1:-30}
filter=${2:-.}
[[ $secs =~ ^[0-9]+$ ]] && ((secs > 0)) || die "SECONDS must be a positive integer, got '$secs'"

if [[ -z ${KFPIPE_TEST_REDIS:-} ]]; then
  eval "$("$SCRIPTS_DIR/services.sh" env)"
fi
export KFPIPE_TEST_KAFKA KFPIPE_TEST_REDIS KFPIPE_TEST_ETCD

# "./internal/wecom FuzzCallback" lines, one per target.
mapfile -t targets < <(grep -rEo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+\(' internal cmd 2>/dev/null |
  sed -E 's#^(.*)/[^/]+_test\.go:func (Fuzz[A-Za-z0-9_]+)\($#./\1 \2#' | sort -u)
((${#targets[@]})) || die "no fuzz targets found"

failed=()
ran=0
for entry in "${targets[@]}"; do
  pkg=${entry% *}
  name=${entry#* }
  [[ $name =~ $filter ]] || continue
  ran=$((ran + 1))
  log "$name in $pkg for ${secs}s"
  if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "${secs}s" "$pkg"; then
    failed+=("$name ($pkg)")
  fi
done
((ran)) || die "no fuzz target matches '$filter'"
if ((${#failed[@]})); then
  log "FAILED: ${failed[*]} (the failing inputs are under <package>/testdata/fuzz/<Target>/)"
  exit 1
fi
log "$ran targets, ${secs}s each: no failure"
