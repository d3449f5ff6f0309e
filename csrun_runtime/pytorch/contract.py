"""The PyTorch run.py contract (docs/CONTRACT.md "PyTorch", docs/PYTORCH.md): checks with their
messages, the optimizer from ``params["optimizer"]``, seeds, per-process params and batches.

Rules and messages:

1. ``train_data_fn(params)`` / ``eval_data_fn(params)`` return a ``torch.utils.data.DataLoader``
   -> :data:`MSG_NOT_LOADER`.
2. Training batches have a fixed size across steps: a training DataLoader with a
   ``batch_size`` must have ``drop_last=True`` -> :data:`MSG_BATCH` (the fixed-batch-size
   rule and its first sentence from "Limitations of the CerebrasEstimator", with PyTorch's fix).
3. ``model_fn(params)`` returns a ``torch.nn.Module`` -> :data:`MSG_NOT_MODULE`, whose
   ``forward(batch)`` returns the loss: a scalar tensor, or a mapping with a scalar ``"loss"``
   -> :data:`MSG_LOSS`.
4. The optimizer is the module's ``configure_optimizer(params)`` when it defines one, else
   built from ``params["optimizer"]``: ``optimizer_type`` (sgd, momentum, adam, adamw; any
   case), ``learning_rate`` (a number > 0, or the Model Zoo's schedules: :mod:`.lr_schedule`),
   optional ``momentum``, ``weight_decay`` (``weight_decay_rate`` too), ``betas`` (or
   ``beta1``/``beta2``), ``eps`` (or ``epsilon``) -> :class:`ContractError` naming the key.

Seeds (issue 25, "Limitations of the CerebrasEstimator": "each worker node must shuffle its
data differently"): what is *split* across streamers uses one job-wide seed, the YAML's
``train_input.shuffle_seed``, left unchanged in every process's params (``DistributedSampler``
and ``ShardedSampler`` shuffle all indices with it, then take their share: a per-worker seed
would make the shares overlap); torch's own RNG (and ``random``, numpy) is seeded with
:func:`torch_seed` = base + rank before the data function runs, so whatever is shuffled after
the split, and each DataLoader worker process's seed (torch derives it from that RNG), differs
per streamer. csrun's facts go into ``params["csrun"]`` and never into ``train_input``
(whose ``num_workers`` is the DataLoader's process count). torch is imported inside functions.
"""
from __future__ import annotations

import copy
import random
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["epochs", "MSG_NOT_LOADER", "MSG_BATCH", "MSG_NOT_MODULE", "MSG_LOSS", "ContractError", "check_loader",
           "check_module", "loss_of", "build_optimizer", "build_lr_scheduler", "torch_seed", "seed_process",
           "worker_init_fn", "process_params", "to_numpy", "to_torch", "batch_size_of", "call_data_fn"]

MSG_NOT_LOADER = "[Unsupported PyTorch] The data function must return a torch.utils.data.DataLoader"
MSG_BATCH = ("[Unsupported PyTorch] Inconsistent batch sizes detected. To ensure a fixed batch size across all "
             "steps, set `drop_last=True` on the DataLoader the data function returns "
             "(train_input.drop_last: true).")
MSG_NOT_MODULE = "[Unsupported PyTorch] model_fn(params) must return a torch.nn.Module"
MSG_LOSS = ("[Unsupported PyTorch] The module's forward(batch) must return the loss: a scalar tensor, "
            "or a mapping with a scalar tensor under 'loss'")

#: optimizer_type -> torch.optim class name.
OPTIMIZERS = {"sgd": "SGD", "momentum": "SGD", "adam": "Adam", "adamw": "AdamW"}


class ContractError(ValueError):
    """A violation of the contract; ``str()`` is the one-line message (section named first)."""


def call_data_fn(fn: Callable[[dict[str, Any]], Any], params: dict[str, Any], section: str) -> Any:
    """``fn(params)``, checked to be a DataLoader (:func:`check_loader`).

    Raises:
        ContractError: ``fn`` raised (its type and message named, e.g. torch's own
            ``prefetch_factor`` error at ``num_workers: 0``, then the last frames in the user's
            code on indented lines: :func:`csrun_runtime.usererror.describe`) or broke rule 1/2.
    """
    try:
        loader = fn(params)
    except Exception as e:  # noqa: BLE001 - any error of the user's data function is reported
        from ..usererror import describe

        raise ContractError(describe(e, f"{section}: the data function")) from e
    check_loader(loader, section)
    return loader


def check_loader(loader: Any, section: str = "train_input") -> None:
    """Rules 1 and 2 (the fixed batch size only for ``train_input``).

    Raises:
        ContractError: not a DataLoader, or a training DataLoader with ``drop_last=False``.
    """
    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader):
        raise ContractError(f"{section}: {MSG_NOT_LOADER}, got {type(loader).__name__}")
    if section == "train_input" and loader.batch_size is not None and not loader.drop_last:
        raise ContractError(f"{section}: {MSG_BATCH}")


def check_module(model: Any) -> None:
    """Rule 3's first half. Raises :class:`ContractError`."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ContractError(f"model: {MSG_NOT_MODULE}, got {type(model).__name__}")


def loss_of(out: Any) -> Any:
    """The scalar loss tensor of ``forward``'s result (rule 3). Raises :class:`ContractError`."""
    import torch

    if isinstance(out, Mapping):
        out = out.get("loss")
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ContractError(f"model: {MSG_LOSS}, got {shape}")
    return out.reshape(())


def build_optimizer(model: Any, params: Mapping[str, Any]) -> Any:
    """Rule 4: the module's ``configure_optimizer(params)`` or the one ``params["optimizer"]``
    describes. Raises :class:`ContractError` naming ``optimizer.<key>`` and the value."""
    import torch

    if callable(getattr(model, "configure_optimizer", None)):
        return model.configure_optimizer(params)
    spec = params.get("optimizer") or {}
    kind = str(spec.get("optimizer_type", "sgd")).lower()
    if kind not in OPTIMIZERS:
        raise ContractError(f"optimizer.optimizer_type {spec.get('optimizer_type')!r} is not supported "
                            f"(one of {', '.join(OPTIMIZERS)}; or define configure_optimizer(params) on the module)")
    lr = _learning_rate(spec)  # a schedule sets the rate at every step (build_lr_scheduler)
    kw: dict[str, Any] = {"lr": lr if isinstance(lr, float) else lr.rate(0)}
    try:
        wd = spec.get("weight_decay", spec.get("weight_decay_rate"))
        if wd is not None:
            kw["weight_decay"] = float(wd)
        if OPTIMIZERS[kind] == "SGD":
            kw["momentum"] = float(spec.get("momentum", 0.9 if kind == "momentum" else 0.0))
        else:
            if spec.get("betas") is not None:
                kw["betas"] = tuple(float(b) for b in spec["betas"])
            elif "beta1" in spec or "beta2" in spec:  # the Model Zoo's spelling
                kw["betas"] = (float(spec.get("beta1", 0.9)), float(spec.get("beta2", 0.999)))
            eps = spec.get("eps", spec.get("epsilon"))
            if eps is not None:
                kw["eps"] = float(eps)  # YAML reads 1e-6 as a string: float() takes it
    except (TypeError, ValueError) as e:
        raise ContractError(f"optimizer: a weight decay, momentum, beta or eps that is not a number ({e})") from None
    return getattr(torch.optim, OPTIMIZERS[kind])(model.parameters(), **kw)


def build_lr_scheduler(model: Any, optimizer: Any, params: Mapping[str, Any], start: int) -> Any:
    """The learning-rate scheduler of the optimizer :func:`build_optimizer` built from a
    schedule in ``optimizer.learning_rate`` (a ``LambdaLR`` at global step ``start``; call its
    ``step()`` after every optimizer step), or None: a constant rate, or the module's own
    ``configure_optimizer``. Raises :class:`ContractError` as :func:`build_optimizer`."""
    if callable(getattr(model, "configure_optimizer", None)):
        return None
    from .lr_schedule import attach

    lr = _learning_rate(params.get("optimizer") or {})
    return None if isinstance(lr, float) else attach(optimizer, lr, start)


def _learning_rate(spec: Mapping[str, Any]) -> Any:
    """:func:`.lr_schedule.parse_learning_rate`, its error as a :class:`ContractError`."""
    from .lr_schedule import ScheduleError, parse_learning_rate

    try:
        return parse_learning_rate(spec)
    except ScheduleError as e:
        raise ContractError(str(e)) from None


# --------------------------------------------------------------------------- seeds and params
def torch_seed(params: Mapping[str, Any], rank: int) -> int | None:
    """The seed of torch's RNG in streamer ``rank``: ``base + rank``, ``base`` the YAML's
    ``train_input.shuffle_seed``, else ``runconfig.seed``; None without either (unseeded:
    every process differs anyway)."""
    ti = params.get("train_input") or {}
    base = ti.get("shuffle_seed")
    if base is None:
        base = (params.get("runconfig") or {}).get("seed")
    return None if base is None else int(base) + int(rank)


def seed_process(seed: int | None) -> None:
    """Seed torch, ``random`` and numpy's global RNG with ``seed`` (None: leave them)."""
    if seed is None:
        return
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (1 << 32))


def worker_init_fn(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn`` seeding ``random`` and numpy in each DataLoader worker
    process from torch's per-worker seed (``torch.initial_seed()``: the loader's base seed +
    ``worker_id``, different per streamer through :func:`seed_process`)."""
    import numpy as np
    import torch

    s = torch.initial_seed()
    random.seed(s)
    np.random.seed(s % (1 << 32))


def process_params(params: Mapping[str, Any], rank: int, num_streamers: int, streamer: bool,
                   data_dir: Any = None, data_files: list[str] | None = None) -> dict[str, Any]:
    """The params a data function receives in one process: a deep copy with ``train_input``
    unchanged (``shuffle_seed`` the job-wide YAML value, ``num_workers`` the DataLoader's) but
    for ``data_dir`` under a shard plan (the worker's view), and csrun's facts under
    ``params["csrun"]``: ``streaming_rank``, ``num_streamers``, ``is_streamer``,
    ``torch_seed`` (:func:`torch_seed`), ``data_files`` (a shard plan's files, else None)."""
    out = copy.deepcopy(dict(params))
    if data_dir is not None and isinstance(out.get("train_input"), dict):
        out["train_input"]["data_dir"] = data_dir
    out["csrun"] = {"streaming_rank": int(rank), "num_streamers": int(num_streamers), "is_streamer": bool(streamer),
                    "torch_seed": torch_seed(params, rank), "data_files": data_files}
    return out


# --------------------------------------------------------------------------- batches
def to_numpy(nest: Any) -> Any:
    """A batch with every tensor as a numpy array (CPU tensors: views, no copy); dicts, lists
    and tuples kept; other leaves unchanged (the data plane takes what ``np.asarray`` takes)."""
    import torch

    if isinstance(nest, torch.Tensor):
        return nest.detach().cpu().numpy()
    if isinstance(nest, Mapping):
        return {k: to_numpy(v) for k, v in nest.items()}
    if isinstance(nest, tuple):
        return tuple(to_numpy(v) for v in nest)
    if isinstance(nest, list):
        return [to_numpy(v) for v in nest]
    return nest


def to_torch(nest: Any, device: Any = None) -> Any:
    """A batch with every numpy array as a tensor (``torch.from_numpy``: no copy; arrays over
    received frames are read-only, and torch's warning about that is silenced) and every
    tensor moved to ``device`` (CUDA: a host tensor pinned first unless it is already, copied
    with ``non_blocking=True``). A tensor already on ``device`` is returned as it is (``"cuda"``
    means the current CUDA device: a tensor on ``cuda:0`` is on it when that is current)."""
    import numpy as np
    import torch

    target = None if device is None else _resolved_device(torch, device)

    def one(x: Any) -> Any:
        if isinstance(x, np.ndarray) and x.dtype.kind in "biufc":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                x = torch.from_numpy(x)
        if isinstance(x, torch.Tensor) and target is not None and x.device != target:
            if target.type == "cuda" and x.device.type == "cpu":
                return (x if x.is_pinned() else x.pin_memory()).to(target, non_blocking=True)
            return x.to(target)
        return x

    if isinstance(nest, Mapping):
        return {k: to_torch(v, device) for k, v in nest.items()}
    if isinstance(nest, tuple):
        return tuple(to_torch(v, device) for v in nest)
    if isinstance(nest, list):
        return [to_torch(v, device) for v in nest]
    return one(nest)


def _resolved_device(torch: Any, device: Any) -> Any:
    """``device`` as a ``torch.device`` with its index (``"cuda"``: the current CUDA device)."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return d


def batch_size_of(nest: Any) -> int | None:
    """The leading dimension of the batch's first array or tensor leaf (None: none found)."""
    if isinstance(nest, Mapping):
        nest = list(nest.values())
    if isinstance(nest, (list, tuple)):
        for v in nest:
            n = batch_size_of(v)
            if n is not None:
                return n
        return None
    shape = getattr(nest, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) > 0 else None


def epochs(loader: Any) -> Iterator[Any]:
    """The DataLoader's batches, pass after pass for ever, calling ``set_epoch(epoch)`` on its
    sampler (and its batch sampler's sampler) first when it has one (``DistributedSampler``:
    a new shuffle each pass, the same on every streamer)."""
    epoch = 0
    while True:
        for s in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
            if s is not None and callable(getattr(s, "set_epoch", None)):
                s.set_epoch(epoch)
        n = 0
        for batch in loader:
            n += 1
            yield batch
        if n == 0:
            raise ContractError("train_input: the DataLoader yielded no batch (a dataset smaller than one "
                                "batch with drop_last, or an empty shard)")
        epoch += 1
