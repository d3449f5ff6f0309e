#!/usr/bin/env bash
# Run some tests N times in a row on a Slurm test cluster of their own, to catch what fails only
# now and then (issue 40: the error-once tests raced under the suite's load). Run it beside the
# suite (`bash scripts/test.sh` in another shell) to load the machine as CI does.
#
#   bash scripts/repeat-tests.sh N PYTEST_ARGS...     e.g.  bash scripts/repeat-tests.sh 20 tests/integration/test_one_error_cluster.py
#
# The cluster lives in $REPEAT_CLUSTER_DIR (default: a temporary directory) on port
# $REPEAT_CLUSTER_PORT (default 16617, beside the suite's 16817 and the pinned 16917) and is
# stopped at the end. Prints one line per run and a summary; writes it as JSON to
# $REPEAT_RESULT when set. Exit status: 0 when every run passed.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:?usage: repeat-tests.sh N PYTEST_ARGS...}; shift
dir=${REPEAT_CLUSTER_DIR:-$(mktemp -d /tmp/csrun-repeat.XXXXXX)}
export CSRUN_CLUSTER_DIR="$dir" CSRUN_CLUSTER_PORT=${REPEAT_CLUSTER_PORT:-16617}
export PATH="$PWD/.venv/bin:$PATH"
slurm-test-cluster/cluster up >/dev/null
trap 'slurm-test-cluster/cluster down >/dev/null 2>&1 || true' EXIT
source <(slurm-test-cluster/cluster env)
passed=0; failed=0; runs=()
for i in $(seq 1 "$n"); do
    t0=$(date +%s.%N)
    if python -m pytest -q -p no:cacheprovider "$@" > "$dir/run-$i.log" 2>&1; then
        passed=$((passed + 1)); verdict=passed
    else
        failed=$((failed + 1)); verdict=failed
    fi
    secs=$(python -c "import time; print(round(time.time() - $t0, 1))")
    echo "run $i: $verdict in ${secs} s ($dir/run-$i.log)"
    runs+=("{\"run\": $i, \"result\": \"$verdict\", \"secs\": $secs}")
done
echo "repeat-tests: $passed passed, $failed failed of $n: $*"
if [ -n "${REPEAT_RESULT:-}" ]; then
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    printf '{"tests": "%s", "runs": %s, "passed": %s, "failed": %s, "loadavg_at_end": "%s", "each": [%s]}\n' \
        "$*" "$n" "$passed" "$failed" "$load" "$(IFS=,; echo "${runs[*]}")" > "$REPEAT_RESULT"
fi
[ "$failed" = 0 ]
