#!/usr/bin/env bash
# What `make package` runs: the kfpipe .deb (deploy/package/nfpm.yaml) with
# nfpm, from the image's static binaries (scripts/image-rootfs.sh), into
# bin/. Prints the package's path.
#
#   scripts/package.sh          VERSION=… overrides git describe
set -euo pipefail
LOG_TAG=package
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$REPO_ROOT"

# nfpm, a Go packager, run from its module (pinned; cached by Go).
NFPM=${NFPM:-github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.44.0}

VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
export VERSION
# A Debian version: v1.2.3 -> 1.2.3, v1.2.3-4-gabc1234 -> 1.2.3+4+gabc1234
# (sorts after 1.2.3); a bare commit (no tag yet) -> 0.0.0+gabc1234.
DEB_VERSION=${VERSION#v}
[[ $DEB_VERSION =~ ^[0-9]+\.[0-9]+ ]] || DEB_VERSION=0.0.0+g$DEB_VERSION
DEB_VERSION=${DEB_VERSION//-/+}
export DEB_VERSION

rootfs=$REPO_ROOT/bin/image-rootfs
if [[ ${KFPIPE_REUSE_ROOTFS:-} != 1 || ! -x $rootfs/usr/local/bin/kf-producer ]]; then
  "$SCRIPTS_DIR/image-rootfs.sh" "$rootfs"
fi
# deploy/package/nfpm.yaml takes the files from bin/package/.
pkgdir=$REPO_ROOT/bin/package
rm -rf "$pkgdir"
mkdir -p "$pkgdir/bin" "$pkgdir/units"
cp "$rootfs"/usr/local/bin/* "$pkgdir/bin/"
for u in deploy/systemd/kfpipe-*.service; do
  sed 's|^ExecStart=/usr/local/bin/|ExecStart=/usr/bin/|' "$u" >"$pkgdir/units/$(basename "$u")"
  grep -q '^ExecStart=/usr/bin/' "$pkgdir/units/$(basename "$u")" || die "$u: ExecStart does not run /usr/local/bin/…"
done

out=$REPO_ROOT/bin/kfpipe_${DEB_VERSION}_amd64.deb
rm -f "$out"
log "nfpm: $out"
go run "$NFPM" package --config deploy/package/nfpm.yaml --packager deb --target "$out" >&2
echo "$out"
