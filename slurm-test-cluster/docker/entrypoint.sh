#!/bin/bash
# The compose test cluster's container entrypoint, run from the repository mounted at the same
# path as on the host: entrypoint.sh slurmctld | slurmd.
#   every container: its own munged with the cluster's key, its socket where slurm.conf's
#   AuthInfo says (under /run, private to each container);
#   slurmctld: MariaDB and slurmdbd (job accounting; the accounts of accounts.sh registered on
#   the first start), then slurmctld in the foreground;
#   slurmd: slurmd -N <hostname> in the foreground.
# Logs go to /var/log/slurm, which is $CSRUN_CLUSTER_DIR/log/<container> on the host.
set -euo pipefail
DIR=${CSRUN_CLUSTER_DIR:?CSRUN_CLUSTER_DIR is not set}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export SLURM_CONF="$DIR/etc/slurm.conf"
LOG=/var/log/slurm
mkdir -p /run/munge "$LOG"

log() { echo "entrypoint: $*" >&2; }

start_munge() {
    local socket; socket=$(sed -n 's/^AuthInfo=socket=//p' "$SLURM_CONF")
    mkdir -p "$(dirname "$socket")"
    munged --force -S "$socket" --key-file="$DIR/etc/munge.key" \
        --pid-file=/run/munge/munged.pid --log-file="$LOG/munged.log" --seed-file=/run/munge/munged.seed
}

start_accounting() {
    # MariaDB private to this container, reached by slurmdbd (root) over its Unix socket.
    printf '[mariadbd]\ninnodb_buffer_pool_size=512M\ninnodb_log_file_size=64M\ninnodb_lock_wait_timeout=900\nperformance_schema=OFF\n' \
        > /etc/mysql/mariadb.conf.d/99-slurmdbd.cnf
    if [ ! -d /var/lib/mysql/mysql ]; then
        mariadb-install-db --user=mysql --skip-test-db >"$LOG/mariadb-install-db.log" 2>&1
    fi
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    setsid mariadbd --user=mysql --log-error="$LOG/mariadbd.log" </dev/null >/dev/null 2>&1 &
    local i
    for i in $(seq 1 300); do mariadb-admin ping >/dev/null 2>&1 && break; sleep 0.1; done
    mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db"
    slurmdbd
    for i in $(seq 1 300); do sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.1; done
    if [ ! -f /var/lib/mysql/.csrun-registered ]; then
        "$HERE/accounts.sh" "$LOG/sacctmgr.log"
        touch /var/lib/mysql/.csrun-registered
    fi
}

start_munge
case "${1:-}" in
    slurmctld)
        if grep -q '^AccountingStorageType=accounting_storage/slurmdbd' "$SLURM_CONF"; then start_accounting; fi
        log "slurmctld starting"
        exec slurmctld -D -i ;;
    slurmd)
        exec slurmd -D -N "$(hostname -s)" ;;
    *)
        log "usage: entrypoint.sh slurmctld | slurmd"; exit 2 ;;
esac
