"""The PyTorch chief's evaluation: the eval DataLoader (streamer 0 of 1) and one pass over it
(the mean loss and the module's ``eval_metrics``), to ``eval/results.json``, eval events and
the log (docs/PYTORCH.md).

:class:`Evaluator` gets what it uses (the eval data function, params, model_dir, device and
the loss function), not the chief (:mod:`csrun_runtime.pytorch.chief` owns one).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from csrun_common.atomic import read_json, write_json

from ..artifacts import write_params_yaml
from .contract import ContractError, batch_size_of, call_data_fn, process_params, seed_process, to_torch, torch_seed
from .events import EventWriter
from .streamers import StreamerFacts, set_facts

__all__ = ["Evaluator"]

log = logging.getLogger("csrun.runtime")


class Evaluator:
    """Evaluates the PyTorch chief's module.

    Args:
        eval_data_fn: run.py's eval data function, or None (then :meth:`loader` raises).
        params: the resolved params (``runconfig.eval_steps``, ``eval_input``).
        model_dir: where ``eval/`` and ``eval/params_eval.yaml`` go.
        device: the ``torch.device`` batches are moved to.
        forward_loss: ``forward_loss(model, batch)``: the loss tensor of a batch.
    """

    def __init__(self, eval_data_fn: Callable[..., Any] | None, params: dict[str, Any], model_dir: Path,
                 device: Any, forward_loss: Callable[[Any, Any], Any]):
        self.eval_data_fn, self.params, self.model_dir = eval_data_fn, params, model_dir
        self.rc = params["runconfig"]
        self.device, self.forward_loss = device, forward_loss
        self.writer: EventWriter | None = None

    def loader(self) -> Any:
        """The eval DataLoader, built as streamer 0 of 1 (seeded as streamer 0). Raises
        :class:`csrun_runtime.pytorch.contract.ContractError` without an eval data function or
        for a DataLoader that breaks the contract."""
        if self.eval_data_fn is None:
            raise ContractError("eval_input: run() was given no eval_data_fn")
        set_facts(StreamerFacts(1, 0, True))
        seed_process(torch_seed(self.params, 0))
        return call_data_fn(self.eval_data_fn, process_params(self.params, 0, 1, True), "eval_input")

    def evaluate(self, model: Any, step: int) -> dict[str, float]:
        """One pass over the eval DataLoader (``runconfig.eval_steps`` batches at most): the
        mean loss and the module's ``eval_metrics(batch)`` (means weighted by batch size), to
        ``eval/results.json`` (with a history), eval events and the log. Raises
        :class:`csrun_runtime.pytorch.contract.ContractError` when the loader yields no batch."""
        import torch

        loader = self.loader()
        limit = self.rc.get("eval_steps")
        sums: dict[str, float] = {}
        samples = batches = 0
        metrics_fn = getattr(model, "eval_metrics", None)
        t0 = time.monotonic()
        model.eval()
        with torch.no_grad():
            for batch in loader:
                if limit and batches >= int(limit):
                    break
                b = to_torch(batch, self.device)
                n = batch_size_of(b) or 1
                vals = {"loss": float(self.forward_loss(model, b))}
                if callable(metrics_fn):
                    vals.update({k: float(v) for k, v in metrics_fn(b).items()})
                for k, v in vals.items():
                    sums[k] = sums.get(k, 0.0) + v * n
                samples += n
                batches += 1
        dt = time.monotonic() - t0
        if samples == 0:
            raise ContractError("eval_input: the eval DataLoader yielded no batch")
        res = {k: v / samples for k, v in sums.items()}
        self._write(res, step, samples, batches, dt)
        log.info("Eval results at global step %d (%d samples): %s", step, samples,
                 ", ".join(f"{k} = {v:.6g}" for k, v in res.items()))
        return res

    def _write(self, res: dict[str, float], step: int, samples: int, batches: int, dt: float) -> None:
        """The eval events, ``eval/params_eval.yaml`` and the record in ``eval/results.json``."""
        if self.writer is None:
            self.writer = EventWriter(self.model_dir / "eval")
        self.writer.scalars(res, step)
        self.writer.flush()
        write_params_yaml(self.model_dir, self.params, "eval")
        path = self.model_dir / "eval" / "results.json"
        prev = read_json(path) or {}
        history = prev.get("history", []) if isinstance(prev, dict) else []
        rec = {"global_step": step, "metrics": {k: round(v, 6) for k, v in res.items()}, "eval_samples": samples,
               "eval_batches": batches, "time": round(dt, 4)}
        history.append(rec)
        write_json(path, {**rec, "history": history[-100:]})
