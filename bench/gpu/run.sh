#!/usr/bin/env bash
# One command for a GPU machine (issue 31), from the repository root; results into $OUT. The parts
# run most important first, each under its own time limit, so that one part's failure or a short
# lease leaves the others' results:
#   env.txt, devicefeed_tests.log     the device, versions; the device feed's and the pinned pool's
#                                     tests on CUDA (the lent path: received straight into pinned
#                                     blocks, copied to the GPU from there, blocks reused)
#                                     and the shared-memory ring's CUDA test (issue 43 item 4: a
#                                     co-located worker's batches copied to the GPU from its ring,
#                                     registered with cudaHostRegister)
#   gpu_feed_shared.json              the image rows at k = 8 with every process on every core (as
#                                     bench/results/gpu/gpu_feed_h200*.json were measured), now with
#                                     the bulk channel's rows: receive only, the device feed lent
#                                     the pinned pool (one host copy), and not lent (the ring's copy)
#   gpu_feed_split.json, gpu_feed.log bench_gpu_feed.py full size (k = $KS, ResNet-50 rows), the
#                                     chief on half the cores and the senders on the other half
#                                     (--split-cores: input workers on other nodes leave the
#                                     chief's cores alone), with a row of 4 copy threads beside
#                                     the default's 2 on those 8 cores (the third run's split chief
#                                     was staging-bound at 8.5 GB/s with 3.7 of its 8 cores busy);
#                                     its `shared memory, device feed` rows at k = 4 are issue 43's
#                                     item 4 target (>= 12 GB/s, chief <= 0.1 core-s per GB)
#   ingest_16core.json, ingest.log    bench_ingest_gap.py: issue 31's table 1 at k = 4, 8 (256 KiB,
#                                     4 MiB; 2 reps), beside 8 zmq I/O threads and the bulk channel
#                                     (a reader thread per sender) (the third run's two cells under
#                                     0.8 were there: is 4 I/O threads the limit at k = 8?);
#                                     SKIP_INGEST=1 skips it
# (The third run's M_TOP_PAD A/B and 38.5 MB ingest rows are in bench/results/gpu/*_r3*.)
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
part 120 python3 -m pytest -q -p no:cacheprovider tests/unit/csrun_runtime/pytorch/test_devicefeed.py tests/unit/csrun_runtime/pytorch/test_pinned.py \
  tests/unit/csrun_runtime/dataplane/test_bulk.py tests/unit/csrun_runtime/dataplane/test_shm.py 2>&1 | tee "$OUT/devicefeed_tests.log" | tail -5
part 120 python3 bench/bench_gpu_feed.py --kinds images --ks 8 --no-step --out "$OUT/gpu_feed_shared.json" 2>&1 | tail -16
part 300 python3 bench/bench_gpu_feed.py --split-cores --ks "${KS:-4,8}" --copy-threads 4 --out "$OUT/gpu_feed_split.json" 2>&1 | tee "$OUT/gpu_feed.log"
[ "${SKIP_INGEST:-0}" = 1 ] || part 180 python3 bench/bench_ingest_gap.py --variants "raw TCP;data plane;data plane, 8 I/O threads;bulk channel" \
  --ks 4,8 --sizes "256 KiB;4 MiB" --repeats 2 --out "$OUT/ingest_16core.json" > "$OUT/ingest.log" 2>&1
for f in "$OUT"/ingest_16core.json; do [ -f "$f" ] && python3 - "$f" <<'PY' 2>&1 | tee -a "$OUT/ingest.log"; done
import json, sys
r = json.load(open(sys.argv[1]))["results"]
for k, sizes in r.items():
    for size, vs in sizes.items():
        print(k, size, {v: (x.get("mb_per_sec"), x.get("vs_raw_tcp"), x.get("chief_cpu_s_per_mb"),
                            x.get("chief_faults_per_mb")) for v, x in vs.items()})
PY
