"""Benchmark: interrupting a running ``csrun_wse`` — how fast the Slurm queue empties and the
exit status the shell sees.

``csrun_wse --total-nodes 2 sleep 300`` (two het components, 4 tasks) runs; once its job is
RUNNING the benchmark interrupts it and polls ``squeue`` every 50 ms until the job is gone.
Two ways, alternated, ``repeats`` times each:

* ``sigint_to_csrun`` — SIGINT to csrun_wse alone (``kill -INT``; csrun_wse sends srun the
  two SIGINTs within a second that cancel a step, srun(1) "SIGNALS AND ESCAPE SEQUENCES");
* ``ctrl_c_to_group`` — SIGINT to the whole process group, as a terminal's Ctrl-C does (srun
  gets it from the terminal too);

and ``sigterm_to_csrun`` once per round. Figures: seconds from the signal to an empty queue
(median, IQR, max) and the exit statuses seen (130 for SIGINT, 143 for SIGTERM expected).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import clusters
import common  # bench/ is on sys.path: these modules run as scripts from it

from launcher import slurm

WAYS = {"sigint_to_csrun": (signal.SIGINT, False), "ctrl_c_to_group": (signal.SIGINT, True),
        "sigterm_to_csrun": (signal.SIGTERM, False)}


def _running(env: dict, before: set[str], timeout: float = 60.0) -> set[str]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        new = slurm.queued_job_ids(env, running_only=True) - before
        if new:
            return new
        time.sleep(0.1)
    raise RuntimeError("the job never started")


def one(way: str, env: dict) -> dict:
    """One interrupted launch: seconds to an empty queue, csrun_wse's exit status."""
    sig, group = WAYS[way]
    before = slurm.queued_job_ids(env)
    proc = subprocess.Popen([common.console_script("csrun_wse"), "--total-nodes", "2", "sleep", "300"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        jobs = _running(env, before)
        time.sleep(0.5)
        t0 = time.monotonic()
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        while True:
            if not slurm.queued_job_ids(env) & jobs:
                break
            if time.monotonic() - t0 > 60:
                raise RuntimeError(f"jobs {jobs} still queued 60 s after the signal")
            time.sleep(0.05)
        empty_s = time.monotonic() - t0
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            common.stop_process_group(proc)
    return {"empty_queue_s": round(empty_s, 3), "exit_status": status}


def run(quick: bool = False) -> dict:
    """``repeats`` rounds (quick 1, full 5) of the three ways; returns the figures."""
    env = clusters.slurm_env()
    repeats = 1 if quick else 5
    runs: dict[str, list[dict]] = {w: [] for w in WAYS}
    for r in range(repeats):
        order = list(WAYS) if r % 2 == 0 else list(reversed(WAYS))
        for way in order:
            clusters.wait_queue_empty(env, max_wait=30.0)
            runs[way].append(one(way, env))
    summary = {w: {"empty_queue_s": common.spread([x["empty_queue_s"] for x in recs], digits=3),
                   "max_empty_queue_s": max(x["empty_queue_s"] for x in recs),
                   "exit_statuses": sorted({x["exit_status"] for x in recs})} for w, recs in runs.items()}
    return {"benchmark": "interrupt: seconds from the signal to an empty Slurm queue; csrun_wse's exit status",
            "unit": "seconds", "command": "csrun_wse --total-nodes 2 sleep 300", "repeats": repeats,
            "summary": summary, "runs": runs}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
