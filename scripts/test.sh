#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine (as root): sets up what is missing
# (scripts/setup.sh), starts the Slurm test cluster, runs pytest (unit + integration on
# the real cluster with real TensorFlow) and a quick benchmark smoke run; without arguments
# also `ruff check .` and `mypy` first.
#
# Then, without arguments (what CI runs) or with CSRUN_TEST_COMPOSE=1, the compose test
# cluster: the launcher, main-job and accounting integration tests again, on podman
# containers with their own hostnames and IPs (slurm-test-cluster/cluster up --engine podman;
# the image is built once and kept by podman for later runs), then it is brought down.
# CSRUN_TEST_COMPOSE=0 skips that stage. Exit status: non-zero when either stage failed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source <(slurm-test-cluster/cluster env)
export PATH="$PWD/.venv/bin:$PATH"
compose=${CSRUN_TEST_COMPOSE:-$([ $# -eq 0 ] && echo 1 || echo 0)}

rc=0
# Lint and types first (pyproject.toml configures both): cheap, and a failure fails the run.
if [ $# -eq 0 ]; then
    ruff check . || rc=$?
    mypy || rc=$?
fi
python -m pytest -ra --durations=30 "$@" || rc=$?

if [ "$compose" = 1 ]; then
    echo "test: the compose test cluster (podman)"
    trap 'slurm-test-cluster/cluster down --engine podman >/dev/null 2>&1 || true' EXIT
    crc=0
    slurm-test-cluster/cluster up --engine podman >/dev/null || crc=$?
    if [ "$crc" = 0 ]; then
        python -m pytest -ra --cluster-engine podman tests/integration/test_launcher_cluster.py \
            tests/integration/test_main_job.py tests/integration/test_cluster_accounting.py || crc=$?
    fi
    slurm-test-cluster/cluster down --engine podman >/dev/null || true
    [ "$crc" = 0 ] || rc=$crc
fi
exit "$rc"
