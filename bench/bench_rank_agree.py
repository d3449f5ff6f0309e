"""Benchmark: the cost of the trainer ranks' stop agreement (csrun_runtime/rankgroup.py).

Several trainer ranks agree before every chunk whether to go on: one all-reduce (MAX) of one
int64 (:meth:`csrun_runtime.pytorch.ranks.TorchRanks.agree`). Two gloo ranks on this host (two
spawned processes, ``127.0.0.1``) time ``calls`` agreements in a row, after 50 to warm up, and
for scale the all-reduce of a 1 Mi-float32 gradient (4 MiB) that DistributedDataParallel makes
per step for a model of a million parameters. Figures: microseconds per agreement (median of
the ranks' means, and each rank's), milliseconds per 4 MiB all-reduce. CPU only (no GPU here).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path


def _rank(rank: int, port: int, out: str, calls: int) -> None:
    import torch
    import torch.distributed as dist

    from csrun_common.roles import Role
    from csrun_runtime.pytorch.ranks import TorchRanks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    ranks = TorchRanks.start(Role(kind="chief", worker_index=None, num_input_workers=0, rank=rank, world_size=2), {})
    for _ in range(50):
        ranks.agree(0)
    t0 = time.perf_counter()
    for _ in range(calls):
        ranks.agree(0)
    agree_s = (time.perf_counter() - t0) / calls
    grad = torch.zeros(1 << 20)
    t0 = time.perf_counter()
    for _ in range(20):
        dist.all_reduce(grad)
    grad_s = (time.perf_counter() - t0) / 20
    ranks.close()
    Path(out, f"{rank}.json").write_text(json.dumps({"agree_us": agree_s * 1e6, "grad_4mib_ms": grad_s * 1e3}))


def run(quick: bool = False) -> dict:
    """Two gloo ranks: ``calls`` agreements (quick 500, full 5000)."""
    import torch.multiprocessing as mp

    calls = 500 if quick else 5000
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    out = tempfile.mkdtemp(prefix="csrun-bench-agree.")
    mp.spawn(_rank, args=(port, out, calls), nprocs=2, join=True)
    got = [json.loads(Path(out, f"{r}.json").read_text()) for r in (0, 1)]
    return {"benchmark": "stop agreement of 2 gloo trainer ranks on one host: one int64 all-reduce (MAX) per chunk",
            "unit": "us", "calls": calls, "agree_us_per_rank": [round(g["agree_us"], 1) for g in got],
            "agree_us": round(sorted(g["agree_us"] for g in got)[0], 1),
            "grad_allreduce_4mib_ms": [round(g["grad_4mib_ms"], 2) for g in got],
            "host_cpus": os.cpu_count(), "loadavg": os.getloadavg()[0]}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
