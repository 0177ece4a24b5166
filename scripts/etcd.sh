#!/usr/bin/env bash
# etcd (Debian etcd-server) on loopback, for tests.
#
#   etcd.sh start  [--port P]   fresh single member: client P (default 12379), peer P+1
#   etcd.sh resume              start again keeping the data
#   etcd.sh stop                SIGTERM (SIGKILL after 10 s); keeps the data
#   etcd.sh kill9               SIGKILL (fault tests)
#   etcd.sh status
#
#   etcd.sh start-cluster [--name NAME] [--base-port P]
#                               3 fresh members (default cluster, 22379): member i (1..3)
#                               is NAME-i, client port P+2(i-1), peer port P+2(i-1)+1
#   etcd.sh stop-cluster  [--name NAME]
#   etcd.sh stop|kill9|resume|status --member I [--name NAME]   one member of a cluster
#   etcd.sh status --name NAME  exit 0 when every member runs and is healthy
#   etcd.sh leader [--name NAME]  print the number (1..3) of the member that leads
#
# State (data, pid, log) is in .run/etcd/ under the repository root; a
# cluster's in .run/etcd-NAME/member-I/.
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

# spawn MDIR NAME CPORT PPORT INITIAL_CLUSTER TOKEN: start one member in the
# background (own session); its data, pid and log are in MDIR. On a data
# directory that exists, etcd ignores the initial-cluster flags.
spawn() {
  local mdir=$1 name=$2 cport=$3 pport=$4 initial=$5 token=$6
  if port_open "$cport" || port_open "$pport"; then
    die "port $cport or $pport on 127.0.0.1 is already in use by another process"
  fi
  mkdir -p "$mdir"
  echo "===== $(date '+%F %T') starting etcd $name (client $cport, peer $pport) =====" >>"$mdir/etcd.log"
  # etcd 3.4 refuses to start on arm64 unless told to.
  if [[ $(uname -m) == aarch64 ]]; then export ETCD_UNSUPPORTED_ARCH=arm64; fi
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$mdir/etcd.pid" \
    etcd --name "$name" --data-dir "$mdir/data" \
    --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "$initial" --initial-cluster-state new \
    --initial-cluster-token "$token" --logger zap --log-outputs stderr \
    >>"$mdir/etcd.log" 2>&1 </dev/null &
  disown 2>/dev/null || true
}

# wait_healthy MDIR CPORT: wait until the member answers /health with a
# leader; fail at once if its process exits.
wait_healthy() {
  local mdir=$1 cport=$2 i
  for ((i = 0; i < START_TIMEOUT * 10; i++)); do
    if healthy "$cport"; then return 0; fi
    if ((i > 5)) && ! pid_alive "$mdir/etcd.pid" "$mdir/data"; then
      tail_log "$mdir/etcd.log"
      die "etcd exited during startup (log: $mdir/etcd.log)"
    fi
    sleep 0.1
  done
  tail_log "$mdir/etcd.log"
  die "etcd did not become healthy on 127.0.0.1:$cport within ${START_TIMEOUT}s (log: $mdir/etcd.log)"
}

launch() {
  local port
  port=$(client_port)
  spawn "$DIR" kfpipe "$port" $((port + 1)) "kfpipe=http://127.0.0.1:$((port + 1))" kfpipe-test
  wait_healthy "$DIR" "$port"
}

# ---------------------------------------------------------------- cluster

cluster_dir() { echo "$RUN_DIR/etcd-$1"; }
member_dir() { echo "$(cluster_dir "$1")/member-$2"; }

load_cluster() { # NAME: sets BASE
  local f; f="$(cluster_dir "$1")/cluster.env"
  [[ -f $f ]] || die "no state for etcd cluster '$1' in $(cluster_dir "$1") (use start-cluster first)"
  # shellcheck disable=SC1090
  source "$f"
}

# leads PORT: the member on PORT says it is the leader (maintenance Status
# through etcd's HTTP/JSON gateway, so no etcdctl is needed).
leads() {
  local out me leader
  out=$(
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'POST /v3/maintenance/status HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}' >&3
    timeout 2 cat <&3
  ) 2>/dev/null || return 1
  me=$(sed -n 's/.*"member_id":"\([0-9]*\)".*/\1/p' <<<"$out")
  leader=$(sed -n 's/.*"leader":"\([0-9]*\)".*/\1/p' <<<"$out")
  [[ -n $me && $me == "$leader" ]]
}

member_cport() { echo $((BASE + 2 * ($1 - 1))); }
member_running() { pid_alive "$(member_dir "$1" "$2")/etcd.pid" "$(member_dir "$1" "$2")/data"; }

launch_member() { # NAME I
  local name=$1 i=$2 j initial=""
  for j in 1 2 3; do
    initial+="${initial:+,}$name-$j=http://127.0.0.1:$(($(member_cport "$j") + 1))"
  done
  spawn "$(member_dir "$name" "$i")" "$name-$i" "$(member_cport "$i")" $(($(member_cport "$i") + 1)) \
    "$initial" "kfpipe-$name"
}

cmd_start_cluster() {
  local name=$1 base=$2 i alive=0 t=$SECONDS
  for i in 1 2 3; do member_running "$name" "$i" && alive=$((alive + 1)); done
  if ((alive == 3)); then
    load_cluster "$name"
    log "cluster '$name' already running"
    return 0
  elif ((alive > 0)); then
    load_cluster "$name"
    log "cluster '$name' partially running ($alive/3): resuming the stopped members, keeping data"
    for i in 1 2 3; do member_running "$name" "$i" || launch_member "$name" "$i"; done
  else
    rm -rf "$(cluster_dir "$name")"
    mkdir -p "$(cluster_dir "$name")"
    echo "BASE=$base" >"$(cluster_dir "$name")/cluster.env"
    BASE=$base
    # All three at once: none becomes healthy before a quorum has joined.
    for i in 1 2 3; do launch_member "$name" "$i"; done
  fi
  for i in 1 2 3; do wait_healthy "$(member_dir "$name" "$i")" "$(member_cport "$i")"; done
  log "cluster '$name' ready on http://127.0.0.1:$BASE,http://127.0.0.1:$((BASE + 2)),http://127.0.0.1:$((BASE + 4)) in $((SECONDS - t)) s"
}

cmd_stop_member() { # NAME I
  local name=$1 i=$2 mdir
  mdir=$(member_dir "$name" "$i")
  if member_running "$name" "$i"; then
    stop_pid "$mdir/etcd.pid" "$mdir/data" 10
    log "member '$name-$i' stopped"
  else
    rm -f "$mdir/etcd.pid"
    log "member '$name-$i' not running"
  fi
}

cmd_stop_cluster() {
  local name=$1 i leader=0
  [[ -d $(cluster_dir "$name") ]] || { log "cluster '$name': no state"; return 0; }
  load_cluster "$name"
  # The followers together, then the leader: a leader stopping hands its
  # leadership over first, and waits 7 s if the member it picked is
  # stopping too; with none left it just stops.
  for i in 1 2 3; do member_running "$name" "$i" && leads "$(member_cport "$i")" && leader=$i; done
  for i in 1 2 3; do
    if ((i != leader)); then cmd_stop_member "$name" "$i" & fi
  done
  wait
  if ((leader > 0)); then cmd_stop_member "$name" "$leader"; fi
}

cmd_resume_member() { # NAME I
  local name=$1 i=$2 j others=0 t=$SECONDS
  load_cluster "$name"
  if member_running "$name" "$i"; then log "member '$name-$i' already running"; return 0; fi
  launch_member "$name" "$i"
  # A lone member cannot become healthy: without another one running, do
  # not wait (resume the others, then it becomes healthy).
  for j in 1 2 3; do [[ $j != "$i" ]] && member_running "$name" "$j" && others=$((others + 1)); done
  if ((others == 0)); then
    log "member '$name-$i' launched; no other member of '$name' runs, not waiting for it"
    return 0
  fi
  wait_healthy "$(member_dir "$name" "$i")" "$(member_cport "$i")"
  log "member '$name-$i' resumed on http://127.0.0.1:$(member_cport "$i") in $((SECONDS - t)) s"
}

cmd_status_cluster() { # NAME [I]
  local name=$1 i rc=0
  load_cluster "$name"
  for i in ${2:-1 2 3}; do
    if ! member_running "$name" "$i"; then
      log "member '$name-$i' not running"
      rc=1
    elif ! healthy "$(member_cport "$i")"; then
      log "member '$name-$i' runs but is not healthy (no leader: is a quorum up?)"
      rc=1
    else
      log "member '$name-$i' running on http://127.0.0.1:$(member_cport "$i")"
    fi
  done
  return "$rc"
}

cmd_leader() {
  local name=$1 i
  load_cluster "$name"
  for i in 1 2 3; do
    if member_running "$name" "$i" && leads "$(member_cport "$i")"; then
      echo "$i"
      return 0
    fi
  done
  die "cluster '$name' has no leader among its running members"
}

# ---------------------------------------------------------------- commands

PORT_ARG=""
NAME_ARG=""
MEMBER_ARG=""
parse() {
  while (($#)); do
    case $1 in
      --port | --base-port) PORT_ARG=$2; shift 2 ;;
      --port=* | --base-port=*) PORT_ARG=${1#*=}; shift ;;
      --name) NAME_ARG=$2; shift 2 ;;
      --name=*) NAME_ARG=${1#*=}; shift ;;
      --member) MEMBER_ARG=$2; shift 2 ;;
      --member=*) MEMBER_ARG=${1#*=}; shift ;;
      *) die "unknown argument: $1" ;;
    esac
  done
  [[ -z $MEMBER_ARG || $MEMBER_ARG =~ ^[123]$ ]] || die "--member must be 1, 2 or 3, got '$MEMBER_ARG'"
}

# cluster_cmd: true when the arguments name a cluster (--name or --member).
cluster_cmd() { [[ -n $NAME_ARG || -n $MEMBER_ARG ]]; }

cmd=${1:-}
shift || true
parse "$@"
NAME=${NAME_ARG:-cluster}
case $cmd in
  start)
    cluster_cmd && die "start is for the single member; use start-cluster"
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
    if cluster_cmd; then
      [[ -n $MEMBER_ARG ]] || die "resume of a cluster needs --member I (or start-cluster)"
      cmd_resume_member "$NAME" "$MEMBER_ARG"
      exit 0
    fi
    [[ -f $DIR/port ]] || die "no etcd state in $DIR (use start first)"
    if running; then log "already running"; exit 0; fi
    launch
    log "resumed on http://127.0.0.1:$(client_port)"
    ;;
  stop)
    if cluster_cmd; then
      [[ -n $MEMBER_ARG ]] || die "stop of a cluster needs --member I (or stop-cluster)"
      cmd_stop_member "$NAME" "$MEMBER_ARG"
      exit 0
    fi
    if running; then
      stop_pid "$DIR/etcd.pid" "$MARKER" 10
      log "stopped"
    else
      rm -f "$DIR/etcd.pid"
      log "not running"
    fi
    ;;
  kill9)
    if cluster_cmd; then
      [[ -n $MEMBER_ARG ]] || die "kill9 of a cluster needs --member I"
      kill9_pid "$(member_dir "$NAME" "$MEMBER_ARG")/etcd.pid" "$(member_dir "$NAME" "$MEMBER_ARG")/data"
      log "member '$NAME-$MEMBER_ARG' killed (SIGKILL)"
      exit 0
    fi
    kill9_pid "$DIR/etcd.pid" "$MARKER"
    log "killed (SIGKILL)"
    ;;
  status)
    if cluster_cmd; then
      cmd_status_cluster "$NAME" "$MEMBER_ARG"
      exit
    fi
    if running && healthy "$(client_port)"; then
      log "running on http://127.0.0.1:$(client_port)"
      exit 0
    fi
    log "not running"
    exit 1
    ;;
  start-cluster)
    need_etcd
    cmd_start_cluster "$NAME" "${PORT_ARG:-22379}"
    ;;
  stop-cluster) cmd_stop_cluster "$NAME" ;;
  leader) cmd_leader "$NAME" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
