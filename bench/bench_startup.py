"""Benchmark 2: CLI start-up wall time against a bare interpreter on the same machine.

Commands, run in rotating round-robin order (each round runs every command once, the
first one changing from round to round), after one unrecorded warm-up round:

* ``python -c pass`` — the floor: the same interpreter doing nothing;
* ``csrun_wse --dry-run`` of a three-component het layout (it queries ``sinfo`` once, as a
  real launch does, and prints the srun line; submits nothing);
* ``cs_input_analyzer --help``;
* ``csrun_cpu --help``;
* ``sinfo`` — the one Slurm query ``csrun_wse`` makes (its share of the dry-run's time);
* full mode only: ``python -c "import tensorflow"`` — what the CLIs avoid importing.

Figures: per command the median wall time (seconds) with its IQR; ``ratios``: median
command time / median ``python -c pass`` time; ``paired``: the per-round comparison with
``python -c pass`` (:func:`common.compare`: median of per-round ratios and differences).
"""
from __future__ import annotations

import json
import sys

import clusters
import common  # bench/ is on sys.path: these modules run as scripts from it

from analyzer.user_command import console_script

LAYOUT = ["--total-nodes", "3", "--single-task-nodes", "1", "--tasks-per-node", "2", "--cpus-per-task", "1"]


def commands(quick: bool) -> dict[str, list[str]]:
    """Name -> argv of every timed command (see the module docstring)."""
    py = sys.executable
    cmds = {
        "python -c pass": [py, "-c", "pass"],
        "csrun_wse --dry-run": [console_script("csrun_wse"), "--dry-run", *LAYOUT, "python-ws", "run.py",
                                "--mode", "train"],
        "cs_input_analyzer --help": [console_script("cs_input_analyzer"), "--help"],
        "csrun_cpu --help": [console_script("csrun_cpu"), "--help"],
        "sinfo": ["sinfo", "--noheader", "--Node", "--format=%N|%c|%G|%t|%P"],
    }
    if not quick:
        cmds["python -c 'import tensorflow'"] = [py, "-c", "import tensorflow"]
    return cmds


def run(quick: bool = False) -> dict:
    """Time each command (seconds, wall clock) ``rounds`` times (quick: 3, full: 15; TF
    import: at most 5) and compare with ``python -c pass``. Returns the figures (see the
    module docstring)."""
    rounds = 3 if quick else 15
    env = clusters.slurm_env()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cmds = commands(quick)
    heavy = {k for k in cmds if "tensorflow" in k}
    fns = {name: (lambda argv=argv: common.time_command(argv, env=env, timeout=120))
           for name, argv in cmds.items() if name not in heavy}
    times = common.round_robin(fns, rounds=rounds, warmup=1)
    for name in heavy:  # a few only: ~4 s each
        times[name] = [common.time_command(cmds[name], env=env, timeout=300) for _ in range(min(rounds, 5))]
    base = times["python -c pass"]
    out = {
        "benchmark": "CLI start-up wall time vs python -c pass",
        "unit": "seconds",
        "rounds": rounds,
        "argv": {k: v for k, v in cmds.items()},
        "commands": {k: common.spread(v) for k, v in times.items()},
        "ratios": {k: round(common.ratio_of_medians(v, base), 3) for k, v in times.items() if k != "python -c pass"},
        "paired": {k: common.compare(v, base[:len(v)]) for k, v in times.items() if k != "python -c pass"},
    }
    python_s = out["commands"]["python -c pass"]["median"]
    out["overhead_over_python_s"] = {k: round(out["commands"][k]["median"] - python_s, 4)
                                     for k in times if k != "python -c pass"}
    return out


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
