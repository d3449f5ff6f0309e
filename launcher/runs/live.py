"""What the chief's log says while a run trains: the global step, the live rate and input wait,
the input workers lost, replaced, given up and paused by ``--autoscale``, and a verdict from the
live figures (``csrun status``). Read from the tail of the chief's task log of the current
attempt (:mod:`launcher.attempts`); pure but for that read."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

#: The share of loop time waiting for input above which a run is input-bound: the runtime's
#: ``csrun_runtime.artifacts.INPUT_BOTTLENECK_THRESHOLD`` (the launcher may not import the
#: runtime; ``tests/unit/launcher/runs/test_live.py`` checks that they agree).
INPUT_BOUND = 0.10
#: Bytes of the chief's log read from its end (its last rate line and step).
TAIL_BYTES = 512 * 1024

_STEP = re.compile(r"global_step = (\d+), loss")
_RATE = re.compile(r"rate over global steps \d+\.\.(\d+) \([\d.]+ s, \d+ call\(s\)\): ([\d.]+) samples/s, "
                   r"input wait ([\d.]+) %")
_LOST = re.compile(r"input worker (\d+) on \S+ \(pid \S+\) lost")
_REPLACED = re.compile(r"input worker (\d+) (?:replaced on|streams again)")
_GIVEN_UP = re.compile(r"input worker (\d+) .*given up")
_AUTOSCALE = re.compile(r"autoscale: (add|remove) input worker (\d+)")


@dataclass
class Live:
    """The live figures (``None``: not logged yet). ``input_wait``: a share (0..1) of the last
    rate window; ``workers``: worker indices by ``lost``, ``replaced``, ``given_up``,
    ``paused``."""

    step: int | None = None
    samples_per_sec: float | None = None
    input_wait: float | None = None
    workers: dict[str, list[int]] = field(default_factory=lambda: {"lost": [], "replaced": [], "given_up": [],
                                                                    "paused": []})

    @property
    def verdict(self) -> str | None:
        """``input-bound`` / ``compute-bound`` from the last window's input wait (``None`` before one)."""
        if self.input_wait is None:
            return None
        return "input-bound" if self.input_wait > INPUT_BOUND else "compute-bound"


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def parse(text: str) -> Live:
    """The live figures of a chief's log text (the lines of ``csrun_runtime.loop``,
    ``csrun_runtime.elastic`` and ``csrun_runtime.autoscale``)."""
    live = Live()
    paused: set[int] = set()
    for line in text.splitlines():
        if m := _STEP.search(line):
            live.step = int(m.group(1))
        elif m := _RATE.search(line):
            live.step = max(live.step or 0, int(m.group(1)))
            live.samples_per_sec, live.input_wait = float(m.group(2)), float(m.group(3)) / 100.0
        elif m := _AUTOSCALE.search(line):
            (paused.add if m.group(1) == "remove" else paused.discard)(int(m.group(2)))
        else:
            for key, rx in (("lost", _LOST), ("replaced", _REPLACED), ("given_up", _GIVEN_UP)):
                if (m := rx.search(line)) and int(m.group(1)) not in live.workers[key]:
                    live.workers[key].append(int(m.group(1)))
    live.workers["paused"] = sorted(paused)
    return live


def read(chief_log: Path) -> Live:
    """:func:`parse` of the last :data:`TAIL_BYTES` of ``chief_log`` (empty figures when absent)."""
    return parse(_tail(chief_log))
