"""The PyTorch :class:`csrun_runtime.input_backend.InputBackend`: the training DataLoader as
streamer ``i`` of ``W``, built by the input worker's own function
(:func:`.worker.build_loader`: process params, streamer facts, seeds), with the DataLoader's
``num_workers`` / ``prefetch_factor`` set in ``train_input`` for the probe and torch's intra-op
threads set to ``C`` (``torch.set_num_threads``).

CPUs: the caller pins the process to its ``C`` CPUs before :meth:`TorchInputBackend.build`;
DataLoader worker processes inherit the affinity of the thread that starts them (fork, spawn;
a forkserver started earlier would not), so each pass pins the children that do not have the
process's CPUs (:func:`pin_children`) and ``info["dataloader_worker_cpus"]`` records the CPUs
they had. torch sets one intra-op thread in each DataLoader worker itself.

torch is imported when a DataLoader is built; never TensorFlow.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Generator
from typing import Any

from ..input_backend import BuiltInput, InputBuildError
from ..usererror import describe
from .contract import ContractError, batch_size_of, epochs
from .facts import FACTS
from .worker import build_loader

__all__ = ["INPUT_BACKEND", "TorchInputBackend", "describe_error", "pin_children", "samples_and_bytes"]


def samples_and_bytes(batch: Any) -> tuple[int, int]:
    """``(samples, bytes)`` of one batch: its leading dimension (:func:`.contract.batch_size_of`,
    1 when none) and the summed ``nbytes`` of its tensors/arrays (nested dicts, lists, tuples)."""
    def size(x: Any) -> int:
        if isinstance(x, dict):
            return sum(size(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return sum(size(v) for v in x)
        nb = getattr(x, "nbytes", None)
        if nb is None and hasattr(x, "element_size") and hasattr(x, "nelement"):
            nb = x.element_size() * x.nelement()
        return int(nb or 0)

    return (batch_size_of(batch) or 1), size(batch)


def pin_children(cpus: set[int]) -> tuple[int, list[list[int]]]:
    """Pin this process's child processes (DataLoader workers) to ``cpus`` where their
    affinity differs. Returns ``(children, the affinities they had)``; children that exit
    meanwhile are skipped."""
    import psutil

    had: list[list[int]] = []
    kids = psutil.Process().children(recursive=True)
    for k in kids:
        try:
            cur = set(os.sched_getaffinity(k.pid))
            had.append(sorted(cur))
            if cur != cpus:
                os.sched_setaffinity(k.pid, cpus)
        except (ProcessLookupError, OSError, psutil.Error):
            pass
    return len(kids), had


class TorchInputBackend:
    """:class:`csrun_runtime.input_backend.InputBackend` for a PyTorch ``train_data_fn``.

    ``train_data_fn``: ``train_data_fn(params) -> torch.utils.data.DataLoader``; ``params``: the
    resolved params (``default_params_fn`` applied; :class:`csrun_runtime.capture.CapturedRun`'s).
    """

    framework = FACTS.name

    def __init__(self, train_data_fn: Callable[..., Any], params: dict[str, Any]):
        self.fn, self.params = train_data_fn, params

    def build(self, worker_index: int, num_input_workers: int, cpus: int, *,
              dataloader_workers: int | None = None, prefetch_factor: int | None = None) -> BuiltInput:
        """See :meth:`csrun_runtime.input_backend.InputBackend.build`. ``dataloader_workers``
        and ``prefetch_factor`` replace ``train_input.num_workers`` / ``prefetch_factor`` (a
        ``prefetch_factor`` of the params is dropped at ``num_workers`` 0 only if the data
        function itself passes it on: a processor that passes it anyway fails, as torch 2 makes
        it). Raises :class:`InputBuildError` with the contract's message (the data function's
        error named) when the DataLoader cannot be built."""
        params = dict(self.params)
        ti = dict(params.get("train_input") or {})
        if dataloader_workers is not None:
            ti["num_workers"] = int(dataloader_workers)
        if prefetch_factor is not None:
            ti["prefetch_factor"] = int(prefetch_factor)
        params["train_input"] = ti
        try:
            loader, _, seed = build_loader(self.fn, params, worker_index, num_input_workers, worker_index,
                                           threads=int(cpus))
        except ContractError as e:
            raise InputBuildError(str(e).split("\n", 1)[0], detail=str(e)) from None  # one line: a probe table's cell
        import torch

        cpuset = set(os.sched_getaffinity(0))
        info: dict[str, Any] = {"framework": self.framework, "cpus": int(cpus),
                                "dataloader_workers": int(loader.num_workers),
                                "prefetch_factor": getattr(loader, "prefetch_factor", None),
                                "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
                                "torch_threads": torch.get_num_threads(), "batch_size": loader.batch_size,
                                "torch_seed": seed, "dataloader_worker_cpus": []}
        restarts = [0]
        passes = self._passes(loader, cpuset, info, restarts)
        # close(): the generator's GeneratorExit drops the DataLoader's iterator, whose worker
        # processes are shut down and joined now, not whenever the garbage collector runs
        return BuiltInput(batches=passes, measure=samples_and_bytes, info=info, restarts=restarts,
                          close=passes.close)

    @staticmethod
    def _passes(loader: Any, cpuset: set[int], info: dict[str, Any], restarts: list[int]) -> Generator[Any, None, None]:
        """:func:`.chief.epochs` of ``loader``, pinning its worker processes after the first
        batch of each pass (they start with the pass unless persistent)."""
        n, pin_next = 0, True
        for batch in epochs(loader):
            if pin_next and loader.num_workers:
                kids, had = pin_children(cpuset)
                info["dataloader_worker_cpus"], info["dataloader_worker_processes"] = had, kids
            pin_next = False
            n += 1
            yield batch
            if _new_pass(loader, n):
                restarts[0] += 1
                pin_next = not getattr(loader, "persistent_workers", False)


def _new_pass(loader: Any, n: int) -> bool:
    """Whether batch ``n`` (0-based count so far) starts a pass (``len(loader)`` known)."""
    try:
        return n % len(loader) == 0
    except TypeError:
        return False


def describe_error(error: BaseException, what: str) -> str:
    """An input worker's lines for ``error`` from building or iterating the DataLoader: a ``ContractError``'s
    message, else :func:`csrun_runtime.usererror.describe`'s (a DataLoader worker process's error read
    from its message)."""
    if isinstance(error, ContractError):
        return str(error)
    return describe(error, what)


#: This backend's :class:`csrun_runtime.input_backend.InputBackend` (:class:`csrun_runtime.backend.InputBackendModule`).
INPUT_BACKEND = TorchInputBackend
