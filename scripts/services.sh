#!/usr/bin/env bash
# The services the tests use, on loopback.
#
#   services.sh up     deps.sh, then start single Kafka, Redis, a Redis Cluster (3 masters,
#                      3 replicas) and etcd (those not already running); prints `export KFPIPE_TEST_...` lines on stdout, so
#                      eval "$(scripts/services.sh up)" works. Progress goes to stderr.
#   services.sh env    print the export lines only
#   services.sh down   stop them all
#   services.sh status
#
# Ports: KFPIPE_KAFKA_PORT (19092), KFPIPE_REDIS_PORT (16379), KFPIPE_ETCD_PORT (12379),
# KFPIPE_REDIS_CLUSTER_PORT (17000: the cluster takes it and the next five, bus ports +10000).
# A port that already answers the right protocol but is not one of ours is used as is
# (with a warning) and never stopped by these scripts.
set -euo pipefail
LOG_TAG=services
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

KAFKA_PORT="${KFPIPE_KAFKA_PORT:-19092}"
REDIS_PORT="${KFPIPE_REDIS_PORT:-16379}"
ETCD_PORT="${KFPIPE_ETCD_PORT:-12379}"
CLUSTER_PORT="${KFPIPE_REDIS_CLUSTER_PORT:-17000}"

print_env() {
  echo "export KFPIPE_TEST_KAFKA=127.0.0.1:$KAFKA_PORT"
  echo "export KFPIPE_TEST_REDIS=127.0.0.1:$REDIS_PORT"
  echo "export KFPIPE_TEST_ETCD=http://127.0.0.1:$ETCD_PORT"
  local i seeds=()
  for i in 0 1 2 3 4 5; do seeds+=("127.0.0.1:$((CLUSTER_PORT + i))"); done
  echo "export KFPIPE_TEST_REDIS_CLUSTER=$(IFS=,; echo "${seeds[*]}")"
}

foreign_kafka() { command -v kcat >/dev/null && kcat -b "127.0.0.1:$KAFKA_PORT" -L -m 3 >/dev/null 2>&1; }
foreign_redis() { [[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" PING 2>/dev/null) == PONG ]]; }
foreign_cluster() { redis-cli -h 127.0.0.1 -p "$CLUSTER_PORT" CLUSTER INFO 2>/dev/null | grep -q '^cluster_state:ok'; }
foreign_etcd() { http_get "$ETCD_PORT" /health | grep -q '"health": *"true"'; }

# up_one NAME STATUS_CMD FOREIGN_CHECK START_CMD
up_one() {
  local name=$1 status=$2 foreign=$3 start=$4
  if eval "$status" 2>/dev/null; then
    return 0
  fi
  if $foreign; then
    log "WARNING: $name: something not started by these scripts already answers on its port; using it as is"
    return 0
  fi
  eval "$start"
}

case ${1:-} in
  up)
    "$SCRIPTS_DIR/deps.sh" >&2
    up_one kafka "'$SCRIPTS_DIR/kafka.sh' status" foreign_kafka "'$SCRIPTS_DIR/kafka.sh' start --port $KAFKA_PORT" >&2
    up_one redis "'$SCRIPTS_DIR/redis.sh' status" foreign_redis "'$SCRIPTS_DIR/redis.sh' start --port $REDIS_PORT" >&2
    up_one redis-cluster "'$SCRIPTS_DIR/redis.sh' cluster-status >/dev/null" foreign_cluster "'$SCRIPTS_DIR/redis.sh' cluster-start" >&2
    up_one etcd "'$SCRIPTS_DIR/etcd.sh' status" foreign_etcd "'$SCRIPTS_DIR/etcd.sh' start --port $ETCD_PORT" >&2
    print_env
    ;;
  env) print_env ;;
  down)
    "$SCRIPTS_DIR/kafka.sh" stop
    "$SCRIPTS_DIR/redis.sh" stop
    "$SCRIPTS_DIR/redis.sh" cluster-stop
    "$SCRIPTS_DIR/etcd.sh" stop
    ;;
  status)
    rc=0
    "$SCRIPTS_DIR/kafka.sh" status || rc=1
    "$SCRIPTS_DIR/redis.sh" status || rc=1
    "$SCRIPTS_DIR/redis.sh" cluster-status >/dev/null || rc=1
    "$SCRIPTS_DIR/etcd.sh" status || rc=1
    exit $rc
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
