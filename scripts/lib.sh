# Shared helpers for the service scripts. Sourced, not executed.
# shellcheck shell=bash

SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPTS_DIR/.." && pwd)"
RUN_DIR="${KFPIPE_RUN_DIR:-$REPO_ROOT/.run}"
CACHE_DIR="${KFPIPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kfpipe}"

log() { printf '[%s] %s (+%ss)\n' "${LOG_TAG:-kfpipe}" "$*" "$SECONDS" >&2; }
die() { printf '[%s] ERROR: %s\n' "${LOG_TAG:-kfpipe}" "$*" >&2; exit 1; }

# port_open PORT [HOST]: true when something accepts TCP connections there.
port_open() {
  local port=$1 host=${2:-127.0.0.1}
  (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

# pid_alive PIDFILE [MARKER]: true when the pid in PIDFILE is alive and, if
# MARKER is given, its command line contains MARKER (guards against pid reuse).
pid_alive() {
  local pidfile=$1 marker=${2:-} pid
  [[ -s $pidfile ]] || return 1
  pid=$(<"$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  if [[ -n $marker ]]; then
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$marker" || return 1
  fi
  return 0
}

# stop_pid PIDFILE MARKER [TIMEOUT_S]: SIGTERM, wait, then SIGKILL.
stop_pid() {
  local pidfile=$1 marker=$2 timeout=${3:-10} pid i
  if ! pid_alive "$pidfile" "$marker"; then
    rm -f "$pidfile"
    return 0
  fi
  pid=$(<"$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < timeout * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "pid $pid still alive after ${timeout}s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$pidfile"
}

# kill9_pid PIDFILE MARKER: SIGKILL now (fault injection); keeps all state.
kill9_pid() {
  local pidfile=$1 marker=$2 pid i
  pid_alive "$pidfile" "$marker" || { log "not running"; return 0; }
  pid=$(<"$pidfile")
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
}

# tail_log FILE: print the last lines of a log to stderr.
tail_log() {
  [[ -f $1 ]] || return 0
  printf -- '----- last lines of %s -----\n' "$1" >&2
  tail -n "${2:-40}" "$1" >&2
  printf -- '-----\n' >&2
}

# http_get PORT PATH: tiny HTTP/1.0 GET on 127.0.0.1 without curl; prints the response.
http_get() {
  local port=$1 path=$2
  (
    exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$path" >&3
    timeout 5 cat <&3
  ) 2>/dev/null
}

# use_services: for a script that needs the test services (make test, bench,
# chaos). Starts Kafka, Redis, the Redis Cluster, etcd and the S3 server where they are not
# running, exports
# KFPIPE_TEST_* and KFPIPE_REPO_ROOT, and on exit stops only the ones it
# started (KFPIPE_KEEP_SERVICES=1 leaves them up).
_started_services=()
_stop_started_services() {
  local rc=$? s
  if [[ ${KFPIPE_KEEP_SERVICES:-} != 1 ]]; then
    for s in "${_started_services[@]}"; do
      if [[ $s == redis-cluster ]]; then "$SCRIPTS_DIR/redis.sh" cluster-stop || true; else "$SCRIPTS_DIR/$s.sh" stop || true; fi
    done
  fi
  exit "$rc"
}
use_services() {
  trap _stop_started_services EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local s
  for s in kafka redis etcd; do
    "$SCRIPTS_DIR/$s.sh" status 2>/dev/null || _started_services+=("$s")
  done
  "$SCRIPTS_DIR/redis.sh" cluster-status >/dev/null 2>&1 || _started_services+=(redis-cluster)
  eval "$("$SCRIPTS_DIR/services.sh" up)"
  export KFPIPE_TEST_KAFKA KFPIPE_TEST_REDIS KFPIPE_TEST_REDIS_CLUSTER KFPIPE_TEST_ETCD
  # The media store's S3-compatible server (SeaweedFS, built once into the
  # cache). Not started: its tests skip, and fail under CI.
  if ! "$SCRIPTS_DIR/s3.sh" status 2>/dev/null; then
    if "$SCRIPTS_DIR/s3.sh" start; then _started_services+=(s3); else log "S3 server not started"; fi
  fi
  eval "$("$SCRIPTS_DIR/s3.sh" env)"
  export KFPIPE_TEST_S3
  # PostgreSQL for the conversation archive.
  if ! "$SCRIPTS_DIR/postgres.sh" status 2>/dev/null; then
    "$SCRIPTS_DIR/postgres.sh" start
    _started_services+=(postgres)
  fi
  eval "$("$SCRIPTS_DIR/postgres.sh" env)"
  export KFPIPE_TEST_POSTGRES
  export KFPIPE_REPO_ROOT="$REPO_ROOT"
}
