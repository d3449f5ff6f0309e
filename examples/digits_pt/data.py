"""Digits DataLoaders in the Model Zoo R1.6.1 PyTorch shape: built from ``params["train_input"]``
/ ``params["eval_input"]``, sharded with csrun's ``num_streamers()`` / ``get_streaming_rank()``
through ``DistributedSampler`` (the job-wide ``shuffle_seed`` on every streamer, so the shares
are disjoint; docs/PYTORCH.md "Seeds").

Data: the digits of ``examples/digits`` (scikit-learn's ``load_digits``, the UCI ML hand-written
digits data set, CC BY 4.0) split 80/20 exactly as that example splits them (1,437 training and
360 eval examples, 64 floats in [0, 1] and an int64 label), shipped with this example as
``digits.npz`` (47 KB: the pixel counts 0..16 as uint8, so that a PyTorch-only install needs
neither scikit-learn nor TensorFlow; ``tests/unit/examples/digits_pt/test_data.py`` checks it against
scikit-learn's split where scikit-learn is installed), read from
``<data_dir>/digits-train.npz`` / ``digits-eval.npz`` (``prepare_data.py``) or, when those are
absent, from ``digits.npz`` directly.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from csrun_runtime.pytorch import get_streaming_rank, num_streamers, worker_init_fn

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_eval, y_eval)`` from the shipped ``digits.npz``: examples/digits'
    split (its ``prepare_data.split()``), float32 [N, 64] in [0, 1] and int64 [N]."""
    with np.load(HERE / "digits.npz") as z:
        x_tr, x_ev = (z[k].astype(np.float32) / 16.0 for k in ("x_train", "x_eval"))
        return x_tr, z["y_train"].astype(np.int64), x_ev, z["y_eval"].astype(np.int64)


def load(data_dir: str | None, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x float32 [N, 64], y int64 [N])`` of ``kind`` (``train`` or ``eval``)."""
    for base in ([data_dir, str(REPO / data_dir)] if data_dir else []):
        f = Path(os.path.expanduser(base)) / f"digits-{kind}.npz"
        if f.is_file():
            with np.load(f) as z:
                return z["x"].astype(np.float32), z["y"].astype(np.int64)
    x_tr, y_tr, x_ev, y_ev = _split()
    return (x_tr, y_tr) if kind == "train" else (x_ev, y_ev)


def _loader(section: dict, kind: str) -> DataLoader:
    x, y = load(section.get("data_dir"), kind)
    ds = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    shuffle = bool(section.get("shuffle", kind == "train"))
    sampler: DistributedSampler | None = None
    if kind == "train":  # this streamer's share; the job-wide seed on every streamer keeps the shares disjoint
        sampler = DistributedSampler(ds, num_replicas=num_streamers(), rank=get_streaming_rank(), shuffle=shuffle,
                                     seed=int(section.get("shuffle_seed") or 0))
    workers = int(section.get("num_workers", 0))
    extra: dict[str, Any] = {}
    if workers > 0:  # torch 2 rejects prefetch_factor / persistent_workers without worker processes
        extra = {"prefetch_factor": int(section.get("prefetch_factor", 10)),
                 "persistent_workers": bool(section.get("persistent_workers", False)),
                 "worker_init_fn": worker_init_fn}
    return DataLoader(ds, batch_size=int(section["batch_size"]), sampler=sampler,
                      shuffle=False, drop_last=bool(section.get("drop_last", kind == "train")),
                      num_workers=workers, **extra)


def train_data_fn(params: dict) -> DataLoader:
    """The training DataLoader: this streamer's share of the 1,437 examples, reshuffled each pass."""
    return _loader(params["train_input"], "train")


def eval_data_fn(params: dict) -> DataLoader:
    """The eval DataLoader: the 360 eval examples in order (read by the chief)."""
    return _loader(params["eval_input"], "eval")
