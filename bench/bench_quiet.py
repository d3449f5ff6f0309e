"""Benchmark: log lines of the main job that are not csrun's — TensorFlow's C++ start-up and
server lines — with csrun_wse's default (``TF_CPP_MIN_LOG_LEVEL=1`` exported to every task:
no INFO, warnings and errors kept; the runtime's quiet import of TensorFlow drops the two
start-up lines no log level hides,
csrun_runtime/tensorflow/quiet.py) against ``--verbose`` (``TF_CPP_MIN_LOG_LEVEL=0``, every
line: what the tasks printed before, since the digits run.py imports TensorFlow before the
runtime could set a level).

The main job: ``csrun_wse --total-nodes 4 --single-task-nodes 1 --tasks-per-node 2`` (7
tasks) ``python-ws examples/digits/run.py --mode train --max_steps 100``, both sides in
alternated pairs. A line counts as csrun's own when it starts with ``INFO:csrun:``,
``WARNING:csrun:``, ``ERROR:csrun:``, ``Launching:`` or ``srun:``; every other line of the
job's stdout and stderr is counted, and the C++ log lines among them are split by level
(``I``/``W``/``E`` prefixes, absl's "All log messages before absl::InitializeLog()" notice).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import clusters
import common  # bench/ is on sys.path: these modules run as scripts from it

RUN_PY = str(common.REPO / "examples" / "digits" / "run.py")
LAYOUT = ["--total-nodes", "4", "--single-task-nodes", "1", "--tasks-per-node", "2"]
OWN = re.compile(r"^(INFO:csrun:|WARNING:csrun:|ERROR:csrun:|Launching: |srun: )")


def classify(text: str) -> dict:
    """Counts of the non-csrun lines: ``total``, ``cpp_info``, ``cpp_warning_error``,
    ``absl_preinit`` (the absl notice), ``other`` (continuations such as config dumps), and
    the most frequent ones."""
    lines = [ln for ln in text.splitlines() if not OWN.match(ln)]
    c = Counter()
    for ln in lines:
        if ln.startswith("WARNING: All log messages before absl::InitializeLog()"):
            c["absl_preinit"] += 1
        elif re.match(r"^I\d{4} ", ln):
            c["cpp_info"] += 1
        elif re.match(r"^[WEF]\d{4} ", ln):
            c["cpp_warning_error"] += 1
        else:
            c["other"] += 1
    top = Counter(re.sub(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ", r"\1 ", ln)[:100] for ln in lines).most_common(6)
    return {"total": len(lines), **{k: c.get(k, 0) for k in ("cpp_info", "cpp_warning_error", "absl_preinit",
                                                               "other")}, "top": top}


def one(env: dict, root: Path, params: Path, verbose: bool, index: int) -> dict:
    """Run the main job once (``--verbose`` or not) and :func:`classify` its output."""
    model_dir = root / f"md-{'verbose' if verbose else 'quiet'}-{index}"
    argv = [common.console_script("csrun_wse"), *LAYOUT, *(["--verbose"] if verbose else []), "python-ws", RUN_PY,
            "--params", str(params), "--model_dir", str(model_dir), "--mode", "train", "--max_steps", "100"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=str(root))
    if proc.returncode != 0:
        raise RuntimeError(f"main job failed ({proc.returncode}): {proc.stderr[-500:]}")
    return classify(proc.stdout + proc.stderr)


def run(quick: bool = False) -> dict:
    """``pairs`` alternated pairs (quick 1, full 2) of the main job quiet and verbose."""
    env = {k: v for k, v in clusters.slurm_env().items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "CSRUN_VERBOSE")}
    root = Path(tempfile.mkdtemp(prefix="csrun-bench-quiet."))
    path = common.digits_params(root, env=env)
    pairs = 1 if quick else 2
    quiet, verbose = [], []
    for i in range(pairs):
        for loud in ((False, True) if i % 2 == 0 else (True, False)):
            clusters.wait_queue_empty(env, max_wait=30.0)
            (verbose if loud else quiet).append(one(env, root, path, loud, i))
    return {"benchmark": "quiet tasks: non-csrun log lines of the 7-task main job, default vs --verbose",
            "unit": "lines", "layout": LAYOUT, "tasks": 7, "pairs": pairs,
            "quiet_lines": common.spread([r["total"] for r in quiet], digits=1),
            "verbose_lines": common.spread([r["total"] for r in verbose], digits=1),
            "quiet": quiet, "verbose": verbose}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
