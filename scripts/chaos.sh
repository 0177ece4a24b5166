#!/usr/bin/env bash
# What `make chaos` runs: the full fault-injection suite (internal/chaos)
# against real services, with the full-size scenarios enabled. It starts
# the services that are not running (and stops those it started), runs
#   go test -v -run 'TestChaos' -count=1 -timeout 120m ./internal/chaos/...
# with KFPIPE_CHAOS_FULL=1, and prints one line per scenario at the end:
#   scenario=<name> sent=N effects=N dlq=N lost=0 dup=0 reordered=0 duration=… …
#
#   CHAOS_RUN='TestChaosRedisOutage'   run only the matching scenarios
#   KFPIPE_CHAOS_FULL=0                the reduced sizes (as in make test)
#   KFPIPE_KEEP_SERVICES=1             leave the services running afterwards
# The nemesis (TestChaosNemesis) is one of the scenarios: 30 minutes of a
# seeded random schedule of every fault kind, one checker over the run,
# its verdict line (lost=0 dup=0 reordered=0 replies_dup=0 …) in the
# report. The nemesis alone, or a seed replayed:
#   CHAOS_RUN='TestChaosNemesis$' make chaos
#   KFPIPE_NEMESIS_SEED=<seed> CHAOS_RUN='TestChaosNemesis$' make chaos
#   KFPIPE_NEMESIS_DURATION=10m        a shorter (or longer) schedule
#   KFPIPE_NEMESIS_KINDS=a,b           only these fault kinds (minimizing)
#   KFPIPE_NEMESIS_KAFKA=shared        on the shared broker (no broker kinds)
#   KFPIPE_NEMESIS_REDIS=sentinel      on Redis Sentinel, with sentinel-failover
#                                      (TestChaosNemesisSentinel runs 10 min of it)
# A failing run prints its replay: one make chaos command.
# Output is also written to .run/chaos.log, the scenario lines to
# .run/chaos-report.txt.
set -euo pipefail
LOG_TAG=chaos
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$REPO_ROOT"
mkdir -p "$RUN_DIR"

use_services
export KFPIPE_CHAOS_FULL="${KFPIPE_CHAOS_FULL:-1}"
report="$RUN_DIR/chaos-report.txt"
: >"$report"
export KFPIPE_CHAOS_REPORT="$report"

run=${CHAOS_RUN:-TestChaos}
# 120 min: the scenarios and the nemesis's 30 minutes.
log "go test -v -run '$run' -count=1 -timeout 120m ./internal/chaos/... (KFPIPE_CHAOS_FULL=$KFPIPE_CHAOS_FULL)"
set +e
go test -v -run "$run" -count=1 -timeout 120m ./internal/chaos/... 2>&1 | tee "$RUN_DIR/chaos.log"
status=${PIPESTATUS[0]}
if [[ -z ${CHAOS_RUN:-} ]]; then
  # Scenario 8 lives in its own package (in-process daemons, adversarial HTTP).
  log "go test -v -run TestHostileHTTP -count=1 ./internal/hostile/"
  go test -v -run TestHostileHTTP -count=1 ./internal/hostile/ 2>&1 | tee -a "$RUN_DIR/chaos.log" |
    grep -o 'scenario=hostile-http.*' | head -1 >>"$report"
  ((PIPESTATUS[0] == 0)) || status=1
  # Every fuzz target for a bounded time (make test runs 10,000 inputs each).
  "$SCRIPTS_DIR/fuzz.sh" "${KFPIPE_FUZZ:-30}" || status=1
fi
set -e
echo
echo "== chaos scenarios =="
if [[ -s $report ]]; then cat "$report"; else echo "(no scenario line: see $RUN_DIR/chaos.log)"; fi
grep -E '^--- (FAIL|SKIP)' "$RUN_DIR/chaos.log" || true
exit "$status"
