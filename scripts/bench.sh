#!/usr/bin/env bash
# What `make bench` runs: the pipeline benchmarks against the real single-node
# broker and Redis (started by services.sh when not running). Each scenario
# runs in its own process (so its RSS is its own) and prints one JSON line
# per result; they are collected in .run/bench/results.jsonl, and the plots
# docs/bench-throughput.png and docs/bench-latency.png are drawn from them
# (matplotlib, installed with pip into .run/benchvenv on first use).
#
#   scripts/bench.sh                        all scenarios (about 5-8 minutes)
#   scripts/bench.sh consumer e2e           some of: producer consumer paced peer replies e2e memory isolation state archive
#
# archive has PostgreSQL put 20M rows shaped like the archiver's over 7 day
# partitions in a schema of its own (INSERT ... SELECT generate_series, the
# secondary indexes built after), then runs the archiver on 300k messages on
# top of them, and reports its msg/s, the bytes a message takes on disk
# (table + indexes) and the timeline query's p50/p99; the schema (about 9 GB)
# is dropped at the end (KFPIPE_BENCH_ARGS="-archive-bulk 1000000" for a
# quicker run).
#
# The peer scenario runs Confluent's Parallel Consumer (bench/pc-peer, built here with
# Maven from Maven Central into .run/bench/pc-peer.jar) beside kfpipe on the same topic.
#   KFPIPE_BENCH_NO_PLOT=1                  skip the plots
#   KFPIPE_BENCH_ARGS="-msgs 200000"        extra harness flags (e.g. state: -workloads dense -no-old)
#
# state runs three workloads (dense, conversation, write-once) of 1M messages
# each: the per-partition store on its own, then the full pipeline on it with
# dedup.legacy off, reporting the store's, the limiter's and the legacy read's
# shares apart (KFPIPE_BENCH_ARGS="-legacy off,read" adds a run with the legacy
# read; 10-20 minutes; its time limit is 60 minutes, 5 for the others).
# Beside each single-Redis row of the dense workload it runs the same
# messages with redis.mode: cluster on the test Redis Cluster (3 masters, 3
# replicas, started by services.sh), Redis's figures summed over the masters
# (KFPIPE_BENCH_ARGS="-cluster-workloads dense,write-once" for more, "-cluster-workloads=" for none).
#   KFPIPE_KEEP_SERVICES=1                  leave the services running afterwards
#
# Last, the regression guard compares each row with the last accepted
# figures (bench/baseline.json, committed): the change in CPU a message
# (process and Redis) and in the ratio to the raw loop, a row worse by more
# than 20% flagged and the script's status non-zero.
#   KFPIPE_BENCH_ACCEPT="date, commit, load"   accept this run's rows into bench/baseline.json
set -euo pipefail
LOG_TAG=bench
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$REPO_ROOT"
out="$RUN_DIR/bench"
mkdir -p docs
mkdir -p "$out"

use_services

log "building the harness"
go build -o "$out/kfpipe-bench" ./internal/bench/cmd

(($#)) || set -- producer consumer paced peer replies e2e memory isolation state archive
for sc in "$@"; do
  if [[ $sc == peer && ! -s $out/pc-peer.jar ]]; then
    log "building the Parallel Consumer peer (Maven)"
    (cd bench/pc-peer && mvn -q -B package) >&2
    cp bench/pc-peer/target/pc-peer.jar "$out/pc-peer.jar"
  fi
done
results="$out/results.jsonl"
: >"$results"
log "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go version | cut -d' ' -f3), load $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
for sc in "$@"; do
  log "scenario $sc"
  limit=300
  [[ $sc == state ]] && limit=3600
  [[ $sc == archive ]] && limit=3600 # 20M rows put in PostgreSQL first
  # shellcheck disable=SC2086 # KFPIPE_BENCH_ARGS is split into flags on purpose
  if ! timeout "$limit" "$out/kfpipe-bench" -scenario "$sc" -brokers "$KFPIPE_TEST_KAFKA" -redis "$KFPIPE_TEST_REDIS" -redis-cluster "$KFPIPE_TEST_REDIS_CLUSTER" -pc-jar "$out/pc-peer.jar" ${KFPIPE_BENCH_ARGS:-} \
    2>"$out/$sc.stderr" | tee -a "$results"; then
    log "scenario $sc failed: $(tail -n 5 "$out/$sc.stderr")"
    status=1
  fi
done

if [[ ${KFPIPE_BENCH_NO_PLOT:-} != 1 ]]; then
  venv="$RUN_DIR/benchvenv"
  if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    log "installing matplotlib into $venv"
    python3 -m venv "$venv" && "$venv/bin/pip" install -q matplotlib || log "matplotlib not installable; no plots"
  fi
  if "$venv/bin/python" internal/bench/plot/plot.py "$results" docs; then
    log "plots: docs/bench-throughput.png docs/bench-latency.png"
  fi
fi
log "results: $results"
if [[ -n ${KFPIPE_BENCH_ACCEPT:-} ]]; then
  "$out/kfpipe-bench" -guard "$results" -baseline bench/baseline.json -accept "$KFPIPE_BENCH_ACCEPT" || status=1
else
  guard=0
  "$out/kfpipe-bench" -guard "$results" -baseline bench/baseline.json || guard=$?
  if ((guard == 3)); then
    log "regression guard: rows worse than the accepted figures (above); if the change is meant, accept it with KFPIPE_BENCH_ACCEPT and say why in BENCHMARKS.md"
    status=1
  elif ((guard != 0)); then
    status=1
  fi
fi
exit "$status"
