#!/bin/bash
# $1 = slurmctld | slurmd. The munge key is shared through the /etc/munge volume;
# slurmctld creates it on first start.
set -euo pipefail
if [ ! -s /etc/munge/munge.key ]; then
    if [ "$1" = slurmctld ]; then
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    else
        for _ in $(seq 1 60); do [ -s /etc/munge/munge.key ] && break; sleep 1; done
    fi
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge && chown munge:munge /run/munge
su -s /bin/sh munge -c munged
case "$1" in
    slurmctld) exec slurmctld -D -i ;;
    slurmd) exec slurmd -D -N "$(hostname -s)" ;;
    *) exec "$@" ;;
esac
