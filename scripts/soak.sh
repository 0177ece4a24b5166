#!/usr/bin/env bash
# What `make soak` runs (not part of make test or make chaos): the whole
# pipeline as processes against the real services at a steady rate, with
# 5 % of handler attempts failing and a rate-limited bot, sampled every
# 10 s (internal/chaos TestSoak), then plotted to docs/soak.png.
#
#   KFPIPE_SOAK_DURATION=30m   how long to feed (default 30m)
#   KFPIPE_SOAK_RATE=2000      messages a second (default 2000)
#   KFPIPE_KEEP_SERVICES=1     leave the services running afterwards
# Samples go to .run/soak.csv, the log to .run/soak.log.
set -euo pipefail
LOG_TAG=soak
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$REPO_ROOT"
mkdir -p "$RUN_DIR"
use_services
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  log "installing matplotlib for the plot"
  python3 -m pip install --quiet matplotlib 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages matplotlib
fi
export KFPIPE_SOAK_OUT="$RUN_DIR/soak.csv"
: >"$RUN_DIR/chaos-report.txt"
export KFPIPE_CHAOS_REPORT="$RUN_DIR/chaos-report.txt"
set +e
go test -tags soak -v -run '^TestSoak$' -count=1 -timeout 3h ./internal/chaos/ 2>&1 | tee "$RUN_DIR/soak.log"
status=${PIPESTATUS[0]}
set -e
if [[ -s $KFPIPE_SOAK_OUT ]]; then
  python3 scripts/soak-plot.py "$KFPIPE_SOAK_OUT" docs/soak.png
fi
echo
echo "== soak =="
cat "$RUN_DIR/chaos-report.txt" 2>/dev/null || true
exit "$status"
