"""Checkpoints of a PyTorch run: ``<model_dir>/model-ckpt-<global step>.pt``.

Each file is ``torch.save`` of ``{"format": FORMAT, "global_step": int, "model": state_dict,
"optimizer": state_dict or None, "time": unix seconds}``; written to a temporary file in the
same directory and moved into place with ``os.replace`` (atomic on POSIX), so a reader or a
restart never sees half a checkpoint. The newest ``keep`` (``runconfig.keep_checkpoint_max``)
are kept. A run restores the newest one on start (``runconfig.autoload_last_checkpoint``) or
``runconfig.checkpoint_path`` (a file, or a directory whose newest checkpoint is taken).
Loading uses ``torch.load(weights_only=True)``: tensors, numbers and strings only.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from csrun_common.atomic import atomic_open

__all__ = ["FORMAT", "checkpoint_path", "list_checkpoints", "latest", "save", "load", "CheckpointError"]

FORMAT = "csrun.pytorch_checkpoint/1"
_NAME = re.compile(r"^model-ckpt-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or is not csrun's (names the file)."""


def checkpoint_path(model_dir: str | os.PathLike, step: int) -> Path:
    """``<model_dir>/model-ckpt-<step>.pt``."""
    return Path(model_dir) / f"model-ckpt-{int(step)}.pt"


def list_checkpoints(model_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(global_step, path)`` of every checkpoint in ``model_dir``, oldest step first."""
    d = Path(model_dir)
    if not d.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return sorted(out)


def latest(where: str | os.PathLike) -> Path | None:
    """The newest checkpoint of directory ``where``, ``where`` itself when it is a file, else None."""
    p = Path(where)
    if p.is_file():
        return p
    found = list_checkpoints(p)
    return found[-1][1] if found else None


def save(model_dir: str | os.PathLike, step: int, model: Any, optimizer: Any = None, keep: int = 5) -> Path:
    """Write the checkpoint of global step ``step`` atomically and keep the newest ``keep``.

    Args:
        model: a ``torch.nn.Module``; optimizer: a ``torch.optim.Optimizer`` or None.
        keep: checkpoints kept (>= 1); older ones are deleted.

    Returns: the checkpoint's path. Raises ``OSError`` when the directory cannot be written.
    """
    import torch

    d = Path(model_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(d, step)
    state = {"format": FORMAT, "global_step": int(step), "time": time.time(), "model": model.state_dict(),
             "optimizer": optimizer.state_dict() if optimizer is not None else None}
    with atomic_open(final, "wb") as f:  # a half-written file never becomes the newest; mode 0o666 & ~umask
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    for _step, old in list_checkpoints(d)[:-max(1, int(keep))]:
        try:
            old.unlink()
        except OSError:
            pass
    return final


def load(path: str | os.PathLike, model: Any, optimizer: Any = None, map_location: Any = "cpu") -> int:
    """Restore ``model`` (and ``optimizer`` when given and saved) from ``path``; returns its
    global step.

    Raises:
        CheckpointError: unreadable, not a csrun PyTorch checkpoint, or a state dict that does
            not fit the model (the message names the file and torch's reason).
    """
    import torch

    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any reason to fail names the file
        raise CheckpointError(f"checkpoint {path}: cannot be read: {type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: not a csrun PyTorch checkpoint (format {FORMAT})")
    try:
        model.load_state_dict(state["model"])
        if optimizer is not None and state.get("optimizer") is not None:
            optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint {path}: does not fit the model: {e}") from None
    return int(state["global_step"])
