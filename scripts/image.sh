#!/usr/bin/env bash
# What `make image` runs: builds the kfpipe container image with podman and
# tags it IMAGE:VERSION (VERSION = git describe --tags --always --dirty).
#
#   scripts/image.sh              IMAGE=kfpipe/kfpipe VERSION=… override
#
# The root filesystem (static binaries, CA certificates, tzdata, the kfpipe
# user) is built on the host by scripts/image-rootfs.sh, where Go's build
# cache makes it quick, and handed to the Containerfile as the "rootfs"
# stage: the image is the Containerfile's final stage, the same as a plain
# `podman build .` makes, without the Go toolchain image and a cold cache.
# Installs podman and runc (Debian) when missing; image-rootfs.sh its own.
set -euo pipefail
LOG_TAG=image
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$REPO_ROOT"

IMAGE=${IMAGE:-kfpipe/kfpipe}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
export VERSION

# shellcheck source=image-lib.sh
source "$SCRIPTS_DIR/image-lib.sh"
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
apt_install "${missing[@]}"

rootfs=$REPO_ROOT/bin/image-rootfs
"$SCRIPTS_DIR/image-rootfs.sh" "$rootfs"

log "podman build $IMAGE:$VERSION"
podman build --quiet --build-context "rootfs=$rootfs" -f Containerfile -t "$IMAGE:$VERSION" \
  --label "org.opencontainers.image.version=$VERSION" \
  --label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)" . >/dev/null
# A rebuild under the same tag leaves the previous image untagged: drop
# those (kfpipe's only, by its label).
podman image prune -f --filter label=org.opencontainers.image.title=kfpipe >/dev/null 2>&1 || true
size=$(podman image inspect --format '{{.Size}}' "$IMAGE:$VERSION")
log "built $IMAGE:$VERSION ($((size / 1024 / 1024)) MiB, $size bytes)"
echo "$IMAGE:$VERSION"
