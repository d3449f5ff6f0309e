#!/usr/bin/env bash
# One command for a GPU machine (issue 31): bench/bench_gpu_feed.py full size and bench_ingest_gap.py's
# table 1, results into $OUT.
#   OUT=/tmp/out bash bench/gpu/run.sh            # from the repository root, ~3-5 minutes on 16 cores
# Installs a carried pyzmq wheel (bench/gpu/wheels/*.whl, or $WHEELS/*.whl) into /tmp/site when
# pyzmq is missing (the device machine reaches no package index). torchvision is optional: without
# it the ResNet-50 step rows are reported as skipped.
set -u
OUT=${OUT:-/tmp/gpu_feed_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
if ! python3 -c 'import zmq' 2>/dev/null; then
  WHEELS=${WHEELS:-$ROOT/bench/gpu/wheels}
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/pyzmq*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$ROOT:$ROOT/bench:${PYTHONPATH:-}
{ date -u; nproc; nvidia-smi -L 2>&1; python3 -c 'import torch, zmq, numpy; print(torch.__version__, torch.version.cuda, zmq.__version__, numpy.__version__)'; git -C "$ROOT" log -1 --oneline 2>/dev/null; } > "$OUT/env.txt" 2>&1
python3 bench/bench_gpu_feed.py --ks "${KS:-4,8}" --out "$OUT/gpu_feed_cuda.json" 2>&1 | tee "$OUT/gpu_feed.log"
# issue 31's table 1 (ingest, data plane / raw TCP, k = 1, 2, 4, 8): ~5 minutes on 16 cores; SKIP_INGEST=1 skips it
[ "${SKIP_INGEST:-0}" = 1 ] || python3 bench/bench_ingest_gap.py --out "$OUT/ingest_recv_16core.json" 2>&1 | tail -20 | tee "$OUT/ingest.log"
python3 -m pytest -q -x tests/unit/test_pytorch_devicefeed.py 2>&1 | tail -5 | tee -a "$OUT/gpu_feed.log"
