#!/usr/bin/env bash
# PostgreSQL (Debian postgresql) on loopback, for the conversation archive's tests.
#
#   postgres.sh start [--port P]   fresh cluster (initdb) on P (default 15432), database and
#                                  role kfpipe, trust auth on loopback only, fsync on
#   postgres.sh resume             start again keeping the data
#   postgres.sh stop               fast shutdown (SIGINT; SIGKILL after 30 s); keeps the data
#   postgres.sh kill9              SIGKILL the postmaster (fault tests: crash recovery on resume)
#   postgres.sh status
#   postgres.sh env                print `export KFPIPE_TEST_POSTGRES=postgres://...`
#
# State (data, pid, log) is in .run/postgres/, or in $KFPIPE_POSTGRES_DIR: a
# second server of its own (a fault test that restarts its database) with
# `KFPIPE_POSTGRES_DIR=DIR postgres.sh start --port P`, its stop/resume/kill9
# given the same DIR. Run as root, the server runs as the postgres user
# (initdb refuses root); the data directory belongs to it.
set -euo pipefail
LOG_TAG=postgres
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

DIR="${KFPIPE_POSTGRES_DIR:-$RUN_DIR/postgres}"
DATA="$DIR/data"
START_TIMEOUT="${KFPIPE_POSTGRES_START_TIMEOUT:-60}"
PGBIN=""

pg_port() { cat "$DIR/port" 2>/dev/null || echo "${KFPIPE_POSTGRES_PORT:-15432}"; }
dsn() { echo "postgres://kfpipe@127.0.0.1:$(pg_port)/kfpipe?sslmode=disable"; }

# find_bin: Debian keeps the server binaries in /usr/lib/postgresql/N/bin;
# install the package when none is there.
find_bin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
  if [[ -z $d || ! -x $d/initdb ]]; then
    command -v apt-get >/dev/null || die "postgresql not found and no apt-get here"
    local sudo=()
    ((EUID == 0)) || sudo=(sudo -n)
    log "installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
    "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends postgresql >&2
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
    [[ -n $d && -x $d/initdb ]] || die "postgresql installed but no initdb in /usr/lib/postgresql/*/bin"
  fi
  PGBIN=$d
}

# as_owner CMD...: run as the data directory's owner (postgres when we are root).
as_owner() {
  if ((EUID == 0)); then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

postmaster_pid() { head -n1 "$DATA/postmaster.pid" 2>/dev/null || true; }
running() {
  local pid
  pid=$(postmaster_pid)
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DATA"
}
ready() { "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$(pg_port)" -d kfpipe -U kfpipe 2>/dev/null; }

launch() {
  local port i
  port=$(pg_port)
  if port_open "$port"; then
    die "port $port on 127.0.0.1 is already in use by another process"
  fi
  echo "===== $(date '+%F %T') starting postgres on $port =====" >>"$DIR/postgres.log"
  ((EUID != 0)) || chown postgres: "$DIR/postgres.log"
  # pg_ctl daemonizes the postmaster in its own session and waits until it
  # accepts connections (or fails, saying why in the log).
  as_owner "$PGBIN/pg_ctl" -D "$DATA" -l "$DIR/postgres.log" -w -t "$START_TIMEOUT" \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$DIR/sock" start >/dev/null ||
    { tail_log "$DIR/postgres.log"; die "postgres failed to start on 127.0.0.1:$port"; }
  for ((i = 0; i < START_TIMEOUT * 10; i++)); do
    ready && return 0
    sleep 0.1
  done
  tail_log "$DIR/postgres.log"
  die "postgres did not accept connections on 127.0.0.1:$port within ${START_TIMEOUT}s"
}

cmd_start() {
  local port=${KFPIPE_POSTGRES_PORT:-15432}
  while (($#)); do
    case $1 in
      --port) port=$2; shift 2 ;;
      --port=*) port=${1#*=}; shift ;;
      *) die "unknown argument: $1" ;;
    esac
  done
  find_bin
  if running; then log "already running on 127.0.0.1:$(pg_port)"; return 0; fi
  if port_open "$port" && "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$port" -d kfpipe -U kfpipe 2>/dev/null; then
    # As services.sh does: a server these scripts did not start (another
    # checkout's) is used as is, and never stopped by them.
    log "WARNING: a PostgreSQL not started by this script answers on 127.0.0.1:$port; using it as is"
    mkdir -p "$DIR"
    echo "$port" >"$DIR/port"
    return 0
  fi
  local t=$SECONDS
  rm -rf "$DIR"
  mkdir -p "$DIR/sock"
  echo "$port" >"$DIR/port"
  ((EUID != 0)) || chown -R postgres: "$DIR"
  as_owner "$PGBIN/initdb" -D "$DATA" -U kfpipe --auth=trust -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 ||
    { tail_log "$DIR/initdb.log"; die "initdb failed"; }
  # Sized for a shared test box: small buffers, a WAL that checkpoints
  # often enough to keep the directory small.
  cat >>"$DATA/postgresql.conf" <<EOF
# added by scripts/postgres.sh
shared_buffers = 128MB
max_connections = 200
max_wal_size = 1GB
log_min_messages = warning
EOF
  launch
  as_owner "$PGBIN/createdb" -h 127.0.0.1 -p "$port" -U kfpipe kfpipe
  log "ready on 127.0.0.1:$port in $((SECONDS - t)) s ($(dsn))"
}

cmd_resume() {
  find_bin
  [[ -d $DATA ]] || die "no data in $DATA (use start first)"
  if running; then log "already running"; return 0; fi
  launch
  log "resumed on 127.0.0.1:$(pg_port)"
}

cmd_stop() {
  local pid i
  if ! running; then log "not running"; return 0; fi
  pid=$(postmaster_pid)
  kill -INT "$pid" 2>/dev/null || true # fast shutdown
  for ((i = 0; i < 300; i++)); do
    kill -0 "$pid" 2>/dev/null || { log "stopped"; return 0; }
    sleep 0.1
  done
  log "postmaster $pid still alive after 30 s, sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

cmd_kill9() {
  local pid i
  running || { log "not running"; return 0; }
  pid=$(postmaster_pid)
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  # The backends notice their postmaster is gone and exit on their own;
  # resume waits for the port to be free.
  for ((i = 0; i < 100; i++)); do port_open "$(pg_port)" || break; sleep 0.1; done
  log "killed (SIGKILL)"
}

cmd_status() {
  if running && { find_bin; ready; }; then
    log "running on 127.0.0.1:$(pg_port)"
    return 0
  fi
  log "not running"
  return 1
}

cmd=${1:-}
shift || true
case $cmd in
  start) cmd_start "$@" ;;
  resume) cmd_resume ;;
  stop) cmd_stop ;;
  kill9) cmd_kill9 ;;
  status) cmd_status ;;
  env) echo "export KFPIPE_TEST_POSTGRES=$(dsn)" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
