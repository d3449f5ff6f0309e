"""``optimizer.learning_rate`` in the Model Zoo's forms (docs/PYTORCH.md "Learning rate"), for the
optimizer csrun builds from ``params["optimizer"]``:

- a number (or a numeric string: YAML reads ``1e-5`` as one): constant;
- one schedule (a mapping with ``scheduler``) or a list of them, run one after the other, each
  non-final one for its ``steps`` (or ``decay_steps``), as the Model Zoo R1.6 PyTorch base model
  chains them (``SequentialLR`` at the pieces' start steps). Each piece counts its steps from its
  own start, unless ``optimizer.disable_lr_steps_reset: true`` (then from the global step 0).

Pieces (``scheduler``, any case; keys as in the Model Zoo's YAMLs):

==================  =============================================================================
Constant            ``learning_rate``; optional ``steps``
Linear              ``initial_learning_rate``, ``end_learning_rate``, ``steps``: straight line, then
                    ``end_learning_rate``
Polynomial          as Linear with ``power`` (default 1) and ``cycle`` (restart the decay every
                    ``steps``, each time ``steps`` longer, as TensorFlow's polynomial decay)
Exponential         ``initial_learning_rate``, ``decay_steps``, ``decay_rate``, ``staircase``:
                    ``initial * decay_rate ** (t / decay_steps)`` (``t // decay_steps`` staircase)
CosineDecay         ``initial_learning_rate``, ``end_learning_rate``, ``decay_steps``: half a cosine
                    from initial to end, then end
PiecewiseConstant   ``values`` (n + 1), ``boundaries`` (n increasing steps): ``values[i]`` from
                    ``boundaries[i - 1]`` until ``boundaries[i]``
==================  =============================================================================

``steps`` and ``decay_steps`` stand for each other where only one is given (the Model Zoo's
rule). The rate of the optimizer step that makes global step ``s + 1`` is :meth:`Schedule.rate`
of ``s``; :func:`attach` drives it with a ``torch.optim.lr_scheduler.LambdaLR`` from the global
step a run starts at (a resumed run goes on where the checkpoint was). Pure Python but
:func:`attach`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Schedule", "Piece", "SCHEDULERS", "ScheduleError", "parse_learning_rate", "attach"]


class ScheduleError(ValueError):
    """``optimizer.learning_rate`` cannot be read; ``str()`` names the key and the value
    (:func:`csrun_runtime.pytorch.contract.build_optimizer` reports it as its ``ContractError``)."""

#: The ``scheduler`` values understood (lower case).
SCHEDULERS = ("constant", "linear", "polynomial", "exponential", "cosinedecay", "piecewiseconstant")


@dataclass(frozen=True)
class Piece:
    """One schedule: ``rate(t)`` at its own step ``t >= 0``; ``steps``: how long it runs in a
    list (None: to the end)."""

    kind: str
    rate: Callable[[int], float]
    steps: int | None


@dataclass(frozen=True)
class Schedule:
    """Pieces run one after the other from global step 0; ``global_steps``: every piece sees
    the global step instead of its own (``optimizer.disable_lr_steps_reset``)."""

    pieces: tuple[Piece, ...]
    global_steps: bool = False

    def starts(self) -> list[int]:
        """The global step each piece starts at."""
        out, at = [], 0
        for p in self.pieces:
            out.append(at)
            at += p.steps or 0
        return out

    def rate(self, step: int) -> float:
        """The learning rate of the update made at global step ``step`` (>= 0)."""
        starts = self.starts()
        k = max(j for j, s in enumerate(starts) if s <= step or j == 0)
        return float(self.pieces[k].rate(step if self.global_steps else step - starts[k]))


def _num(d: Mapping[str, Any], key: str, where: str, *, positive: bool = False) -> float:
    if key not in d:
        raise ScheduleError(f"{where}.{key} is missing (a {d.get('scheduler')} schedule needs it)")
    v = d[key]
    try:
        if isinstance(v, bool):
            raise ValueError
        x = float(v)
    except (TypeError, ValueError):
        raise ScheduleError(f"{where}.{key} must be a number, got {v!r}") from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise ScheduleError(f"{where}.{key} must be a number {'> 0' if positive else '>= 0'}, got {v!r}")
    return x


def _steps(d: Mapping[str, Any], where: str, *, required: bool) -> int | None:
    key = "steps" if "steps" in d else "decay_steps" if "decay_steps" in d else None
    if key is None:
        if required:
            raise ScheduleError(f"{where}.steps is missing (every schedule but the last needs steps or decay_steps)")
        return None
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ScheduleError(f"{where}.{key} must be an integer >= 1, got {v!r}")
    return v


def _poly(init: float, end: float, n: int, power: float, cycle: bool) -> Callable[[int], float]:
    def rate(t: int) -> float:
        length = n * max(1, math.ceil(t / n)) if cycle else n
        frac = min(t, length) / length
        return (init - end) * (1.0 - frac) ** power + end
    return rate


def _piece(d: Any, where: str, last: bool) -> Piece:
    if not isinstance(d, Mapping) or "scheduler" not in d:
        raise ScheduleError(f"{where} must be a mapping with a 'scheduler' key, got {d!r}")
    kind = str(d["scheduler"]).lower()
    steps = _steps(d, where, required=not last)
    if kind == "constant":
        lr = _num(d, "learning_rate", where)
        return Piece(kind, lambda t: lr, steps)
    if kind in ("linear", "polynomial"):
        init, end = _num(d, "initial_learning_rate", where), _num(d, "end_learning_rate", where)
        n = steps or _steps(d, where, required=True)
        power = 1.0 if kind == "linear" else _num({**d, "power": d.get("power", 1.0)}, "power", where, positive=True)
        return Piece(kind, _poly(init, end, int(n or 1), power, bool(d.get("cycle", False))), steps)
    if kind == "exponential":
        init, rate_ = _num(d, "initial_learning_rate", where), _num(d, "decay_rate", where, positive=True)
        period = _steps({"decay_steps": d["decay_steps"]} if "decay_steps" in d else d, where, required=True)
        stair = bool(d.get("staircase", False))
        p = int(period or 1)
        return Piece(kind, lambda t: init * rate_ ** ((t // p) if stair else (t / p)), steps)
    if kind == "cosinedecay":
        init, end = _num(d, "initial_learning_rate", where), _num(d, "end_learning_rate", where)
        n = int(_steps({"decay_steps": d["decay_steps"]} if "decay_steps" in d else d, where, required=True) or 1)
        return Piece(kind, lambda t: end + (init - end) * 0.5 * (1.0 + math.cos(math.pi * min(t, n) / n)), steps)
    if kind == "piecewiseconstant":
        values, bounds = d.get("values"), d.get("boundaries")
        if (not isinstance(values, list) or not isinstance(bounds, list) or len(values) != len(bounds) + 1
                or any(isinstance(b, bool) or not isinstance(b, int) for b in bounds) or bounds != sorted(bounds)):
            raise ScheduleError(f"{where}: values must be a list one longer than boundaries (increasing integer "
                                f"steps), got values {values!r}, boundaries {bounds!r}")
        vals = [_num({"v": v}, "v", f"{where}.values") for v in values]
        return Piece(kind, lambda t: vals[sum(1 for b in bounds if t >= b)], steps)
    raise ScheduleError(f"{where}.scheduler {d['scheduler']!r} is not supported (one of Constant, Linear, "
                        f"Polynomial, Exponential, CosineDecay, PiecewiseConstant; or define "
                        f"configure_optimizer(params) on the module)")


def parse_learning_rate(spec: Mapping[str, Any]) -> float | Schedule:
    """``optimizer.learning_rate`` of the ``optimizer`` section ``spec`` (default 0.01): a
    number > 0, or a :class:`Schedule` for the schedule forms (see the module docstring).

    Raises:
        ScheduleError: naming ``optimizer.learning_rate[i].<key>`` and the value: a missing or
            bad key, an unknown ``scheduler``, a non-final piece without ``steps``.
    """
    lr = spec.get("learning_rate", 0.01)
    if isinstance(lr, (int, float, str)) and not isinstance(lr, bool):
        try:
            x = float(lr)
        except ValueError:
            x = float("nan")
        if not math.isfinite(x) or x <= 0:
            raise ScheduleError(f"optimizer.learning_rate must be a number > 0 or a schedule (a list of "
                                f"{{scheduler: ...}} mappings), got {lr!r}")
        return x
    items = [lr] if isinstance(lr, Mapping) else lr
    if not isinstance(items, list) or not items:
        raise ScheduleError(f"optimizer.learning_rate must be a number > 0 or a schedule (a list of "
                            f"{{scheduler: ...}} mappings), got {lr!r}")
    where = "optimizer.learning_rate" if isinstance(lr, Mapping) else "optimizer.learning_rate[{}]"
    pieces = tuple(_piece(d, where.format(i), i == len(items) - 1) for i, d in enumerate(items))
    return Schedule(pieces, bool(spec.get("disable_lr_steps_reset", False)))


def attach(optimizer: Any, schedule: Schedule, start: int) -> Any:
    """A ``torch.optim.lr_scheduler.LambdaLR`` that sets every parameter group's ``lr`` to
    ``schedule.rate(start)`` now and to ``rate(start + k)`` after its ``k``-th ``step()`` (call
    it after each optimizer step). ``start``: the global step the run starts at (restored)."""
    import torch

    for g in optimizer.param_groups:
        g["initial_lr"] = 1.0  # the lambda gives the rate itself, not a factor of a base rate
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: schedule.rate(start + k))
