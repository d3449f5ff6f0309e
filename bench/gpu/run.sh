#!/usr/bin/env bash
# One command for a GPU machine (issue 31), from the repository root; results into $OUT:
#   env.txt, devicefeed_tests.log     the device, versions; the device feed's tests on CUDA
#   gpu_feed_split.json, gpu_feed.log bench_gpu_feed.py full size (k = $KS, ResNet-50 rows), the
#                                     chief on half the cores and the senders on the other half
#                                     (--split-cores: input workers on other nodes leave the
#                                     chief's cores alone), with a row of 4 copy threads beside
#                                     the default's 2 on those 8 cores (the third run's split chief
#                                     was staging-bound at 8.5 GB/s with 3.7 of its 8 cores busy)
#   gpu_feed_shared.json              the image rows at k = 8 with every process on every core
#                                     (as bench/results/gpu/gpu_feed_h200*.json were measured)
#   gpu_feed_shared_nopad.json        the same with the chief's glibc without M_TOP_PAD (A/B)
#   ingest_images.json                bench_ingest_gap.py, 38.5 MB elements, k = 8: raw TCP, the
#                                     data plane, and without M_TOP_PAD (2 reps)
#   ingest_16core.json, ingest.log    bench_ingest_gap.py: issue 31's table 1 at k = 4, 8 (256 KiB,
#                                     4 MiB; 3 reps), beside 8 zmq I/O threads (the third run's two
#                                     cells under 0.8 were there: is 4 I/O threads the limit at k = 8?);
#                                     SKIP_INGEST=1 skips it
# Each part has its own time limit, so that one part's failure leaves the others' results.
#   OUT=/tmp/out SKIP_INGEST=1 bash bench/gpu/run.sh   # about 6 minutes on 16 cores
# pyzmq is installed from carried wheels (.whl/*.whl, or $WHEELS) into /tmp/site when missing:
# the GPU machine reaches no package index (device README).
set -u
OUT=${OUT:-/tmp/gpu_feed_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export PYTHONUNBUFFERED=1
if ! python3 -c 'import zmq' 2>/dev/null; then
  WHEELS=${WHEELS:-$ROOT/.whl}
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$ROOT:$ROOT/bench:${PYTHONPATH:-}
{ date -u; echo "nproc $(nproc)"; nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1;
  python3 -c 'import torch, zmq, numpy, torchvision; print("torch", torch.__version__, "cuda", torch.version.cuda, "pyzmq", zmq.__version__, "libzmq", zmq.zmq_version(), "numpy", numpy.__version__, "torchvision", torchvision.__version__)';
  git -C "$ROOT" log -1 --oneline 2>/dev/null; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
part() { local limit=$1; shift; echo "== $(date -u +%T) $* (limit ${limit}s)"; timeout -k 10 "$limit" "$@"; echo "== exit $?"; }
part 90 python3 -m pytest -q -p no:cacheprovider tests/unit/test_pytorch_devicefeed.py 2>&1 | tee "$OUT/devicefeed_tests.log" | tail -5
part 240 python3 bench/bench_gpu_feed.py --split-cores --ks "${KS:-4,8}" --copy-threads 4 --out "$OUT/gpu_feed_split.json" 2>&1 | tee "$OUT/gpu_feed.log"
part 90 python3 bench/bench_gpu_feed.py --kinds images --ks 8 --no-step --out "$OUT/gpu_feed_shared.json" 2>&1 | tail -12
part 90 python3 bench/bench_gpu_feed.py --kinds images --ks 8 --no-step --no-top-pad --out "$OUT/gpu_feed_shared_nopad.json" 2>&1 | tail -12
part 90 python3 bench/bench_ingest_gap.py --variants "raw TCP;data plane;data plane, no top pad" --ks 8 \
  --sizes "38.5 MB" --repeats 2 --out "$OUT/ingest_images.json" > "$OUT/ingest_images.log" 2>&1
[ "${SKIP_INGEST:-0}" = 1 ] || part 150 python3 bench/bench_ingest_gap.py --variants "raw TCP;data plane;data plane, 8 I/O threads" \
  --ks 4,8 --sizes "256 KiB;4 MiB" --repeats 3 --out "$OUT/ingest_16core.json" > "$OUT/ingest.log" 2>&1
for f in "$OUT"/ingest_images.json "$OUT"/ingest_16core.json; do [ -f "$f" ] && python3 - "$f" <<'PY' 2>&1 | tee -a "$OUT/ingest.log"; done
import json, sys
r = json.load(open(sys.argv[1]))["results"]
for k, sizes in r.items():
    for size, vs in sizes.items():
        print(k, size, {v: (x.get("mb_per_sec"), x.get("vs_raw_tcp"), x.get("chief_cpu_s_per_mb"),
                            x.get("chief_faults_per_mb")) for v, x in vs.items()})
PY
