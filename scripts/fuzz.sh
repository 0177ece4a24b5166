#!/usr/bin/env bash
# Run every Go fuzz target of the module, one after the other (go test can
# fuzz only one target per run).
#
#   scripts/fuzz.sh [BUDGET [REGEXP]]
#     BUDGET   per target: N (seconds) or Nx (executions); default 30
#     REGEXP   only targets whose name matches (default: all)
#   scripts/fuzz.sh 10000x              what make test runs: 10,000 inputs each
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
#
# A time budget has a known false alarm in Go's fuzz coordinator up to 1.26
# (go.dev/issue/75804): when the deadline fires while a worker is mid-input,
# the target FAILs with a bare "context deadline exceeded" and no input
# written. An execution budget (Nx) has no deadline, so make test uses one.
# With a time budget, a failure that wrote no input and says only "context
# deadline exceeded" is checked by replaying the target's corpus; it counts
# as that false alarm (and is logged as such) only when the replay passes.
set -euo pipefail
LOG_TAG=fuzz
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$REPO_ROOT"

budget=${1:-30}
filter=${2:-.}
case $budget in
  *x) [[ $budget =~ ^[1-9][0-9]*x$ ]] || die "BUDGET must be N (seconds) or Nx (executions), got '$budget'"
    fuzztime=$budget ;;
  *) [[ $budget =~ ^[1-9][0-9]*s?$ ]] || die "BUDGET must be N (seconds) or Nx (executions), got '$budget'"
    fuzztime=${budget%s}s ;;
esac

if [[ -z ${KFPIPE_TEST_REDIS:-} ]]; then
  eval "$("$SCRIPTS_DIR/services.sh" env)"
fi
export KFPIPE_TEST_KAFKA KFPIPE_TEST_REDIS KFPIPE_TEST_ETCD

# "./internal/wecom FuzzCallback" lines, one per target.
mapfile -t targets < <(grep -rEo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+\(' internal cmd 2>/dev/null |
  sed -E 's#^(.*)/[^/]+_test\.go:func (Fuzz[A-Za-z0-9_]+)\($#./\1 \2#' | sort -u)
((${#targets[@]})) || die "no fuzz targets found"

# deadline_false_alarm LOG PKG NAME: the failure in LOG is go.dev/issue/75804
# (bare deadline message, no input written) and the corpus replays cleanly.
deadline_false_alarm() {
  local log_file=$1 pkg=$2 name=$3
  [[ $fuzztime == *s ]] || return 1
  grep -q 'context deadline exceeded' "$log_file" || return 1
  ! grep -qE 'Failing input written|panic:|_test\.go:[0-9]+:' "$log_file" || return 1
  log "$name: bare 'context deadline exceeded' at the time limit, no input written; replaying its corpus"
  go test -count=1 -run "^${name}\$" "$pkg" >/dev/null || return 1
  log "$name: corpus replay passes: the fuzz coordinator's deadline false alarm (go.dev/issue/75804), not a finding"
}

out=$(mktemp)
trap 'rm -f "$out"' EXIT
failed=()
ran=0
for entry in "${targets[@]}"; do
  pkg=${entry% *}
  name=${entry#* }
  [[ $name =~ $filter ]] || continue
  ran=$((ran + 1))
  log "$name in $pkg for $fuzztime"
  # pipefail: the pipeline fails when go test does.
  if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg" 2>&1 | tee "$out"; then
    deadline_false_alarm "$out" "$pkg" "$name" || failed+=("$name ($pkg)")
  fi
done
((ran)) || die "no fuzz target matches '$filter'"
if ((${#failed[@]})); then
  log "FAILED: ${failed[*]} (the failing inputs are under <package>/testdata/fuzz/<Target>/)"
  exit 1
fi
log "$ran targets, $fuzztime each: no failure"
