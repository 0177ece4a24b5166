#!/usr/bin/env bash
# Builds the container image's root filesystem into DIR: the five commands
# as fully static binaries (librdkafka's musl build, linked with musl-gcc),
# CA certificates, time zone data, and a kfpipe user (65532). Both ways of
# building the image use it: scripts/image.sh on the host (Go's build cache
# makes it quick) and the Containerfile's build stage.
#
#   scripts/image-rootfs.sh DIR       VERSION=… COMMIT=… DATE=… override git
#
# Needs Go; installs musl-tools, file, ca-certificates, tzdata (Debian) when missing.
set -euo pipefail
LOG_TAG=image
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
(($# == 1)) || die "usage: $0 DIR"
out=$1
cd "$REPO_ROOT"

# The commands the image carries; the manifests' `command`s name them.
CMDS=(kf-producer schedule-consumer dlq-consumer kfpipectl kf-loadgen)

# shellcheck source=image-lib.sh
source "$SCRIPTS_DIR/image-lib.sh"
missing=()
command -v musl-gcc >/dev/null || missing+=(musl-tools)
command -v file >/dev/null || missing+=(file)
[[ -s /etc/ssl/certs/ca-certificates.crt ]] || missing+=(ca-certificates)
[[ -d /usr/share/zoneinfo/Etc ]] || missing+=(tzdata)
apt_install "${missing[@]}"

VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
# The commit's time, not the clock's: the same commit builds the same files.
DATE=${DATE:-$(git log -1 --format=%cI 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)}
pkg=github.com/kfpipe/kfpipe/internal/version
ldflags="-s -w -linkmode external -extldflags -static -X $pkg.version=$VERSION -X $pkg.commit=$COMMIT -X $pkg.date=$DATE"

rm -rf "$out"
mkdir -p "$out/usr/local/bin" "$out/etc/ssl/certs" "$out/usr/share" "$out/etc/kfpipe" "$out/var/lib/kfpipe" "$out/tmp"
log "go build (static, musl) ${CMDS[*]} at $VERSION"
pkgs=()
for c in "${CMDS[@]}"; do pkgs+=("./cmd/$c"); done
# One go build for all of them: one link step each, the packages once.
CGO_ENABLED=1 CC=musl-gcc go build -tags musl -trimpath -buildvcs=false -ldflags "$ldflags" \
  -o "$out/usr/local/bin/" "${pkgs[@]}"

cp /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/"
# The zone files only (no posix/ and right/ copies, no tab files' tools).
cp -a /usr/share/zoneinfo "$out/usr/share/"
rm -rf "$out/usr/share/zoneinfo/posix" "$out/usr/share/zoneinfo/right"
printf 'root:x:0:0:root:/root:/sbin/nologin\nkfpipe:x:65532:65532:kfpipe:/var/lib/kfpipe:/sbin/nologin\n' >"$out/etc/passwd"
printf 'root:x:0:\nkfpipe:x:65532:\n' >"$out/etc/group"
chmod 1777 "$out/tmp"

# Every binary must be static: a dynamic one would not start from scratch.
for c in "${CMDS[@]}"; do
  f=$out/usr/local/bin/$c
  desc=$(file -b "$f")
  [[ $desc == *"statically linked"* || $desc == *"static-pie linked"* ]] || die "$c is not static: $desc"
done
