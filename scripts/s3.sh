#!/usr/bin/env bash
# An S3-compatible object store on loopback, for the media store's tests:
# SeaweedFS (weed server -s3: master, volume, filer and the S3 gateway in one
# process), built once from its Go module into the cache.
#
#   s3.sh build            build weed into $KFPIPE_CACHE (done by start when missing)
#   s3.sh start [--port P] fresh store; S3 API on P (default 18333), master P+1,
#                          volume P+2, filer P+3 (gRPC on each port + 10000)
#   s3.sh stop             SIGTERM (SIGKILL after 10 s)
#   s3.sh status
#   s3.sh env              print `export KFPIPE_TEST_S3=127.0.0.1:P`
#
# Credentials: access key kfpipe-test, secret key kfpipe-test-secret (testenv).
# State (data, pid, log) is in .run/s3/.
set -euo pipefail
LOG_TAG=s3
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SEAWEEDFS_MODULE=github.com/seaweedfs/seaweedfs
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
WEED="$CACHE_DIR/seaweedfs-$SEAWEEDFS_VERSION/weed"
DIR="$RUN_DIR/s3"
START_TIMEOUT="${KFPIPE_S3_START_TIMEOUT:-60}"
MARKER="$DIR/data" # identifies our process in /proc/PID/cmdline
ACCESS_KEY=kfpipe-test
SECRET_KEY=kfpipe-test-secret

s3_port() { cat "$DIR/port" 2>/dev/null || echo "${KFPIPE_S3_PORT:-18333}"; }
running() { pid_alive "$DIR/weed.pid" "$MARKER"; }
# answering PORT: the S3 gateway answers (an anonymous ListBuckets is refused
# with an S3 XML error, which is an answer).
answering() { http_get "$1" / | grep -q '<?xml\|<Error>\|ListAllMyBucketsResult'; }

cmd_build() {
  [[ -x $WEED ]] && return 0
  command -v go >/dev/null || die "go not found"
  local tmp t=$SECONDS
  tmp=$(mktemp -d)
  log "building weed $SEAWEEDFS_VERSION into $WEED (once; a few minutes)"
  (
    cd "$tmp"
    export GOFLAGS=-mod=mod GOWORK=off
    go mod init kfpipe-weed-build >/dev/null 2>&1
    go get "$SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION" >&2
    mkdir -p "$(dirname "$WEED")"
    go build -trimpath -o "$WEED.tmp" "$SEAWEEDFS_MODULE/weed" >&2
    mv "$WEED.tmp" "$WEED"
  ) || { rm -rf "$tmp"; die "building weed failed"; }
  rm -rf "$tmp"
  log "weed built in $((SECONDS - t)) s"
}

cmd_start() {
  local port=$1 i
  if running; then
    log "already running on 127.0.0.1:$(s3_port)"
    return 0
  fi
  for i in 0 1 2 3; do
    port_open $((port + i)) && die "port $((port + i)) on 127.0.0.1 is already in use by another process"
  done
  cmd_build
  rm -rf "$DIR"
  mkdir -p "$DIR/data"
  echo "$port" >"$DIR/port"
  cat >"$DIR/s3.json" <<JSON
{"identities": [{"name": "kfpipe", "credentials": [{"accessKey": "$ACCESS_KEY", "secretKey": "$SECRET_KEY"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
  # Each test bucket is a collection with volumes of its own, never given
  # back while the server runs: 32 ran out ("failed to find writable
  # volumes") after three make test runs on one kept server
  # (KFPIPE_KEEP_SERVICES); 256 empty volumes cost next to nothing.
  echo "===== $(date '+%F %T') starting weed server (s3 $port) =====" >>"$DIR/weed.log"
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$DIR/weed.pid" \
    "$WEED" server -dir="$DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -master.port=$((port + 1)) -volume.port=$((port + 2)) -filer.port=$((port + 3)) \
    -master.volumeSizeLimitMB=64 -volume.max=256 \
    -s3 -s3.port="$port" -s3.config="$DIR/s3.json" \
    >>"$DIR/weed.log" 2>&1 </dev/null &
  disown 2>/dev/null || true
  local t=$SECONDS
  for ((i = 0; i < START_TIMEOUT * 10; i++)); do
    if answering "$port"; then
      log "ready on 127.0.0.1:$port in $((SECONDS - t)) s"
      return 0
    fi
    if ((i > 5)) && ! running; then
      tail_log "$DIR/weed.log"
      die "weed exited during startup (log: $DIR/weed.log)"
    fi
    sleep 0.1
  done
  tail_log "$DIR/weed.log"
  die "weed's S3 gateway did not answer on 127.0.0.1:$port within ${START_TIMEOUT}s (log: $DIR/weed.log)"
}

PORT_ARG=""
cmd=${1:-}
shift || true
while (($#)); do
  case $1 in
    --port) PORT_ARG=$2; shift 2 ;;
    --port=*) PORT_ARG=${1#*=}; shift ;;
    *) die "unknown argument: $1" ;;
  esac
done
case $cmd in
  build) cmd_build ;;
  start) cmd_start "${PORT_ARG:-${KFPIPE_S3_PORT:-18333}}" ;;
  stop)
    if running; then
      stop_pid "$DIR/weed.pid" "$MARKER" 10
      log "stopped"
    else
      rm -f "$DIR/weed.pid"
      log "not running"
    fi
    ;;
  status)
    if running && answering "$(s3_port)"; then
      log "running on 127.0.0.1:$(s3_port)"
      exit 0
    fi
    log "not running"
    exit 1
    ;;
  env) echo "export KFPIPE_TEST_S3=127.0.0.1:$(s3_port)" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
