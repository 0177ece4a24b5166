#!/bin/sh
# kfpipe postrm: on purge, the state directory and the kfpipe user go too.
set -e
if [ "$1" = purge ]; then
  rm -rf /var/lib/kfpipe /etc/kfpipe
  if getent passwd kfpipe >/dev/null && command -v deluser >/dev/null; then
    deluser --system kfpipe >/dev/null 2>&1 || true
  fi
  if getent group kfpipe >/dev/null && command -v delgroup >/dev/null; then
    delgroup --system kfpipe >/dev/null 2>&1 || true
  fi
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
