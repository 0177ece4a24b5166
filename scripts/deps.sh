#!/usr/bin/env bash
# Installs the system packages the service scripts need (Debian/Ubuntu), in one
# apt call and only when something is missing; checks that java (17+) and mvn exist.
#   redis-server redis-sentinel etcd-server etcd-client kcat chromium prometheus (promtool) systemd (systemd-analyze)
# Set KFPIPE_NO_APT=1 to only check.
set -euo pipefail
LOG_TAG=deps
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

# command -> Debian package
declare -A PKG=(
  [redis-server]=redis-server
  [redis-cli]=redis-tools
  [redis-sentinel]=redis-sentinel
  [etcd]=etcd-server
  [etcdctl]=etcd-client
  [kcat]=kcat
  [chromium]=chromium
  [promtool]=prometheus
  [systemd-analyze]=systemd
)

missing=()
for cmd in redis-server redis-cli redis-sentinel etcd etcdctl kcat chromium promtool systemd-analyze; do
  command -v "$cmd" >/dev/null || missing+=("${PKG[$cmd]}")
done

if ((${#missing[@]})); then
  # de-duplicate
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [[ ${KFPIPE_NO_APT:-} == 1 ]]; then
    die "missing packages: ${missing[*]} (KFPIPE_NO_APT=1, not installing)"
  fi
  command -v apt-get >/dev/null || die "missing packages: ${missing[*]} and no apt-get here"
  SUDO=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || die "missing packages: ${missing[*]}; run as root or install sudo"
    SUDO=(sudo -n)
  fi
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Wait for a concurrent apt/dpkg instead of failing on its lock.
  APT_OPTS=(-o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
  "${SUDO[@]}" apt-get "${APT_OPTS[@]}" update -qq
  "${SUDO[@]}" apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

command -v java >/dev/null || die "java not found (Debian: apt-get install openjdk-17-jre-headless)"
command -v mvn >/dev/null || die "mvn not found (Debian: apt-get install maven)"
jv=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
[[ ${jv%%.*} -ge 17 ]] || die "java $jv found, Kafka needs 17 or newer"
exit 0
