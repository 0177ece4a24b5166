# Helpers of the image and package scripts. Sourced after lib.sh.
# shellcheck shell=bash

# apt_install PKG…: installs the Debian packages given (the callers pass
# only the missing ones), as root or with sudo -n.
apt_install() {
  (($#)) || return 0
  command -v apt-get >/dev/null || die "missing: $* and no apt-get here"
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || die "missing packages: $*; run as root or install sudo"
    sudo=(sudo -n)
  fi
  log "installing: $*"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
  "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >&2
}
