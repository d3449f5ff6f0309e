"""The input-backend interface: build input worker ``i`` of ``W``'s training input held to ``C``
CPUs, and iterate its batches counting samples (docs/ARCHITECTURE.md "Backends").

One small protocol, :class:`InputBackend`, that both frameworks implement:

- TensorFlow (:class:`csrun_runtime.tensorflow.input_backend.TFInputBackend`): ``input_fn(params_i)``
  exactly as an input worker builds it (:func:`csrun_runtime.tensorflow.pipeline.build_worker_input`:
  per-worker params, TF_CONFIG, seeds), checked against the contract
  (:func:`csrun_runtime.tensorflow.contract.check_dataset`) and held to ``C`` cores
  (:func:`csrun_runtime.tensorflow.service.limit_threads`: a private threadpool of ``C``);
- PyTorch (:class:`csrun_runtime.pytorch.input_backend.TorchInputBackend`): the DataLoader as
  streamer ``i`` of ``W`` built by the input worker's own function
  (:func:`csrun_runtime.pytorch.worker.build_loader`), with ``train_input.num_workers`` (the
  DataLoader's worker processes) and ``prefetch_factor`` set by the caller, and
  ``torch.set_num_threads(C)``.

:func:`analyzer.probe_worker.backend_for` picks the one a captured run.py
(:class:`csrun_runtime.capture.CapturedRun`, its ``framework``) needs. The analyzer's
``pipeline`` probes (:mod:`analyzer.probe_worker`) build and iterate through it; what it does not
cover yet: the runtime's own input workers (they call the same build functions directly), the
chief's ingest (tf.data service / data plane) and the ingest and served probes.

No TensorFlow or torch import at module level: each backend imports its framework when it builds.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["InputBackend", "BuiltInput", "InputBuildError", "samples_in"]


class InputBuildError(ValueError):
    """The input could not be built at the requested point (the data function raised, or the
    contract rejected what it returned; e.g. ``prefetch_factor`` given with DataLoader
    ``num_workers: 0``, which torch 2 rejects). ``str()`` is one line; ``detail`` the whole
    report when it has more (the user's frames on indented lines), else ``""``."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


@dataclass
class BuiltInput:
    """Input worker ``i``'s built input.

    Attributes:
        batches: an endless iterator of batches (restarted at the end of each pass, a new
            ``set_epoch`` / a new ``iter(dataset)``); raises ``RuntimeError`` (or the
            framework's contract error) when a pass yields nothing.
        measure: ``measure(batch) -> (samples, bytes)``: the batch's leading dimension (1 when
            it has none) and the summed bytes of its arrays/tensors.
        info: what was built, JSON-able (``framework``, ``cpus``; PyTorch: ``dataloader_workers``,
            ``prefetch_factor``, ``torch_threads``, ``batch_size``).
        restarts: passes begun after the first (updated while iterating).
        close: release it (worker processes, iterators); idempotent.
    """

    batches: Iterator[Any]
    measure: Callable[[Any], tuple[int, int]]
    info: dict[str, Any] = field(default_factory=dict)
    restarts: list[int] = field(default_factory=lambda: [0])
    close: Callable[[], None] = lambda: None


class InputBackend(Protocol):
    """Build and iterate one input worker's training input (see the module docstring). ``build``'s
    ``dataloader_workers`` / ``prefetch_factor``: the PyTorch DataLoader's ``train_input.num_workers`` /
    ``prefetch_factor`` (``None``: the params' value; TensorFlow ignores both)."""

    #: ``"tensorflow"`` or ``"pytorch"``.
    framework: str

    def build(self, worker_index: int, num_input_workers: int, cpus: int, *,
              dataloader_workers: int | None = None, prefetch_factor: int | None = None) -> BuiltInput:
        """Input worker ``worker_index`` (< ``num_input_workers``) on ``cpus`` CPUs; raises :class:`InputBuildError`."""
        ...


def samples_in(flat: list) -> int:
    """Samples in one element given as its flattened tensors: the leading dimension of the
    first one (1 for a scalar, an unknown dimension or none)."""
    if not flat:
        return 1
    shape = flat[0].shape
    return int(shape[0]) if len(shape) >= 1 and shape[0] is not None else 1
