"""Benchmark: what issue 44's checks of several trainer ranks cost (docs/MULTI-RANK.md).

* **The weights digest.** Every rank digests its model at the end (and PyTorch's buffers travel
  as one frame before each checkpoint): :mod:`csrun_runtime.pytorch.tensorbytes` reads every
  tensor as ``t.reshape(-1).view(torch.uint8)`` of its host copy. Compared, on a ResNet-50-shaped
  ``state_dict`` (torchvision's layer shapes, 25.6 M float32 parameters, 53 BatchNorm layers with
  their running statistics and 0-dim int64 counters), with the digest before issue 44
  (``x.view(torch.uint8)``, which raised on the 0-dim counters: timed here without them), in
  alternating repetitions; medians and their ratio. The buffers' frame (``pack``/``unpack_into``)
  is timed too.
* **The layout search.** A refusal of csrun_wse or the analyzer names the nearest layout that fits
  (:func:`launcher.rankfit.fitting_layout`): timed on a partition of 256 nodes × 64 CPUs (32 of
  them with ``gpu:8``) for 64 ranks whose input workers the world does not divide, and for a GRES
  no node has (every split refused at once).
CPU only; no Slurm.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def _resnet50_state(torch):
    """A state_dict of torchvision ResNet-50's shapes (conv weights, BatchNorm weight, bias,
    running mean and var, num_batches_tracked; the fc layer)."""
    state = {}

    def conv_bn(name, c_in, c_out, k):
        state[f"{name}.conv.weight"] = torch.randn(c_out, c_in, k, k)
        for key in ("weight", "bias", "running_mean", "running_var"):
            state[f"{name}.bn.{key}"] = torch.randn(c_out)
        state[f"{name}.bn.num_batches_tracked"] = torch.tensor(100)

    conv_bn("stem", 3, 64, 7)
    c_in = 64
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for b in range(blocks):
            p = f"layer{stage + 1}.{b}"
            conv_bn(f"{p}.1", c_in, width, 1)
            conv_bn(f"{p}.2", width, width, 3)
            conv_bn(f"{p}.3", width, width * 4, 1)
            if b == 0:
                conv_bn(f"{p}.down", c_in, width * 4, 1)
            c_in = width * 4
    state["fc.weight"], state["fc.bias"] = torch.randn(1000, 2048), torch.randn(1000)
    return state


def _old_digest(state, digest_of, torch):
    """The digest before issue 44 (csrun_runtime/pytorch/ranks.py at 339be4e)."""
    def host(t):
        return t.detach().to("cpu").contiguous()

    return digest_of((name, str(x.dtype), tuple(x.shape), x.view(torch.uint8).numpy().tobytes() if x.numel() else b"")
                     for name, x in ((n, host(t)) for n, t in state.items()))


def _digests(reps: int) -> dict:
    import torch

    from csrun_runtime.pytorch.tensorbytes import entries, pack, unpack_into
    from csrun_runtime.rankgroup import weights_digest as digest_of

    state = _resnet50_state(torch)
    no_counters = {k: v for k, v in state.items() if v.dim() > 0}
    new, old, frame = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        digest_of(entries(state))
        new.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _old_digest(no_counters, digest_of, torch)
        old.append(time.perf_counter() - t0)
    buffers = [v for k, v in state.items() if ".bn.running_" in k or k.endswith("num_batches_tracked")]
    for _ in range(reps):
        t0 = time.perf_counter()
        unpack_into(pack(buffers), buffers)
        frame.append(time.perf_counter() - t0)
    n = sum(v.numel() for v in state.values())
    return {"digest_resnet50_ms": round(1e3 * statistics.median(new), 1),
            "digest_before_issue44_ms": round(1e3 * statistics.median(old), 1),
            "digest_ratio_new_over_old": round(statistics.median(new) / statistics.median(old), 3),
            "buffers_frame_roundtrip_ms": round(1e3 * statistics.median(frame), 2),
            "state_tensors": len(state), "state_elements": n, "zero_dim_tensors": len(state) - len(no_counters),
            "reps": reps}


@dataclass(frozen=True)
class _Node:
    name: str
    gres: str = ""


def _search(reps: int) -> dict:
    from csrun_common.layout import LayoutSpec
    from launcher.rankfit import fitting_layout

    nodes = [_Node(f"g{i:03d}", "gpu:8") for i in range(32)] + [_Node(f"c{i:03d}") for i in range(224)]
    asked = LayoutSpec(203, 7, 9, chief_nodes=8, chief_tasks_per_node=8)  # 195 × 7 workers for 64 ranks
    times, fit = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        fit = fitting_layout(asked, "gpu:1", "g[000-031]", nodes, 64)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    none = fitting_layout(asked, "tpu:1", "g[000-031]", nodes, 64)
    return {"fitting_layout_256_nodes_ms": round(1e3 * statistics.median(times), 1),
            "fitting_layout_no_gres_ms": round(1e3 * (time.perf_counter() - t0), 1),
            "fitting_layout_found": " ".join(fit.to_flags()) if fit else None, "no_gres_found": none}


def run(quick: bool = False) -> dict:
    """The digest and frame figures (quick: 3 repetitions, full: 9) and the layout search's."""
    reps = 3 if quick else 9
    return {"benchmark": "rank_checks", "unit": "ms", **_digests(reps), **_search(3 if quick else 5)}


if __name__ == "__main__":
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
