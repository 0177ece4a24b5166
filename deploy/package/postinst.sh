#!/bin/sh
# kfpipe postinst: the kfpipe system user, its state directory, systemd's
# view of the units. The services are not enabled: edit
# /etc/kfpipe/kfpipe.env and production.yaml, then
#   systemctl enable --now kfpipe-kf-producer kfpipe-schedule-consumer kfpipe-dlq-consumer
set -e
if [ "$1" = configure ] || [ "$1" = 1 ] || [ -z "$1" ]; then
  if ! getent passwd kfpipe >/dev/null; then
    adduser --system --group --no-create-home --home /var/lib/kfpipe --shell /usr/sbin/nologin kfpipe >/dev/null
  fi
  chown kfpipe:kfpipe /var/lib/kfpipe
  chmod 0750 /var/lib/kfpipe
  chown root:root /etc/kfpipe/kfpipe.env
  chmod 0600 /etc/kfpipe/kfpipe.env
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
