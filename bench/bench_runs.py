"""Benchmark: ``csrun status`` of a running job and ``csrun list`` over 1,000 recorded runs
(issue 42; docs/RUNS.md "Polling"), wall time of the whole command (a new process each time,
start-up included) on the test cluster, with the Slurm calls each made counted by wrappers on
PATH (tests/fixtures/slurm_call_counter.py: each counts, then execs the real client).

* ``status``: a recorded sbatch run of 4 tasks on 2 nodes (tests/fixtures/runs/tick.py, running
  for the whole benchmark), ``csrun status RUN`` ``rounds`` times; beside it, in the same rounds,
  the floor: the one ``squeue`` it makes, run bare, and ``python -c pass``.
* ``list``: an index of 1,000 finished runs (records as csrun_wse writes them, each with its
  ~3 KB sbatch script and its recorded end), ``csrun list`` ``rounds`` times; then the same
  index with the running run added (its one squeue).

Targets (issue 42): status p95 <= 1 s; list over 1,000 records <= 1 s with 0 Slurm calls for
finished runs.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import clusters  # bench/ is on sys.path: these modules run as scripts from it
import common

from launcher.runs.record import RunRecord, RunStore, state_dir
from tests.fixtures.slurm_call_counter import SlurmCallCounter

TICK = common.REPO / "tests" / "fixtures" / "runs" / "tick.py"
RECORDS = 1000


def _csrun() -> str:
    return str(Path(sys.executable).parent / "csrun")


def _start_run(env: dict, cwd: Path) -> tuple[str, str]:
    """A recorded sbatch run that ticks for ~10 minutes; returns (run id, job id)."""
    proc = subprocess.run([str(Path(sys.executable).parent / "csrun_wse"), "--use-sbatch", "--total-nodes", "2",
                           "--tasks-per-node", "2", "--cpus-per-task", "1", sys.executable, str(TICK),
                           "--ticks", "1200", "--model_dir", str(cwd / "md")], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"csrun_wse: {proc.stderr.strip()[-300:]}")
    return re.search(r"run (\S+) \(csrun status", proc.stderr).group(1), proc.stdout.strip()


def _wait_running(env: dict, run_id: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run([_csrun(), "status", run_id, "--json"], env=env, capture_output=True, text=True)
        if out.returncode == 0 and json.loads(out.stdout)["state"] == "RUNNING":
            return
        time.sleep(1.0)
    raise RuntimeError(f"run {run_id} not RUNNING in {timeout:.0f} s")


def _fill_index(root: Path, template: RunRecord, n: int) -> RunStore:
    """An index of ``n`` finished runs shaped like ``template`` (ids and jobs of their own)."""
    store = RunStore(root)
    now = time.time()
    for i in range(n):
        rec = RunRecord(**{**template.__dict__, "run_id": f"wse-0101-{i:04d}", "jobs": [str(100000 + i)],
                           "submitted_at": now - 3600 - i, "model_dir": None, "launcher": None,
                           "end": {"state": "SUCCEEDED", "reason": "exit 0", "time": now - i, "status": 0}})
        store.save(rec)
    return store


def _timed(argv: list[str], env: dict, counter: SlurmCallCounter, rounds: int) -> tuple[list[float], list[int]]:
    times, calls = [], []
    for _ in range(rounds):
        counter.reset()
        times.append(common.time_command(argv, env=env, timeout=60))
        calls.append(len(counter.calls()))
    return times, calls


def _p95(xs: list[float]) -> float:
    return round(common.quantile(xs, 0.95), 4)


def run(quick: bool = False) -> dict:
    """The figures (seconds; Slurm calls per command) described in the module docstring."""
    rounds = 5 if quick else 30
    with tempfile.TemporaryDirectory(prefix="bench_runs-") as tmp:
        work = Path(tmp)
        base = {**clusters.slurm_env(), "XDG_STATE_HOME": str(work / "state")}
        counter = SlurmCallCounter(work / "counter", base)
        env = counter.env(base)
        run_id, job = _start_run(env, work)
        try:
            _wait_running(env, run_id)
            fns = {"csrun status": [_csrun(), "status", run_id],
                   "squeue (the one status makes)": ["squeue", "--noheader", "--states=all", f"--jobs={job}",
                                                     "--format=%i|%T|%r|%N"],
                   "python -c pass": [sys.executable, "-c", "pass"]}
            status_calls: list[int] = []

            def status_once() -> float:
                counter.reset()
                t = common.time_command(fns["csrun status"], env=env, timeout=60)
                status_calls.append(len(counter.calls()))
                return t

            times = common.round_robin({"csrun status": status_once,
                                        **{k: (lambda a=a: common.time_command(a, env=env, timeout=60))
                                           for k, a in fns.items() if k != "csrun status"}}, rounds=rounds, warmup=1)
            running = state_dir("", base).joinpath("runs", f"{run_id}.json")
            template = RunRecord.from_json(json.loads(running.read_text()))
            list_env = {**env, "XDG_STATE_HOME": str(work / "index")}
            _fill_index(work / "index" / "csrun", template, RECORDS)
            list_times, list_calls = _timed([_csrun(), "list"], list_env, counter, rounds)
            (work / "index" / "csrun" / "runs" / running.name).write_text(running.read_text())
            mixed_times, mixed_calls = _timed([_csrun(), "list"], list_env, counter, max(3, rounds // 3))
        finally:
            subprocess.run(["scancel", job], env=env, capture_output=True)
    st, py = times["csrun status"], times["python -c pass"]
    return {
        "benchmark": "csrun status of a running job; csrun list over 1,000 records",
        "unit": "seconds (wall, a new process each time); calls: Slurm commands per csrun command",
        "rounds": rounds,
        "status_running_median_s": common.spread(st)["median"],
        "status_running_p95_s": _p95(st),
        "status_slurm_calls_max": max(status_calls),
        "list_1000_finished_median_s": common.spread(list_times)["median"],
        "list_1000_finished_p95_s": _p95(list_times),
        "list_1000_finished_slurm_calls_max": max(list_calls),
        "list_1000_plus_running_median_s": common.spread(mixed_times)["median"],
        "list_1000_plus_running_slurm_calls_max": max(mixed_calls),
        "slurm_calls": {"csrun status": status_calls, "list 1000 finished": list_calls,
                        "list 1000 finished + 1 running": mixed_calls},
        "commands": {k: common.spread(v) for k, v in times.items()},
        "list": {"1000 finished": common.spread(list_times), "1000 finished + 1 running": common.spread(mixed_times)},
        "ratios": {"status / python -c pass": round(common.ratio_of_medians(st, py), 3),
                   "status / its squeue": round(common.ratio_of_medians(st, times["squeue (the one status makes)"]), 3),
                   "list 1000 / python -c pass": round(common.ratio_of_medians(list_times, py), 3)},
        "targets": {"status_p95_s": 1.0, "list_1000_s": 1.0, "list_slurm_calls_finished": 0},
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
