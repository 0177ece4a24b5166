#!/usr/bin/env bash
# CI's check of what ships (make image-check; scripts/test.sh runs it after
# the Go tests): builds the image and the .deb, prints the image's size and
# the static-binary check, runs each daemon from the image against the test
# services with the Kubernetes config (/readyz 200, /metrics, exit 0 within
# ops.shutdown_timeout of SIGTERM), installs the .deb with dpkg, verifies
# its units with systemd-analyze and purges it.
#
# Where no container can run, the daemons run as the binaries taken out of
# the built image, with the image's environment and working directory.
#   KFPIPE_IMAGE_CHECK_NO_DEB=1   skip the package part
set -euo pipefail
LOG_TAG=image-check
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$REPO_ROOT"
use_services

work=$(mktemp -d)
ctrs=()
cleanup() {
  for c in "${ctrs[@]}"; do podman rm -f "$c" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

image=$("$SCRIPTS_DIR/image.sh" | tail -1)
version=${image##*:}
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "image: $image size=${size} bytes ($((size / 1024 / 1024)) MiB)"

# The size the docs state ("about N MiB" in docs/operations.md, "The image
# and the package") is the image's, within 5 %.
stated=$(sed -n '/^## The image and the package/,/^## /p' docs/operations.md | tr '\n' ' ' |
  sed -n 's/.*(about \([0-9][0-9]*\) MiB.*/\1/p')
[[ -n $stated ]] || die "docs/operations.md states no image size (\"about N MiB\")"
mib=$((size / 1024 / 1024))
((mib * 100 >= stated * 95 && mib * 100 <= stated * 105)) ||
  die "the image is $mib MiB; docs/operations.md says about $stated MiB"
echo "image size: $mib MiB, docs/operations.md says about $stated MiB"

# The image's files, as a container of it sees them.
cid=$(podman create "$image")
podman export "$cid" | tar -x -C "$work" --exclude='dev/*'
podman rm "$cid" >/dev/null
mkdir -p "$work/fs"
mv "$work"/{usr,etc,var,tmp} "$work/fs/" 2>/dev/null || true
for b in "$work"/fs/usr/local/bin/*; do
  lddout=$(ldd "$b" 2>&1 || true)
  printf '%s: %s | ldd: %s\n' "${b##*/}" "$(file -b "$b")" "$(tr -d '\t' <<<"${lddout%%$'\n'*}")"
  desc=$(file -b "$b")
  [[ $desc == *"statically linked"* || $desc == *"static-pie linked"* ]] || die "${b##*/} in the image is not static"
  got=$("$b" --version)
  got=${got%%$'\n'*}
  [[ $got == "${b##*/} $version" ]] || die "${b##*/} --version says \"$got\", want \"${b##*/} $version\""
done
mapfile -t image_env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$image" | sed '/^$/d')
workdir=$(podman image inspect --format '{{.Config.WorkingDir}}' "$image")
user=$(podman image inspect --format '{{.Config.User}}' "$image")
config=$(printf '%s\n' "${image_env[@]}" | sed -n 's/^KFPIPE_CONFIG=//p')
[[ $user == 65532:65532 && -n $config ]] || die "image user $user, KFPIPE_CONFIG $config"

# Can containers run here? podman's default crun refuses hybrid cgroup
# v1/v2 hosts and its default ulimits exceed a hard limit an unprivileged
# host may have; runc with the host's limits works there.
#   KFPIPE_IMAGE_CHECK_NO_CONTAINERS=1 takes the no-container path here too.
run=()
[[ ${KFPIPE_IMAGE_CHECK_NO_CONTAINERS:-} == 1 ]] ||
for try in "podman run" "podman --runtime runc run --ulimit nofile=$(ulimit -Hn):$(ulimit -Hn) --ulimit nproc=4096:4096"; do
  # shellcheck disable=SC2086
  if out=$($try --rm "$image" 2>&1) && [[ $out == "kfpipectl $version"* ]]; then
    read -r -a run <<<"$try"
    break
  fi
  log "cannot run containers with '$try': ${out##*$'\n'}"
done
# The README's container command, as written (the line make image-check
# names, after `make image &&`), where containers run.
if ((${#run[@]})); then
  readme_cmd=$(sed -n '/^# Container:/,/^# then the daemon/p' README.md | sed -n '/^make image && /,/--version$/p' |
    sed -e 's/^make image && //' -e 's/\\$//' | tr '\n' ' ')
  [[ $readme_cmd == podman* ]] || die "no container command in README.md's Deploy section"
  out=$(bash -c "$readme_cmd" 2>&1) || die "the README's container command failed: $readme_cmd: $out"
  [[ $out == "kf-producer $version"* ]] || die "the README's container command printed \"$out\", want \"kf-producer $version\""
  echo "README's container command: ok ($out)"
fi
if ((${#run[@]})); then
  log "running the daemons in containers (${run[*]})"
else
  log "no container can run here: running the binaries taken out of the image, with its environment"
fi

# The Kubernetes config (deploy/k8s/base/config.yaml, as the ConfigMap
# mounts it) on the test services: the dev overlay's single-broker
# settings, the services' addresses, free ports.
secrets=(KFPIPE_CALLBACK_TOKEN=ci-token "KFPIPE_CALLBACK_ENCODING_AES_KEY=$(printf 'a%.0s' {1..43})"
  KFPIPE_WECOM_CORP_ID=corp KFPIPE_WECOM_SECRET=secret KFPIPE_ADMIN_TOKENS=ci:operator:ci-admin-token-0123456789)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

check_daemon() {
  local d=$1 ops callback admin state prefix pid started code body t0 elapsed status timeout
  ops=$(free_port) callback=$(free_port) admin=$(free_port)
  state=$work/state-$d
  mkdir -p "$state"
  chown 65532:65532 "$state" 2>/dev/null || true
  prefix="ci-image-$$-$d:"
  env=(KFPIPE_OPS_ADDR="127.0.0.1:$ops" KFPIPE_CALLBACK_ADDR="127.0.0.1:$callback" KFPIPE_ADMIN_ADDR="127.0.0.1:$admin"
    KFPIPE_KAFKA_BROKERS="$KFPIPE_TEST_KAFKA" KFPIPE_REDIS_MODE=single KFPIPE_REDIS_ADDR="$KFPIPE_TEST_REDIS"
    KFPIPE_REDIS_KEY_PREFIX="$prefix" KFPIPE_COORD_ENDPOINTS="$KFPIPE_TEST_ETCD"
    KFPIPE_KAFKA_TOPICS_MAIN_NAME="ci-image-$$-main" KFPIPE_KAFKA_TOPICS_DLQ_NAME="ci-image-$$-dlq"
    KFPIPE_KAFKA_TOPICS_MAIN_PARTITIONS=4 KFPIPE_KAFKA_TOPICS_MAIN_REPLICATION_FACTOR=1 KFPIPE_KAFKA_TOPICS_MAIN_MIN_INSYNC_REPLICAS=1
    KFPIPE_KAFKA_TOPICS_DLQ_PARTITIONS=2 KFPIPE_KAFKA_TOPICS_DLQ_REPLICATION_FACTOR=1 KFPIPE_KAFKA_TOPICS_DLQ_MIN_INSYNC_REPLICAS=1
    KFPIPE_DLQ_EMERGENCY_FILE="/var/lib/kfpipe/$d-dlq-emergency.jsonl"
    KFPIPE_MEDIA_STORE=dir KFPIPE_MEDIA_DIR="/var/lib/kfpipe/media" "${secrets[@]}")
  if ((${#run[@]})); then
    local name=kfpipe-ci-$$-$d envargs=()
    for e in "${env[@]}"; do envargs+=(-e "$e"); done
    ctrs+=("$name")
    "${run[@]}" --rm --name "$name" --network host --read-only --cap-drop ALL --security-opt no-new-privileges \
      -v "$REPO_ROOT/deploy/k8s/base/config.yaml:$config:ro" -v "$state:/var/lib/kfpipe" "${envargs[@]}" \
      --entrypoint "/usr/local/bin/$d" "$image" --config "$config" >"$work/$d.log" 2>&1 &
  else
    # The image's root is not this host's: the config and the state are
    # where the image would have them, under the extracted tree.
    mkdir -p "$work/fs/etc/kfpipe"
    cp deploy/k8s/base/config.yaml "$work/fs$config"
    (cd "$work/fs$workdir" && env -i "${image_env[@]}" "${env[@]}" KFPIPE_DLQ_EMERGENCY_FILE="$state/$d-dlq-emergency.jsonl" \
      "$work/fs/usr/local/bin/$d" --config "$work/fs$config") >"$work/$d.log" 2>&1 &
  fi
  pid=$!
  # /readyz: 503 until ready, never 200 before the daemon's listeners are up.
  started=$SECONDS
  while :; do
    code=$(curl -s -o "$work/readyz" -w '%{http_code}' -m 2 "http://127.0.0.1:$ops/readyz" || true)
    if [[ $code == 200 ]]; then
      if [[ $d == kf-producer ]] && ! port_open "$callback"; then
        die "$d: /readyz 200 before the callback port $callback listens"
      fi
      break
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$work/$d.log" >&2; die "$d exited before it was ready"; }
    ((SECONDS - started < 120)) || { cat "$work/readyz" "$work/$d.log" >&2; die "$d: /readyz not 200 within 120 s (last $code)"; }
    sleep 0.1
  done
  body=$(curl -sf "http://127.0.0.1:$ops/metrics") || die "$d: /metrics failed"
  grep -q "^kfpipe_build_info{.*daemon=\"$d\".*version=\"$version\"" <<<"$body" || die "$d: /metrics has no kfpipe_build_info for $version"
  timeout=$(sed -n 's/^  shutdown_timeout: *\([0-9]*\)s.*/\1/p' deploy/k8s/base/config.yaml | head -1)
  timeout=${timeout:-25}
  t0=$SECONDS
  if ((${#run[@]})); then podman kill --signal TERM "kfpipe-ci-$$-$d" >/dev/null; else kill -TERM "$pid"; fi
  status=0
  wait "$pid" || status=$?
  elapsed=$((SECONDS - t0))
  ((status == 0)) || { cat "$work/$d.log" >&2; die "$d: exit status $status after SIGTERM"; }
  ((elapsed <= timeout)) || die "$d: took ${elapsed}s to stop, ops.shutdown_timeout is ${timeout}s"
  echo "$d: ready after $((t0 - started))s, /metrics ok, exit 0 ${elapsed}s after SIGTERM (shutdown timeout ${timeout}s)"
}
for d in kf-producer schedule-consumer dlq-consumer; do check_daemon "$d"; done

[[ ${KFPIPE_IMAGE_CHECK_NO_DEB:-} == 1 ]] && exit 0

# The .deb: from the same binaries; installed, verified, purged.
deb=$(KFPIPE_REUSE_ROOTFS=1 "$SCRIPTS_DIR/package.sh" | tail -1)
echo "package: $deb ($(stat -c %s "$deb") bytes)"
command -v dpkg >/dev/null || die "no dpkg here"
((EUID == 0)) || die "installing the .deb needs root"
if dpkg -s kfpipe >/dev/null 2>&1; then
  die "a kfpipe package is installed on this machine already; not touching it"
fi
dpkg -i "$deb" >&2
trap 'dpkg --purge kfpipe >/dev/null 2>&1 || true; cleanup' EXIT
getent passwd kfpipe >/dev/null || die "postinst did not create the kfpipe user"
[[ $(stat -c '%U %a' /etc/kfpipe/kfpipe.env) == "root 600" ]] || die "/etc/kfpipe/kfpipe.env is not root 0600"
got=$(/usr/bin/kf-producer --version)
echo "installed: ${got%%$'\n'*}"
if command -v systemd-analyze >/dev/null; then
  # --man=no: the units' Documentation= names a file the package installs.
  out=$(systemd-analyze verify --man=no /lib/systemd/system/kfpipe-*.service 2>&1) || { echo "$out" >&2; die "systemd-analyze verify failed"; }
  grep -i kfpipe <<<"$out" && die "systemd-analyze verify complains about the units"
  echo "systemd-analyze verify: units ok"
else
  log "no systemd-analyze here: units not verified"
fi
dpkg --purge kfpipe >&2
left=()
for f in /usr/bin/kf-producer /lib/systemd/system/kfpipe-kf-producer.service /etc/kfpipe /var/lib/kfpipe; do
  [[ -e $f ]] && left+=("$f")
done
((${#left[@]} == 0)) || die "left behind after purge: ${left[*]}"
getent passwd kfpipe >/dev/null && die "the kfpipe user is left behind after purge"
echo "package: installed, verified and purged cleanly"
