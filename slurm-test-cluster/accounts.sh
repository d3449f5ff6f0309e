#!/usr/bin/env bash
# accounts.sh LOGFILE : register the test cluster and what tests use in slurmdbd's database,
# once (run by slurm-test-cluster/cluster on the native cluster's first start and by the
# compose cluster's slurmctld container). Needs SLURM_CONF set and slurmdbd answering.
#   accounts csrun (root's default) and research; QOS normal (Slurm's own, root's default,
#   no limits) and debug (wall time at most 10 minutes, longer jobs refused at submission);
#   root associated with both accounts and both QOS.
# Exits 2 with one line on stderr when the result is not there.
set -uo pipefail
log=${1:?usage: accounts.sh LOGFILE}
cluster=$(sed -n 's/^ClusterName=//p' "${SLURM_CONF:?SLURM_CONF is not set}" | head -n1)
acct() { sacctmgr -i "$@" >>"$log" 2>&1; }   # "add" of what exists already fails harmlessly
acct add cluster "$cluster"
acct add qos debug MaxWall=00:10:00 Flags=DenyOnLimit \
    Description="short test jobs: at most 10 minutes, longer ones refused at submission"
acct add account csrun Cluster="$cluster" Description="csrun tests, the default account of root" Organization=csrun
acct add account research Cluster="$cluster" Description="a second account for tests" Organization=csrun
acct add user root Cluster="$cluster" Account=csrun,research DefaultAccount=csrun QOS=normal,debug DefaultQOS=normal
# Check the result rather than each command's status.
accts=$(sacctmgr -n -P show assoc user=root cluster="$cluster" format=account | sort -u | tr '\n' ' ')
qos=$(sacctmgr -n -P show assoc user=root cluster="$cluster" account=csrun format=qos)
case "$accts" in *csrun*research*) ;; *) echo "accounting setup failed (root's accounts: '$accts'); see $log" >&2; exit 2 ;; esac
case "$qos" in *debug*) ;; *) echo "accounting setup failed (root's QOS: '$qos'); see $log" >&2; exit 2 ;; esac
