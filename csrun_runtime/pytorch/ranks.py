"""The PyTorch trainer ranks of a job of several (``CSRUN_WORLD_SIZE > 1``, docs/MULTI-RANK.md):
the process group and the core's :class:`csrun_runtime.rankgroup.RankGroup` over it.

Each rank's task has torchrun's variables before its run.py starts (:mod:`csrun_runtime.ranks`):
:meth:`TorchRanks.start` joins ``torch.distributed``'s default process group from them
(``init_method="env://"``: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``;
backend ``nccl`` on CUDA, each rank on the device ``cuda:LOCAL_RANK``, ``gloo`` on CPU) with a
bounded ``timeout``: the rendezvous, and every collective later (gloo's, and nccl's with its
asynchronous error handling), fail after it instead of hanging when a rank died or never came.
The chief wraps the module in ``DistributedDataParallel`` (:meth:`TorchRanks.wrap`), whose
construction broadcasts rank 0's parameters and whose backward all-reduces the gradients, so
the ranks' weights stay identical; :meth:`TorchRanks.digest` proves it at the end.
"""
from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Mapping
from typing import Any

from csrun_common.roles import Role

from ..rankgroup import RankLost
from ..rankgroup import weights_digest as digest_of

__all__ = ["TorchRanks", "collective_timeout", "collective_failure", "weights_digest", "rank_device",
           "BASE_TIMEOUT_SECS"]

log = logging.getLogger("csrun.runtime")

#: The least seconds a rendezvous or a collective of the ranks may take before it fails
#: (:func:`collective_timeout` raises it to cover the input's own timeouts).
BASE_TIMEOUT_SECS = 300.0


#: Words of the errors a gloo or nccl collective raises when a peer died or timed out (torch
#: raises them as ``RuntimeError``, ``DistBackendError`` or ``DistNetworkError``).
_COLLECTIVE_WORDS = ("gloo", "nccl", "processgroup", "connection reset", "connection closed", "timed out")


def collective_failure(ranks: TorchRanks | None, e: BaseException) -> RankLost | None:
    """With several trainer ranks, the one-line :class:`csrun_runtime.rankgroup.RankLost` of an
    error a collective of the training step raised (DistributedDataParallel's gradient
    all-reduce when another rank died, or timed out): ``None`` for any other error, or
    with one rank."""
    if ranks is None:
        return None
    import torch.distributed as dist

    text = str(e).lower()
    if isinstance(e, dist.DistError) or any(w in text for w in _COLLECTIVE_WORDS):
        return ranks._lost("a collective of the training step", e)
    return None


def rank_device(role: Role) -> Any:
    """The chief's device: ``cuda`` (``cuda:LOCAL_RANK`` for a trainer rank of several) when
    CUDA is there, else ``cpu``."""
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    if role.world_size > 1:
        return torch.device(f"cuda:{role.local_rank % max(1, torch.cuda.device_count())}")
    return torch.device("cuda")


def collective_timeout(rc: Mapping[str, Any]) -> float:
    """Seconds a collective may wait for the other ranks: :data:`BASE_TIMEOUT_SECS`, or more
    when the runconfig lets a rank wait longer for its input (``worker_start_timeout_secs``,
    ``input_timeout_secs``, plus 60 s): a rank waiting for its first batch keeps the others in
    the stop agreement that long."""
    waits = [float(rc.get(k) or 0.0) for k in ("worker_start_timeout_secs", "input_timeout_secs")]
    return max(BASE_TIMEOUT_SECS, max(waits) + 60.0)


def weights_digest(module: Any) -> str:
    """:func:`csrun_runtime.rankgroup.weights_digest` of ``module``'s ``state_dict()`` (each
    tensor's bytes on the CPU)."""
    import torch

    def host(t: Any) -> Any:
        return t.detach().to("cpu").contiguous() if isinstance(t, torch.Tensor) else torch.as_tensor(t)

    tensors = ((name, host(t)) for name, t in module.state_dict().items())
    # reshape(-1): a 0-d tensor (BatchNorm's num_batches_tracked, a step counter) has no byte view
    return digest_of((name, str(x.dtype), tuple(x.shape),
                      x.reshape(-1).view(torch.uint8).numpy().tobytes() if x.numel() else b"") for name, x in tensors)


class TorchRanks:
    """This process's rank in ``torch.distributed``'s default group (a
    :class:`csrun_runtime.rankgroup.RankGroup`). Make it with :meth:`start`.

    Attributes: ``rank``, ``world_size``, ``local_rank``; ``backend`` (``"nccl"``/``"gloo"``);
    ``device`` (``cuda:LOCAL_RANK`` or ``cpu``); ``timeout`` (seconds); ``module``: the
    unwrapped model whose weights :meth:`digest` hashes (set by :meth:`wrap`)."""

    def __init__(self, role: Role, backend: str, device: Any, timeout: float):
        self.rank, self.world_size, self.local_rank = role.rank, role.world_size, role.local_rank
        self.backend, self.device, self.timeout = backend, device, timeout
        self.module: Any = None

    @classmethod
    def start(cls, role: Role, rc: Mapping[str, Any], env: Mapping[str, str] | None = None) -> TorchRanks:
        """Join the default process group as ``role.rank`` of ``role.world_size`` (the module
        docstring); on CUDA first ``torch.cuda.set_device(LOCAL_RANK)``. Raises
        :class:`csrun_runtime.rankgroup.RankLost` (one line: the rank, ``MASTER_ADDR:MASTER_PORT``,
        the timeout and torch's reason) when the rendezvous fails or times out, or when
        torchrun's variables are missing."""
        import torch
        import torch.distributed as dist

        env = os.environ if env is None else env
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if not env.get(k)]
        if missing:
            raise RankLost(f"trainer rank {role.rank}: {', '.join(missing)} not set (csrun_runtime.ranks sets them "
                           "in a trainer rank's task): cannot join the other ranks")
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(role.local_rank % max(1, torch.cuda.device_count()))
        device = torch.device(f"cuda:{torch.cuda.current_device()}" if cuda else "cpu")
        self = cls(role, "nccl" if cuda else "gloo", device, collective_timeout(rc))
        where = f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
        try:
            dist.init_process_group(self.backend, init_method="env://", rank=role.rank, world_size=role.world_size,
                                    timeout=datetime.timedelta(seconds=self.timeout))
        except Exception as e:  # noqa: BLE001 - torch's rendezvous errors have several types
            raise RankLost(f"trainer rank {role.rank} of {role.world_size}: the rendezvous at {where} failed within "
                           f"{self.timeout:.0f} s: {type(e).__name__}: {_first_line(e)}") from None
        log.info("trainer rank %d of %d (local %d) joined the process group at %s: backend %s, device %s, "
                 "collective timeout %.0f s", role.rank, role.world_size, role.local_rank, where, self.backend,
                 device, self.timeout)
        return self

    def wrap(self, module: Any) -> Any:
        """``DistributedDataParallel(module)`` (``device_ids=[device]`` on CUDA), after the
        restore: its construction broadcasts rank 0's parameters and buffers. Keeps ``module``
        for :meth:`digest`."""
        from torch.nn.parallel import DistributedDataParallel

        self.module = module
        ids = [self.device] if self.backend == "nccl" else None
        return DistributedDataParallel(module, device_ids=ids)

    def _tensor(self, value: int) -> Any:
        import torch

        return torch.tensor([int(value)], dtype=torch.int64, device=self.device)

    def agree(self, code: int, /) -> int:
        """The maximum ``code`` over the ranks (one all-reduce of one int64). Raises
        :class:`csrun_runtime.rankgroup.RankLost`."""
        import torch.distributed as dist

        t = self._tensor(code)
        try:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        except Exception as e:  # noqa: BLE001
            raise self._lost("the stop agreement", e) from None
        return int(t.item())

    def gather(self, obj: Any, /) -> list[Any]:
        """Every rank's ``obj`` in rank order (``all_gather_object``). Raises
        :class:`csrun_runtime.rankgroup.RankLost`."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(out, obj)
        except Exception as e:  # noqa: BLE001
            raise self._lost("gathering the ranks' figures", e) from None
        return out

    def digest(self) -> str:
        """:func:`weights_digest` of the unwrapped module (``""`` before :meth:`wrap`)."""
        return weights_digest(self.module) if self.module is not None else ""

    def close(self) -> None:
        """Leave the process group (``destroy_process_group``); errors are only logged."""
        import torch.distributed as dist

        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            log.debug("destroy_process_group failed", exc_info=True)

    def _lost(self, what: str, e: BaseException) -> RankLost:
        return RankLost(f"trainer rank {self.rank} of {self.world_size}: {what} failed (another rank died, "
                        f"or did not answer within {self.timeout:.0f} s): {type(e).__name__}: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    return ((str(e).strip().splitlines() or [""])[0])[:200]
