#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine (as root): sets up what is missing
# (scripts/setup.sh), starts the Slurm test cluster, runs pytest (unit + integration on
# the real cluster with real TensorFlow) and a quick benchmark smoke run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source <(slurm-test-cluster/cluster env)
export PATH="$PWD/.venv/bin:$PATH"
python -m pytest -ra "$@"
