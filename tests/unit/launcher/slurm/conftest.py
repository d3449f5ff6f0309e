"""The canned Slurm of launcher/slurm/'s unit tests: ``subprocess.run`` and the PATH lookup
replaced (as torchx's Slurm scheduler tests do), each command answered by its binary's name."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from launcher import slurm


@dataclass
class Canned:
    """A stand-in for ``subprocess.run``: answers each Slurm command (by its binary's name)
    with canned ``(returncode, stdout, stderr)`` and records every call."""

    answers: dict[str, list[tuple[int, str, str]]]
    calls: list[tuple[list[str], dict]] = field(default_factory=list)

    def __call__(self, argv, **kwargs):
        self.calls.append((list(argv), kwargs))
        name = Path(argv[0]).name
        queue = self.answers[name]
        rc, out, err = queue.pop(0) if len(queue) > 1 else queue[0]
        return subprocess.CompletedProcess(argv, rc, out, err)

    def argv(self, i: int = -1) -> list[str]:
        return self.calls[i][0]


@pytest.fixture()
def canned(monkeypatch):
    """Patch ``subprocess.run`` and the PATH lookup; returns a function that installs the
    answers and gives the :class:`Canned` recorder."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(slurm.command.shutil, "which", lambda name: f"/usr/bin/{name}")

    def install(**answers: list[tuple[int, str, str]]) -> Canned:
        c = Canned({k: list(v) for k, v in answers.items()})
        monkeypatch.setattr(slurm.command.subprocess, "run", c)
        return c

    return install


@pytest.fixture()
def no_cache(monkeypatch):
    monkeypatch.setattr(slurm.queries, "_ACCOUNTING", {})
