#!/usr/bin/env bash
# Set csrun up on a fresh Debian machine (run as root): Debian's slurm-wlm + munge, and
# slurmdbd + mariadb-server for the test cluster's job accounting; podman, runc and
# debootstrap for the compose test cluster (its image is built by `cluster up --engine
# podman` when first needed); a virtual environment .venv with csrun (editable) + TensorFlow
# + test tools (podman-compose among them) + the CPU wheel of PyTorch (the pt extra); and the
# native Slurm test cluster started (slurm-test-cluster/cluster up). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need_apt+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need_apt+=(munge)
command -v slurmdbd >/dev/null 2>&1 || [ -x /usr/sbin/slurmdbd ] || need_apt+=(slurmdbd)
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || need_apt+=(runc)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need_apt+=(debootstrap)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]} (apt)"
    # The test cluster runs its own munged, MariaDB and slurmdbd in its directory: keep apt
    # from starting the system-wide services (invoke-rc.d(8): a policy-rc.d exiting 101
    # denies every start), unless the machine has a policy of its own.
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"
        trap 'rm -f "$policy"' EXIT
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    if [ "$(trap -p EXIT)" ]; then rm -f "$policy"; trap - EXIT; fi
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    python3 -m venv .venv
fi
stamp=.venv/.csrun-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setup: installing csrun[all,test] into .venv (TensorFlow included; about a minute)"
    .venv/bin/pip install -q --disable-pip-version-check -e '.[all,test]'
    touch "$stamp"
fi
# PyTorch for the python-pt tests (the pt extra): the CPU-only wheel, not the default one with
# several GB of CUDA libraries.
if ! .venv/bin/python -c 'import torch' >/dev/null 2>&1; then
    echo "setup: installing torch==2.13.0+cpu into .venv (the pt extra, CPU wheel)"
    .venv/bin/pip install -q --disable-pip-version-check 'torch==2.13.0+cpu'
fi

slurm-test-cluster/cluster up
echo "setup: done. Use: source <(slurm-test-cluster/cluster env); export PATH=\"$PWD/.venv/bin:\$PATH\""
