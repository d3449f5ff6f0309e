"""The autoscale setting of a csrun_wse job (``--autoscale``), shared by the launcher and the
task runtime. Pure Python.

With ``--autoscale`` every input-worker task of the allocation is a *slot*: Slurm places all
of them (the het layout: nodes × tasks per node), and the chief decides how
many of them stream at a time (:mod:`csrun_runtime.autoscale`). The setting reaches every task
as one variable, ``CSRUN_AUTOSCALE=<initial>:<min>:<max>:<policy>:<window seconds>``
(docs/CONTRACT.md): colons, because srun's ``--export`` separates its variables with commas.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .env import AUTOSCALE
from .layout import flag

__all__ = ["AutoscaleSpec", "ENV", "POLICIES", "parse_env", "plan_autoscale"]

#: The task environment variable that carries the setting (declared in csrun_common.env).
ENV = AUTOSCALE
#: ``rate``: grow to the tf.data service AutoScaler's estimate at once
#: (``ceil(consumer rate / mean worker throughput)``); ``step``: ±1 worker per window (Cachew).
POLICIES = ("rate", "step")


@dataclass(frozen=True)
class AutoscaleSpec:
    """How many input workers stream, and how the chief changes that.

    Attributes:
        initial: workers streaming at the start (slots ``0 .. initial-1``).
        min_workers: never fewer streaming workers (>= 1).
        max_workers: never more (<= the allocation's input-worker tasks).
        policy: one of :data:`POLICIES`.
        window_s: seconds of training measured between two decisions.
    """

    initial: int
    min_workers: int
    max_workers: int
    policy: str = "rate"
    window_s: float = 10.0

    def to_env(self) -> str:
        """The value of :data:`ENV`, e.g. ``"1:1:6:rate:10"``."""
        return f"{self.initial}:{self.min_workers}:{self.max_workers}:{self.policy}:{self.window_s:g}"


def plan_autoscale(slots: int, initial: int | None, min_workers: int | None, max_workers: int | None,
                   policy: str = "rate", window_s: float = 10.0) -> AutoscaleSpec:
    """Resolve ``--autoscale``'s bounds against the allocation's ``slots`` (its input-worker
    tasks). Defaults: ``min_workers`` 1, ``max_workers`` every slot, ``initial`` the
    ``min_workers``.

    Raises:
        ValueError: naming the flag and its value: no slot at all, ``--max-workers`` above
            the slots, ``--min-workers`` above ``--max-workers``, ``--initial-workers`` outside
            ``[min, max]``, an unknown ``--autoscale-policy``, a ``--autoscale-window`` under 1 s.
    """
    if slots < 1:
        raise ValueError(f"--autoscale: the layout has no input-worker task (raise {flag('nodes')} or "
                         f"{flag('tasks_per_node')})")
    hi = slots if max_workers is None else max_workers
    lo = 1 if min_workers is None else min_workers
    if hi < 1:
        raise ValueError(f"--max-workers {hi}: must be a positive integer")
    if hi > slots:
        raise ValueError(f"--max-workers {hi}: the layout has only {slots} input-worker task(s); raise "
                         f"{flag('nodes')} or {flag('tasks_per_node')}")
    if lo < 1:
        raise ValueError(f"--min-workers {lo}: must be a positive integer")
    if lo > hi:
        raise ValueError(f"--min-workers {lo}: more than --max-workers {hi}")
    start = lo if initial is None else initial
    if not lo <= start <= hi:
        raise ValueError(f"--initial-workers {start}: must lie in [--min-workers {lo}, --max-workers {hi}]")
    if policy not in POLICIES:
        raise ValueError(f"--autoscale-policy {policy!r}: must be one of {', '.join(POLICIES)}")
    if not window_s >= 1:
        raise ValueError(f"--autoscale-window {window_s:g}: must be at least 1 second")
    return AutoscaleSpec(start, lo, hi, policy, float(window_s))


def parse_env(env: Mapping[str, str], num_input_workers: int) -> AutoscaleSpec | None:
    """The spec of :data:`ENV` in ``env`` for a job of ``num_input_workers`` input-worker tasks;
    ``None`` when unset or empty.

    Raises:
        ValueError: naming :data:`ENV` and its value when it does not parse or its bounds do
            not fit ``num_input_workers`` (:func:`plan_autoscale`'s rules).
    """
    raw = (env.get(ENV) or "").strip()
    if not raw:
        return None
    parts = raw.split(":")
    try:
        if len(parts) != 5:
            raise ValueError("5 fields expected")
        initial, lo, hi = (int(p) for p in parts[:3])
        return plan_autoscale(num_input_workers, initial, lo, hi, parts[3], float(parts[4]))
    except ValueError as exc:
        raise ValueError(f"{ENV}={raw!r}: {exc} (initial:min:max:policy:window, docs/CONTRACT.md)") from None
