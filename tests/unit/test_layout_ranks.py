"""Several trainer ranks in the launcher (docs/MULTI-RANK.md): the plan's shapes, the tasks'
environment, the srun and sbatch text, and the original layouts kept byte for byte."""
from __future__ import annotations

import hashlib
import itertools

from csrun_common.errors import CsrunError
from csrun_common.layout import LayoutSpec
from launcher.builders import WseRequest, expand_python_word
from launcher.layout import plan
from launcher.requeue import RequeueSpec

from .golden import assert_golden

PY = "/opt/venv/bin/python"


def original_layouts() -> list[LayoutSpec]:
    """360 layouts of the original flags (no ranks): N 1..6, every S < N up to 2, T 1..3,
    C given or not, with and without the chief's input CPUs, block and cyclic."""
    out = []
    for n, t, c, own, cyc in itertools.product(range(1, 7), (1, 2, 3), (None, 1), (0, 1), (False, True)):
        for s in range(min(n, 3)):
            out.append(LayoutSpec(n, t, c, s, own, cyc))
    return out


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _original_line(spec: LayoutSpec) -> str:
    name = " ".join(spec.to_flags()) + (" (sbatch with --requeue)" if spec.nodes % 2 else "")
    try:
        lay = plan(spec, "gpu:1", node_cpus=4)
    except CsrunError as exc:
        return f"{name}: {exc}"
    cmd, mode = expand_python_word(("python-ws", "run.py", "--mode", "train"), PY)
    req = WseRequest(layout=lay, command=tuple(cmd), python=PY, execution_mode=mode, exclude_node="node1",
                     requeue=RequeueSpec.parse("USR1@60", 2) if spec.nodes % 2 else None)
    return f"{name}: srun {_digest(req.srun_line())} sbatch {_digest(req.materialize_sbatch())}"


def test_the_360_original_layouts_are_byte_identical():
    specs = original_layouts()
    assert len(specs) == 360
    assert_golden("wse_original_layouts.sha256", "".join(_original_line(s) + "\n" for s in specs))
