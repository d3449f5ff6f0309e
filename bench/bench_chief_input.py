"""Benchmark: the chief's node feeding input (``csrun_wse --chief-input-cpus``, issue 12 part 3).

A GIL-bound pipeline (bench/pipelines/serial: pure-Python work in a ``tf.py_function``, so one
process produces at one core's pace whatever its threads) trains a small model on one
2-CPU test node. Configurations, in rotating order, ``rounds`` times, on the same node:

* ``tasks`` — ``--total-nodes 1 --tasks-per-node 2 --cpus-per-task 1``: the chief and one
  input worker, the best csrun layout on one node before the chief could produce;
* ``chief_input`` — the same with ``--chief-input-cpus 1``: input worker 0 runs in the chief's
  task at nice 10 beside training (the test cluster does not bind tasks to CPUs, so it shares
  them; docs/CHIEF-INPUT.md), worker 1 in the other task;
* ``producers`` — the reference: two processes on the host iterating ``input_fn`` as input
  workers 0 and 1 of 2 (each held to 1 thread), no Slurm, no training; their summed rate is
  what two producer processes give.

Both csrun layouts run under ``--autoscale`` held at their worker count (min = max =
initial), which only measures 4 s windows: a run's rate is the median of its windows after
the first two. Not the whole run's samples ÷ training time: the workers fill their buffers
while the chief builds the model, so a short run's whole-run rate counts batches produced
before training began (a first attempt measured so gave 5,227 samples/s from two workers
that produce 1,600 each). Held at a fixed count, ``--autoscale`` changes only the bundling
(at most 16 batches per element) and the chief's queue (2 elements); it is kept in the
results beside the whole-run rate.

Figures (medians over the rounds, every run kept): delivered ``samples_per_sec`` of training
and its ``input_wait_fraction`` for the two csrun layouts, the producers' summed rate, and the
ratios ``chief_input / tasks``, ``tasks / producers`` and ``chief_input / producers``.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import clusters
import common  # bench/ is on sys.path: these modules run as scripts from it
import yaml

SERIAL = common.BENCH / "pipelines" / "serial"
LAYOUT = ["--total-nodes", "1", "--tasks-per-node", "2", "--cpus-per-task", "1"]


def _measured(workers: int) -> list[str]:
    """``--autoscale`` held at ``workers``: it only measures its windows (no action can be taken)."""
    w = str(workers)
    return ["--autoscale", "--min-workers", w, "--max-workers", w, "--initial-workers", w,
            "--autoscale-window", str(WINDOW_S)]


WORK_ITERATIONS, MAX_STEPS, PRODUCE_S, WARMUP_S, WINDOW_S, SKIP_WINDOWS = 8000, 3000, 15.0, 3.0, 4, 2
CONFIGS = {"tasks": _measured(1), "chief_input": ["--chief-input-cpus", "1", *_measured(2)]}


def _params(root: Path) -> Path:
    p = yaml.safe_load((SERIAL / "configs" / "params.yaml").read_text())
    p["train_input"]["work_iterations"] = WORK_ITERATIONS
    p["runconfig"].update({"log_steps": 1000, "checkpoint_steps": 0})
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def one_run(name: str, env: dict, root: Path, params: Path, index: int, max_steps: int) -> dict:
    """One csrun_wse training run of configuration ``name``; its performance.json figures."""
    md = root / f"{name}-{index}"
    argv = [common.console_script("csrun_wse"), *LAYOUT, *CONFIGS[name], "python-ws", str(SERIAL / "run.py"),
            "--params", str(params), "--mode", "train", "--max_steps", str(max_steps), "--model_dir", str(md)]
    proc = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise common.CommandFailed(f"{name}: csrun_wse exit {proc.returncode}: {proc.stderr[-1500:]}")
    perf = json.loads((md / "performance" / "performance.json").read_text())
    windows = perf["autoscale"]["windows"]
    steady = windows[SKIP_WINDOWS:] or windows[1:] or windows
    return {"samples_per_sec": round(common.median([w["samples_per_sec"] for w in steady]), 1),
            "input_wait_fraction": round(common.median([w["input_wait_fraction"] for w in steady]), 4),
            "windows_used": len(steady), "whole_run_samples_per_sec": perf["samples_per_sec"],
            "train_s": perf["total_time"], "batches_per_worker": perf["batches_per_worker"],
            "chief_input": perf.get("chief_input")}


def producers(params: Path, n: int = 2, seconds: float = PRODUCE_S) -> dict:
    """``n`` producer processes at once (this module's ``--produce``); their summed samples/s."""
    cmd = [sys.executable, __file__, "--produce", str(params), str(seconds)]
    procs = [subprocess.Popen([*cmd, str(i), str(n)], stdout=subprocess.PIPE, text=True) for i in range(n)]
    rates = []
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 300)
        if p.returncode != 0:
            raise common.CommandFailed(f"producer exit {p.returncode}")
        rates.append(json.loads(out.strip().splitlines()[-1])["samples_per_sec"])
    return {"samples_per_sec": round(sum(rates), 2), "per_process": rates}


def _produce(params: str, seconds: float, index: int, n: int) -> None:
    """Child: iterate input_fn as input worker ``index`` of ``n`` (1 thread) for ``seconds``
    after a warm-up; print ``{"samples_per_sec"}``."""
    from csrun_runtime.capture import load_entry
    from csrun_runtime.tensorflow.bundling import limit_threads
    from csrun_runtime.tensorflow.pipeline import build_worker_input

    entry = load_entry(str(SERIAL / "run.py"), ["--params", params, "--mode", "train"])
    built = build_worker_input(entry.input_fn, entry.params, index, n, None, job_key="bench", view_root=None)
    it = iter(limit_threads(built.dataset, 1))
    t_end = time.monotonic() + WARMUP_S
    while time.monotonic() < t_end:
        next(it)
    samples, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        x, _ = next(it)
        samples += int(x.shape[0])
    print(json.dumps({"samples_per_sec": samples / (time.monotonic() - t0)}), flush=True)


def run(quick: bool = False) -> dict:
    """``rounds`` rounds (quick: 1 round, 800 steps, 5 s producers; full: 3 rounds) of the three
    configurations in rotating order; returns the figures and ratios (module docstring)."""
    env = clusters.slurm_env()
    root = Path(tempfile.mkdtemp(prefix="csrun-bench-chief-input."))
    params = _params(root)
    rounds, max_steps, seconds = (1, 800, 5.0) if quick else (3, MAX_STEPS, PRODUCE_S)
    names = [*CONFIGS, "producers"]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            clusters.wait_queue_empty(env, max_wait=60.0)
            runs[name].append(producers(params, 2, seconds) if name == "producers"
                              else one_run(name, env, root, params, r, max_steps))
    rate = {n: [x["samples_per_sec"] for x in recs] for n, recs in runs.items()}
    return {
        "benchmark": "chief's node feeding input: delivered samples/s, 1 node × 2 tasks, GIL-bound pipeline",
        "unit": "samples/s; ratios of medians",
        "layout": LAYOUT, "configs": CONFIGS, "work_iterations": WORK_ITERATIONS, "max_steps": max_steps,
        "window_s": WINDOW_S, "skipped_windows": SKIP_WINDOWS,
        "rounds": rounds, "producer_seconds": seconds,
        "summary": {n: common.spread(v, digits=1) for n, v in rate.items()},
        "input_wait_fraction": {n: common.spread([x["input_wait_fraction"] for x in runs[n]], digits=3)
                                for n in CONFIGS},
        "chief_input_over_tasks": common.ratio_of_medians(rate["chief_input"], rate["tasks"]),
        "tasks_over_producers": common.ratio_of_medians(rate["tasks"], rate["producers"]),
        "chief_input_over_producers": common.ratio_of_medians(rate["chief_input"], rate["producers"]),
        "runs": runs,
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--produce":
        _produce(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
