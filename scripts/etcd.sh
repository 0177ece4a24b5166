#!/usr/bin/env bash
# etcd (Debian etcd-server) on loopback, for tests.
#
#   etcd.sh start  [--port P]   fresh single member: client P (default 12379), peer P+1
#   etcd.sh resume              start again keeping the data
#   etcd.sh stop                SIGTERM (SIGKILL after 10 s); keeps the data
#   etcd.sh kill9               SIGKILL (fault tests)
#   etcd.sh status
#
# State (data, pid, log) is in .run/etcd/ under the repository root.
set -euo pipefail
LOG_TAG=etcd
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

DIR="$RUN_DIR/etcd"
START_TIMEOUT="${KFPIPE_ETCD_START_TIMEOUT:-30}"
MARKER="$DIR/data" # identifies our process in /proc/PID/cmdline

need_etcd() {
  command -v etcd >/dev/null || "$SCRIPTS_DIR/deps.sh" >&2
  command -v etcd >/dev/null || die "etcd not found (Debian: apt-get install etcd-server)"
}

client_port() { cat "$DIR/port" 2>/dev/null || echo 12379; }
running() { pid_alive "$DIR/etcd.pid" "$MARKER"; }
healthy() { http_get "$1" /health | grep -q '"health": *"true"'; }

launch() {
  local port cport pport i
  port=$(client_port)
  cport=$port
  pport=$((port + 1))
  if port_open "$cport" || port_open "$pport"; then
    die "port $cport or $pport on 127.0.0.1 is already in use by another process"
  fi
  mkdir -p "$DIR"
  echo "===== $(date '+%F %T') starting etcd (client $cport, peer $pport) =====" >>"$DIR/etcd.log"
  # etcd 3.4 refuses to start on arm64 unless told to.
  if [[ $(uname -m) == aarch64 ]]; then export ETCD_UNSUPPORTED_ARCH=arm64; fi
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$DIR/etcd.pid" \
    etcd --name kfpipe --data-dir "$DIR/data" \
    --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "kfpipe=http://127.0.0.1:$pport" --initial-cluster-state new \
    --initial-cluster-token kfpipe-test --logger zap --log-outputs stderr \
    >>"$DIR/etcd.log" 2>&1 </dev/null &
  disown 2>/dev/null || true
  for ((i = 0; i < START_TIMEOUT * 10; i++)); do
    if healthy "$cport"; then return 0; fi
    if ((i > 5)) && ! running; then
      tail_log "$DIR/etcd.log"
      die "etcd exited during startup (log: $DIR/etcd.log)"
    fi
    sleep 0.1
  done
  tail_log "$DIR/etcd.log"
  die "etcd did not become healthy on 127.0.0.1:$cport within ${START_TIMEOUT}s (log: $DIR/etcd.log)"
}

PORT_ARG=""
parse() {
  while (($#)); do
    case $1 in
      --port) PORT_ARG=$2; shift 2 ;;
      --port=*) PORT_ARG=${1#*=}; shift ;;
      *) die "unknown argument: $1" ;;
    esac
  done
}

cmd=${1:-}
shift || true
case $cmd in
  start)
    parse "$@"
    need_etcd
    if running; then
      log "already running on 127.0.0.1:$(client_port)"
      exit 0
    fi
    rm -rf "$DIR"
    mkdir -p "$DIR"
    echo "${PORT_ARG:-12379}" >"$DIR/port"
    launch
    log "ready on http://127.0.0.1:$(client_port)"
    ;;
  resume | restart-existing)
    need_etcd
    [[ -f $DIR/port ]] || die "no etcd state in $DIR (use start first)"
    if running; then log "already running"; exit 0; fi
    launch
    log "resumed on http://127.0.0.1:$(client_port)"
    ;;
  stop)
    if running; then
      stop_pid "$DIR/etcd.pid" "$MARKER" 10
      log "stopped"
    else
      rm -f "$DIR/etcd.pid"
      log "not running"
    fi
    ;;
  kill9)
    kill9_pid "$DIR/etcd.pid" "$MARKER"
    log "killed (SIGKILL)"
    ;;
  status)
    if running && healthy "$(client_port)"; then
      log "running on http://127.0.0.1:$(client_port)"
      exit 0
    fi
    log "not running"
    exit 1
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
