"""Benchmark 1: launch overhead of ``csrun_wse`` against bare ``srun``, same het layout.

Side A: ``csrun_wse <layout> true`` — the whole CLI: start-up, site config, one ``sinfo``
query, layout planning, srun argv, then the foreground ``srun`` of the trivial command
``true`` on every task, to completion.

Side B: bare ``srun`` with *exactly* the het components csrun_wse runs (the argv that
``csrun_wse --dry-run`` prints for the same layout, run directly), i.e. what an expert
would type by hand.

Both sides run in alternated pairs (A B, B A, ...; :func:`common.alternate_pairs`) after
one unrecorded warm-up pair (full mode); before each pair the harness waits (at most 30 s) for the
Slurm queue to be empty so that neither side waits behind another user's job, and records
how many jobs it saw. Figures: medians and IQRs of both sides' wall times (seconds),
the median of the per-pair ratios csrun_wse/srun, and the median per-pair difference
(seconds: csrun_wse's own cost).
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

import clusters
import common  # bench/ is on sys.path: these modules run as scripts from it

from analyzer.user_command import console_script

#: N=3 nodes, the chief alone on the GRES node, 2 nodes × 2 tasks × 1 CPU of input workers:
#: three het components, five tasks.
LAYOUT = ["--total-nodes", "3", "--single-task-nodes", "1", "--tasks-per-node", "2", "--cpus-per-task", "1"]
LAYOUT_TEXT = "3 het components: chief 1×1 (GRES) + 1 single-task node + 2 nodes × 2 tasks × 1 CPU"


def bare_srun_argv(env: dict) -> tuple[list[str], dict]:
    """The srun argv (and extra environment) ``csrun_wse --dry-run`` prints for
    :data:`LAYOUT` running ``true``."""
    out = subprocess.run([console_script("csrun_wse"), "--dry-run", *LAYOUT, "true"], capture_output=True,
                         text=True, env=env, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"csrun_wse --dry-run failed: {out.stderr.strip()[-300:]}")
    argv = shlex.split(out.stdout.strip().splitlines()[-1])
    extra = {}
    if argv and argv[0] == "env":
        argv = argv[1:]
        while argv and "=" in argv[0] and not argv[0].startswith("-"):
            k, v = argv.pop(0).split("=", 1)
            extra[k] = v
    if not argv or argv[0] != "srun":
        raise RuntimeError(f"unexpected dry-run line: {out.stdout.strip()[:200]}")
    return argv, extra


def run(quick: bool = False) -> dict:
    """Time ``pairs`` alternated pairs (quick: 2, full: 15 after a warm-up pair) of csrun_wse vs bare srun
    launching ``true`` on the same het layout. Returns the figures (seconds; ratios)."""
    pairs, warmup = (2, 0) if quick else (15, 1)
    env = clusters.slurm_env()
    srun_argv, extra = bare_srun_argv(env)
    srun_env = {**env, **extra}
    csrun_argv = [console_script("csrun_wse"), *LAYOUT, "true"]
    queue_seen: list[int] = []
    waited: list[float] = []

    def a() -> float:
        return common.time_command(csrun_argv, env=env, timeout=180)

    def b() -> float:
        return common.time_command(srun_argv, env=srun_env, timeout=180)

    # wait for an empty queue before each pair (both calls of a pair share the wait)
    calls = {"n": 0}

    def guarded(fn):
        def inner() -> float:
            if calls["n"] % 2 == 0:
                waited.append(round(clusters.wait_queue_empty(env, max_wait=30.0), 2))
                queue_seen.append(clusters.others_jobs(env))
            calls["n"] += 1
            return fn()
        return inner

    av, bv = common.alternate_pairs(guarded(a), guarded(b), pairs=pairs, warmup=warmup)
    return {
        "benchmark": "launch overhead: csrun_wse vs bare srun (same het layout, `true`)",
        "unit": "seconds",
        "layout": LAYOUT,
        "layout_text": LAYOUT_TEXT,
        "csrun_wse_argv": csrun_argv,
        "srun_argv": srun_argv,
        "pairs": pairs,
        "csrun_wse_s": common.spread(av),
        "srun_s": common.spread(bv),
        "compare": common.compare(av, bv),
        "warmup_pairs": warmup,
        "queue_jobs_before_pair": queue_seen[warmup:],
        "queue_wait_s": waited[warmup:],
        "note": "a pair whose queue count is > 0 may include waiting behind another user's job",
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
