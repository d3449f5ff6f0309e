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
import re
from collections.abc import Mapping
from typing import Any

from csrun_common.roles import Role

from ..rankgroup import RankLost
from ..rankgroup import weights_digest as digest_of

__all__ = ["TorchRanks", "collective_timeout", "collective_failure", "weights_digest", "statistics_digest",
           "rank_device", "ddp_misuse", "BASE_TIMEOUT_SECS"]

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
    """Seconds a collective may wait for the other ranks: :data:`BASE_TIMEOUT_SECS`, or the longer of
    ``runconfig.worker_start_timeout_secs`` and ``input_timeout_secs`` plus 60 s."""
    waits = [float(rc.get(k) or 0.0) for k in ("worker_start_timeout_secs", "input_timeout_secs")]
    return max(BASE_TIMEOUT_SECS, max(waits) + 60.0)


def weights_digest(module: Any) -> str:
    """:func:`csrun_runtime.rankgroup.weights_digest` of ``module``'s parameters (their
    ``state_dict()`` entries: :func:`.tensorbytes.entry`, every dtype and shape, 0-dim too)."""
    from .tensorbytes import entries, split_state

    return digest_of(entries(split_state(module)[0]))


def statistics_digest(module: Any) -> str:
    """:func:`csrun_runtime.rankgroup.weights_digest` of the rest of ``module``'s ``state_dict()``:
    its buffers (BatchNorm's running statistics and ``num_batches_tracked``) and extra state."""
    from .tensorbytes import entries, split_state

    return digest_of(entries(split_state(module)[1]))


_UNUSED_WORDS = "find_unused_parameters=True"
_UNUSED_INDICES = re.compile(r"did not receive grad for rank \d+: ([\d, ]+)")


def ddp_misuse(e: BaseException, module: Any) -> str | None:
    """The one line of DistributedDataParallel's error about parameters that got no gradient
    (torch: "Expected to have finished reduction in the prior iteration ...
    ``find_unused_parameters=True``"), naming them and the key that allows them; ``None`` for
    any other error."""
    text = str(e)
    if _UNUSED_WORDS not in text or "ddp.find_unused_parameters" in text:
        return None
    found = _UNUSED_INDICES.search(text)
    trained = [n for n, p in module.named_parameters() if p.requires_grad]
    idx = [int(i) for i in re.split(r"[, ]+", found.group(1).strip()) if i] if found else []
    names = ", ".join(trained[i] for i in idx if i < len(trained)) or "some parameters"
    return (f"runconfig.ddp.find_unused_parameters: the model's {names} got no gradient in a step (not used in "
            "the loss); DistributedDataParallel needs runconfig.ddp: {find_unused_parameters: true} for that "
            "(docs/PYTORCH.md \"Several trainer ranks\")")


class TorchRanks:
    """This process's rank in ``torch.distributed``'s default group (a
    :class:`csrun_runtime.rankgroup.RankGroup`). Make it with :meth:`start`.

    Attributes: ``rank``, ``world_size``, ``local_rank``; ``backend`` (``"nccl"``/``"gloo"``);
    ``device`` (``cuda:LOCAL_RANK`` or ``cpu``); ``timeout`` (seconds); ``module``: the
    unwrapped model whose weights :meth:`digest` hashes (set by :meth:`wrap`); ``options``:
    ``runconfig.ddp`` (DDP's keyword arguments: :data:`csrun_runtime.pytorch.facts.DDP_KEYS`);
    ``sync_batchnorm``: ``runconfig.sync_batchnorm``."""

    def __init__(self, role: Role, backend: str, device: Any, timeout: float,
                 options: Mapping[str, bool] | None = None, sync_batchnorm: bool = False):
        self.rank, self.world_size, self.local_rank = role.rank, role.world_size, role.local_rank
        self.backend, self.device, self.timeout = backend, device, timeout
        self.options, self.sync_batchnorm = dict(options or {}), bool(sync_batchnorm)
        self.module: Any = None

    @property
    def statistics_kept(self) -> str:
        """What the checkpoint holds of the buffers (the verdict's words)."""
        if self.options.get("broadcast_buffers", True):
            return "rank 0's, which DistributedDataParallel broadcasts to every rank (ddp.broadcast_buffers)"
        return "rank 0's (ddp.broadcast_buffers is false: each rank keeps its own)"

    @classmethod
    def start(cls, role: Role, rc: Mapping[str, Any], env: Mapping[str, str] | None = None) -> TorchRanks:
        """Join the default process group as ``role.rank`` of ``role.world_size`` (the module
        docstring); on CUDA first ``torch.cuda.set_device(LOCAL_RANK)``. Raises
        :class:`csrun_runtime.rankgroup.RankLost` (one line: the rank, ``MASTER_ADDR:MASTER_PORT``,
        the timeout and torch's reason) when the rendezvous fails or times out, or when
        torchrun's variables are missing; :class:`.contract.ContractError` for
        ``runconfig.sync_batchnorm`` on CPU (torch: "SyncBatchNorm layers only work with GPU
        modules")."""
        import torch
        import torch.distributed as dist

        from .contract import ContractError

        env = os.environ if env is None else env
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if not env.get(k)]
        if missing:
            raise RankLost(f"trainer rank {role.rank}: {', '.join(missing)} not set (csrun_runtime.ranks sets them "
                           "in a trainer rank's task): cannot join the other ranks")
        cuda = torch.cuda.is_available()
        if rc.get("sync_batchnorm") and not cuda:
            raise ContractError("runconfig.sync_batchnorm: true: SyncBatchNorm runs on CUDA ranks only (torch: "
                                "\"SyncBatchNorm layers only work with GPU modules\"); these ranks train on CPU")
        if cuda:
            torch.cuda.set_device(role.local_rank % max(1, torch.cuda.device_count()))
        device = torch.device(f"cuda:{torch.cuda.current_device()}" if cuda else "cpu")
        self = cls(role, "nccl" if cuda else "gloo", device, collective_timeout(rc), rc.get("ddp"),
                   bool(rc.get("sync_batchnorm")))
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
        """``DistributedDataParallel(module, **runconfig.ddp)`` (``device_ids=[device]`` on CUDA),
        after the restore: its construction broadcasts rank 0's parameters and buffers. With
        ``runconfig.sync_batchnorm`` first ``SyncBatchNorm.convert_sync_batchnorm`` (its layers
        replaced in place, their parameters and buffers kept). Keeps ``module`` for :meth:`digest`."""
        import torch
        from torch.nn.parallel import DistributedDataParallel

        if self.sync_batchnorm:
            module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
            log.info("runconfig.sync_batchnorm: BatchNorm layers converted to SyncBatchNorm")
        self.module = module
        ids = [self.device] if self.backend == "nccl" else None
        options: dict[str, Any] = dict(self.options)
        return DistributedDataParallel(module, device_ids=ids, **options)

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

    def digest(self) -> tuple[str, str]:
        """:func:`weights_digest` and :func:`statistics_digest` of the unwrapped module (``""``
        both before :meth:`wrap`)."""
        if self.module is None:
            return "", ""
        return weights_digest(self.module), statistics_digest(self.module)

    def sync_statistics(self) -> list[str]:
        """Before rank 0 saves (every rank calls it): with ``ddp.broadcast_buffers`` (torch's
        default) rank 0's buffers to every rank, what DDP's next forward would do, in one
        broadcast of their bytes (:func:`.tensorbytes.pack`); returns the names of this rank's
        buffers that differed. ``[]`` without it. Raises :class:`csrun_runtime.rankgroup.RankLost`."""
        import torch.distributed as dist

        from .tensorbytes import pack, unpack_into

        if self.module is None or not self.options.get("broadcast_buffers", True):
            return []
        named = _strided_buffers(self.module)
        if not named:  # the same module on every rank: all skip the broadcast together
            return []
        flat = pack([b for _, b in named]).to(self.device)
        try:
            dist.broadcast(flat, src=0)
        except Exception as e:  # noqa: BLE001
            raise self._lost("the broadcast of rank 0's buffers", e) from None
        return [named[i][0] for i in unpack_into(flat, [b for _, b in named])]

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


def _strided_buffers(module: Any) -> list[tuple[str, Any]]:
    """``module``'s buffers that :meth:`TorchRanks.sync_statistics` broadcasts: dense, not
    quantized (as DDP's own buffer broadcast takes them)."""
    import torch

    return [(n, b) for n, b in module.named_buffers() if b.layout == torch.strided and not b.is_quantized]


def _first_line(e: BaseException) -> str:
    return ((str(e).strip().splitlines() or [""])[0])[:200]
