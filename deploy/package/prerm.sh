#!/bin/sh
# kfpipe prerm: stop and disable the services before their files go.
set -e
if [ -d /run/systemd/system ] && { [ "$1" = remove ] || [ "$1" = purge ] || [ "$1" = 0 ]; }; then
  for u in kfpipe-kf-producer kfpipe-schedule-consumer kfpipe-dlq-consumer; do
    systemctl disable --now "$u.service" >/dev/null 2>&1 || true
  done
fi
exit 0
