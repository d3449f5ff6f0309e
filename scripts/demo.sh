#!/usr/bin/env bash
# The main job, end to end, on a fresh Debian machine (as root):
#   set up (scripts/setup.sh: Slurm + munge, .venv with TensorFlow, the test cluster up),
#   write TFRecord shards from real data (scikit-learn's load_digits),
#   check the input_fn contract on a CPU node (csrun_cpu ... --mode validate_only),
#   train with input streamed from 6 input workers on 3 CPU nodes (csrun_wse),
#   evaluate on the held-out digits.
# CSRUN_TEST_ENGINE=podman runs it on the compose test cluster (containers) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source <(slurm-test-cluster/cluster env)
export PATH="$PWD/.venv/bin:$PATH"
P=examples/digits/configs/params.yaml
MODEL_DIR=${MODEL_DIR:-examples/digits/model_dir}
STEPS=${STEPS:-400}

set -x
python examples/digits/prepare_data.py
rm -rf "$MODEL_DIR"
csrun_cpu python examples/digits/run.py --params "$P" --model_dir "$MODEL_DIR" --mode validate_only
csrun_wse --total-nodes 4 --single-task-nodes 1 --tasks-per-node 2 \
    python-ws examples/digits/run.py --params "$P" --model_dir "$MODEL_DIR" --mode train --max_steps "$STEPS"
csrun_wse --total-nodes 4 --single-task-nodes 1 --tasks-per-node 2 \
    python-ws examples/digits/run.py --params "$P" --model_dir "$MODEL_DIR" --mode eval
set +x
echo "demo: artifacts in $MODEL_DIR:"
ls "$MODEL_DIR" "$MODEL_DIR/performance"
cat "$MODEL_DIR/performance/performance.json"
